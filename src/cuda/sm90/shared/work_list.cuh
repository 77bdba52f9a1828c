// What the sm90 work lists are built from, on the device from cu_seqlens (no host read of offsets,
// so a call can be captured in a CUDA graph): sequence bounds, the K tiles a q tile visits, the
// checked mode's offset rules and the block-wide scan of the list kernels (one block of
// kListThreads threads each, fwd_work_list.cuh and bwd_work_list.cuh).
#pragma once

#include <cstdint>

#include "jfa/jfa.h"

namespace jfa::sm90 {

// Sequence bounds of one work item, clamped into [0, total].
struct SeqBounds {
  int32_t q_start, len_q, k_start, len_k;

  // The causal mask is aligned bottom-right: query row r sees keys 0 .. r + causal_shift().
  __host__ __device__ __forceinline__ int32_t causal_shift() const { return len_k - len_q; }
};

// The decode of work items is host code too, for the tests of the order of the backward's work
// (tests/cuda_host); on the device an offset is read through the read-only cache.
__host__ __device__ __forceinline__ int32_t load_offset(const int32_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

__host__ __device__ __forceinline__ int32_t clamp_offset(int32_t v, int32_t lo, int64_t hi) {
  const int64_t x = v < lo ? lo : v;
  return static_cast<int32_t>(x > hi ? hi : x);
}

// Token ranges of sequences [b, b + n) taken together, offsets clamped into [0, total].
__host__ __device__ __forceinline__ SeqBounds seq_bounds(const int32_t* cu_q, const int32_t* cu_k,
                                                         int64_t total_q, int64_t total_k,
                                                         int64_t b, int64_t n) {
  SeqBounds s;
  s.q_start = clamp_offset(load_offset(cu_q + b), 0, total_q);
  const int32_t q_end = clamp_offset(load_offset(cu_q + b + n), s.q_start, total_q);
  s.len_q = q_end - s.q_start;
  s.k_start = clamp_offset(load_offset(cu_k + b), 0, total_k);
  const int32_t k_end = clamp_offset(load_offset(cu_k + b + n), s.k_start, total_k);
  s.len_k = k_end - s.k_start;
  return s;
}

// The last of sequences first .. last whose first query token (clamped into [0, total_q]) is at or
// before `token` (for valid offsets, the one that holds it), or `first`: a binary search in cu_q.
template <typename Index>
__device__ __forceinline__ Index sequence_holding_token(const int32_t* cu_q, Index first,
                                                        Index last, int64_t total_q, Index token) {
  while (first < last) {
    const Index mid = (first + last + 1) / 2;
    if (clamp_offset(__ldg(cu_q + mid), 0, total_q) <= token)
      first = mid;
    else
      last = mid - 1;
  }
  return first;
}

// The sequences first .. first + n - 1 that a work-list entry names (`seq` and its count n_seqs,
// more than one for a shared tile), clamped into the batch: only invalid offsets make an entry
// reach outside it.
struct EntrySequences {
  int32_t first, n;
};

__host__ __device__ __forceinline__ EntrySequences clamp_entry_sequences(int32_t seq,
                                                                         int32_t n_seqs,
                                                                         int64_t batch) {
  const int32_t first = seq < 0 ? 0 : (seq >= batch ? static_cast<int32_t>(batch - 1) : seq);
  const int64_t left = batch - first;
  return EntrySequences{first,
                        n_seqs < 1 ? 1 : (n_seqs > left ? static_cast<int32_t>(left) : n_seqs)};
}

// Q tiles of a sequence of len_q query rows: the work list gives each its own entry, and the
// item decode relies on that count.
template <int kBlockM>
__device__ __forceinline__ int32_t q_tile_count(int32_t len_q) {
  return (len_q + kBlockM - 1) / kBlockM;
}

// K tiles that q tile m_block visits: the whole key range, or (causal, one sequence) the keys up
// to the diagonal of the tile's last row, bottom-right aligned; 0 for a tile without rows.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int32_t tile_k_blocks(const SeqBounds& s, int32_t m_block,
                                                 bool causal_one_seq) {
  const int64_t row0 = static_cast<int64_t>(m_block) * kBlockM;
  if (m_block < 0 || row0 >= s.len_q) return 0;
  int64_t visible = s.len_k;
  if (causal_one_seq) {
    const int64_t last_row = min(row0 + kBlockM, static_cast<int64_t>(s.len_q)) - 1;
    visible = last_row + s.len_k - s.len_q + 1;
    visible = visible < 0 ? 0 : (visible > s.len_k ? s.len_k : visible);
  }
  return static_cast<int32_t>((visible + kBlockN - 1) / kBlockN);
}

inline constexpr int kListThreads = 1024;

// The checked mode (jfa_attention_params::device_check): the rules the raw offsets break, as
// jfa_device_check bits ORed over the block and stored in *word (0 when they are valid). Called by
// every thread of a block of kListThreads before the block reads the offsets for anything else.
__device__ __forceinline__ void check_offsets(const int32_t* cu_q, const int32_t* cu_k,
                                              int64_t batch, int64_t total_q, int64_t total_k,
                                              int32_t max_q, int32_t max_k, int32_t* word) {
  __shared__ int32_t broken;
  if (threadIdx.x == 0) broken = 0;
  __syncthreads();
  auto rules = [&](const int32_t* cu, int64_t total, int32_t max_len) {
    int32_t bits = 0;
    if (threadIdx.x == 0) {
      if (__ldg(cu) != 0) bits |= JFA_OFFSETS_Q_FIRST_NOT_ZERO;
      if (batch == 0 && __ldg(cu) != total) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    }
    for (int64_t b = threadIdx.x; b < batch; b += kListThreads) {
      const int64_t lo = __ldg(cu + b), hi = __ldg(cu + b + 1);
      if (hi < lo)
        bits |= JFA_OFFSETS_Q_DECREASING;
      else if (max_len > 0 && hi - lo > max_len)
        bits |= JFA_OFFSETS_Q_ABOVE_MAX;
      if (b == batch - 1 && hi != total) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    }
    return bits;
  };
  // The k rules are the q rules four bits up (jfa.h).
  const int32_t mine = rules(cu_q, total_q, max_q) | (rules(cu_k, total_k, max_k) << 4);
  if (mine != 0) atomicOr(&broken, mine);
  __syncthreads();
  if (threadIdx.x == 0) *word = broken;
}

// The check alone, for calls that launch no list kernel (no keys, or no query rows).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    offsets_check_kernel(const int32_t* cu_q, const int32_t* cu_k, int64_t batch, int64_t total_q,
                         int64_t total_k, int32_t max_q, int32_t max_k, int32_t* word) {
  static_assert(kThreads == kListThreads, "check_offsets strides by kListThreads");
  check_offsets(cu_q, cu_k, batch, total_q, total_k, max_q, max_k, word);
}

// Exclusive prefix sum of one value per thread over the block; *total gets the sum. 64-bit
// throughout: with invalid offsets (clamped, each sequence up to the whole total) 1024 counts can
// exceed int32. Uses `scratch` (32 values) and synchronises the block.
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t value, int64_t* scratch,
                                                        int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  int64_t incl = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t x = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += x;
  }
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int64_t ws = scratch[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t x = __shfl_up_sync(0xffffffffu, ws, d);
      if (lane >= d) ws += x;
    }
    scratch[lane] = ws;  // inclusive over warps
  }
  __syncthreads();
  *total = scratch[31];
  return (warp > 0 ? scratch[warp - 1] : 0) + incl - value;
}

}  // namespace jfa::sm90

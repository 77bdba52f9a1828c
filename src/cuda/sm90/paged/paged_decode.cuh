// The paged decode kernel (decode and speculative decode over a paged KV cache, on CUDA cores): one
// CTA per (sequence, KV head, split of the sequence's keys, block of rows). Its rows are the query
// heads of the KV head (pack-GQA) times the sequence's query tokens, so that each key and value
// row is read from global memory once for all of them (once per row block where group * tokens
// passes kRowsPerCta). The keys of the split stream through shared memory a chunk at a time
// (cp.async, kStages deep), each row fetched from its own page through the block table.
//
// Teams of kTeam lanes hold 8 columns a lane of up to kRowsPerTeam rows (q and O in fp32
// registers). The teams split the CTA's rows and, where the rows are few, the 8-key sub-tiles of
// each chunk (key teams, each with a softmax state of its own, merged through shared memory at the
// end). A score is a team's dot product summed by shuffles within the team; softcap, the window
// (common/visibility.hpp, per token) and the online softmax apply per row, 8 keys at a time.
// Branches and shuffles are uniform per team (shuffles take the team's lanes only).
//
// Every index read from the call is clamped: a length into [0, max_pages_per_seq * page_size], a
// query range into [0, total_q], and a key row on a page outside [0, num_pages) reads as zeros, so
// that invalid inputs never reach outside a buffer (the checked mode reports them,
// paged_check.cuh).
#pragma once

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_combine.cuh"
#include "cuda/sm90/paged/paged_config.hpp"
#include "cuda/sm90/paged/paged_lengths.cuh"
#include "cuda/sm90/paged/paged_stream.cuh"
#include "cuda/sm90/paged/paged_vec.cuh"
#include "cuda/sm90/shared/softmax.cuh"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// A CTA's rows and keys. Row r of a sequence is token r / group, head r % group of the KV head's
// group; the CTA takes rows row0 .. row0 + rows - 1 and the split's keys [key_begin, key_end).
struct PagedCta {
  int64_t seq;
  int32_t kv_head, split;
  int32_t row0, rows;
  int32_t q_start, len_q, len_k;  // len_q: the sequence's own (its rows' diagonals)
  int32_t key_begin, key_end;
};

// The CTA of blockIdx.x (row block fastest: the row blocks of a split read the same keys at about
// the same time, the later ones from L2); false when it has no row.
template <int kRowsPerCta, int kChunkKeys>
__device__ __forceinline__ bool paged_cta(const PagedArgs& a, PagedCta* w) {
  int64_t id = blockIdx.x;
  const int32_t row_block = static_cast<int32_t>(id % a.row_blocks);
  id /= a.row_blocks;
  w->split = static_cast<int32_t>(id % a.splits);
  id /= a.splits;
  w->kv_head = static_cast<int32_t>(id % a.heads_kv);
  w->seq = id / a.heads_kv;
  const int64_t q0 = min(static_cast<int64_t>(max(__ldg(a.cu_q + w->seq), 0)), a.total_q);
  const int64_t q1 = min(max(static_cast<int64_t>(__ldg(a.cu_q + w->seq + 1)), q0), a.total_q);
  w->q_start = static_cast<int32_t>(q0);
  w->len_q = static_cast<int32_t>(q1 - q0);
  w->len_k = paged_len_k(a, w->seq);
  const int64_t rows_total = static_cast<int64_t>(min(w->len_q, a.max_q)) * a.group;
  const int64_t row0 = static_cast<int64_t>(row_block) * kRowsPerCta;
  if (row0 >= rows_total) return false;
  w->row0 = static_cast<int32_t>(row0);
  w->rows = static_cast<int32_t>(min(static_cast<int64_t>(kRowsPerCta), rows_total - row0));
  // The keys some row of the block sees: from its first token's first to its last token's last
  // (both move right with the token), split in chunk-aligned parts of at least min_split_keys.
  const int64_t first_token = row0 / a.group, last_token = (row0 + w->rows - 1) / a.group;
  const int64_t lo = jfa::detail::first_visible_key(a.window, first_token, w->len_q, w->len_k);
  const int64_t hi = max(lo, jfa::detail::key_end(a.window, last_token, w->len_q, w->len_k));
  int64_t per = (hi - lo + a.splits - 1) / a.splits;
  per =
      max((per + kChunkKeys - 1) / kChunkKeys * kChunkKeys, static_cast<int64_t>(a.min_split_keys));
  const int64_t begin = min(lo + w->split * per, hi);
  w->key_begin = static_cast<int32_t>(begin);
  w->key_end = static_cast<int32_t>(min(begin + per, hi));
  return true;
}

// Row r of a CTA (in its block of rows): its query head, its token and the keys of the split it
// sees, [lo, hi) (empty where it sees none).
struct PagedRow {
  int32_t head, lo, hi;
  int64_t token;
};

__device__ __forceinline__ PagedRow paged_row(const PagedArgs& a, const PagedCta& w, int32_t r) {
  const int32_t row = w.row0 + r;
  const int32_t i = row / a.group;
  PagedRow x;
  x.head = w.kv_head * a.group + row % a.group;
  x.token = static_cast<int64_t>(w.q_start) + i;
  x.lo = max(static_cast<int32_t>(jfa::detail::first_visible_key(a.window, i, w.len_q, w.len_k)),
             w.key_begin);
  x.hi = min(static_cast<int32_t>(jfa::detail::key_end(a.window, i, w.len_q, w.len_k)), w.key_end);
  return x;
}

// The bounds of a group of rows' keys: the sub-tiles before any_lo or from any_hi on hold no key
// any row sees, those in [all_lo, all_hi) only keys every row sees.
struct PagedBounds {
  int32_t any_lo = INT32_MAX, any_hi = INT32_MIN, all_lo = INT32_MIN, all_hi = INT32_MAX;

  __device__ __forceinline__ void add(int32_t lo, int32_t hi) {
    if (lo < hi) {
      any_lo = min(any_lo, lo);
      any_hi = max(any_hi, hi);
    }
    all_lo = max(all_lo, lo);
    all_hi = min(all_hi, hi);
  }
};

template <typename T, int kD>
__global__ void __launch_bounds__(PagedConfig<kD>::kThreads)
    paged_decode_kernel(const PagedArgs a) {
  using C = PagedConfig<kD>;
  constexpr int kRows = C::kRowsPerTeam;
  extern __shared__ __align__(16) unsigned char smem[];
  PagedCta w;
  if (!paged_cta<C::kRowsPerCta, C::kChunkKeys>(a, &w)) return;

  const int team = static_cast<int>(threadIdx.x) / C::kTeam;
  const int lane = static_cast<int>(threadIdx.x) % C::kTeam;
  const unsigned team_mask =
      C::kTeam == 32
          ? 0xffffffffu
          : ((1u << C::kTeam) - 1u) << (static_cast<int>(threadIdx.x) % 32 / C::kTeam * C::kTeam);
  // The fewest row teams (a power of two) that hold the rows; the other teams split the keys.
  int row_teams = 1;
  while (row_teams * kRows < w.rows) row_teams *= 2;
  const int key_teams = C::kTeams / row_teams;
  const int tr = team % row_teams, z = team / row_teams;

  // This team's rows tr, tr + row_teams, ...: their q (8 columns), head, token, and the keys of
  // the split each sees; the team's bounds over them, for the sub-tiles to skip or leave unmasked.
  float q[kRows][8];
  int32_t lo[kRows], hi[kRows], head[kRows];
  int64_t token[kRows];
  int team_rows = 0;
  PagedBounds bounds;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int32_t r = tr + row_teams * j;
    lo[j] = hi[j] = head[j] = 0;
    token[j] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) q[j][e] = 0.f;
    if (r >= w.rows) continue;
    team_rows = j + 1;
    const PagedRow x = paged_row(a, w, r);
    head[j] = x.head;
    token[j] = x.token;
    lo[j] = x.lo;
    hi[j] = x.hi;
    bounds.add(x.lo, x.hi);
    const T* src = static_cast<const T*>(a.q) + token[j] * a.q_token_stride +
                   head[j] * a.q_head_stride + lane * 8;
    unpack8<T>(__ldg(reinterpret_cast<const uint4*>(src)), q[j]);
  }

  float m[kRows], l[kRows], o[kRows][8];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[j][e] = 0.f;
  }

  T* const stages = reinterpret_cast<T*>(smem);
  const T* const k_cache = static_cast<const T*>(a.k_cache);
  const T* const v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* const table = a.block_table + w.seq * a.max_pages_per_seq;
  const int32_t n_chunks = (w.key_end - w.key_begin + C::kChunkKeys - 1) / C::kChunkKeys;

  // Chunk c's keys and values into stage s, each key's vectors in order.
  auto load_chunk = [&](int32_t c, int s) {
    T* const sk = stages + s * 2 * C::kStageElems;
    paged_load_chunk<T, kD, C::kChunkKeys, C::kThreads>(
        a, k_cache, v_cache, table, w.kv_head, w.key_begin + c * C::kChunkKeys, w.key_end, sk,
        sk + C::kStageElems, [](T* stage, int key, int col) { return stage + key * kD + col * 8; });
  };

  // This key team's sub-tiles of chunk c (in stage s): scores, mask, online softmax, P V.
  auto compute_chunk = [&](int32_t c, int s) {
    const T* const sk = stages + s * 2 * C::kStageElems;
    const T* const sv = sk + C::kStageElems;
    const int32_t key0 = w.key_begin + c * C::kChunkKeys;
    for (int st = z; st < C::kSubTiles; st += key_teams) {
      const int32_t k0 = key0 + st * C::kSubKeys;
      if (k0 >= bounds.any_hi) break;  // no row of the team sees a key from here on
      if (k0 + C::kSubKeys <= bounds.any_lo) continue;
      const bool unmasked = k0 >= bounds.all_lo && k0 + C::kSubKeys <= bounds.all_hi;
      float p[kRows][C::kSubKeys];
#pragma unroll
      for (int n = 0; n < C::kSubKeys; ++n) {
        float kf[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(sk + (st * C::kSubKeys + n) * kD + lane * 8),
                   kf);
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          if (j >= team_rows) continue;
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc = fmaf(q[j][e], kf[e], acc);
          p[j][n] = acc;
        }
      }
#pragma unroll
      for (int offset = C::kTeam / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          if (j >= team_rows) continue;
#pragma unroll
          for (int n = 0; n < C::kSubKeys; ++n)
            p[j][n] += __shfl_xor_sync(team_mask, p[j][n], offset);
        }
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (j >= team_rows) continue;
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < C::kSubKeys; ++n) {
          float u = p[j][n];
          if (a.softcap > 0.f) u = a.softcap * fast_tanh(u * a.softcap_in);
          if (!unmasked && (k0 + n < lo[j] || k0 + n >= hi[j])) u = -INFINITY;
          p[j][n] = u;
          tile_max = fmaxf(tile_max, u);
        }
        const float m_new = fmaxf(m[j], tile_max);
        if (m_new == -INFINITY) {  // the row sees none of these keys, nor any before
#pragma unroll
          for (int n = 0; n < C::kSubKeys; ++n) p[j][n] = 0.f;
          continue;
        }
        if (m_new != m[j]) {
          const float alpha = fast_exp2((m[j] - m_new) * a.score_scale_log2);
          l[j] *= alpha;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[j][e] *= alpha;
          m[j] = m_new;
        }
#pragma unroll
        for (int n = 0; n < C::kSubKeys; ++n) {
          p[j][n] = fast_exp2((p[j][n] - m_new) * a.score_scale_log2);
          l[j] += p[j][n];
        }
      }
#pragma unroll
      for (int n = 0; n < C::kSubKeys; ++n) {
        float vf[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(sv + (st * C::kSubKeys + n) * kD + lane * 8),
                   vf);
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          if (j >= team_rows) continue;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[j][e] = fmaf(p[j][n], vf[e], o[j][e]);
        }
      }
    }
  };

  paged_pipeline<C::kStages>(n_chunks, load_chunk, compute_chunk);

  // The key teams' states of each row merged into the team with z == 0, through the stages.
  if (key_teams > 1) {
    float* const merge_o = reinterpret_cast<float*>(smem);
    float2* const merge_ml = reinterpret_cast<float2*>(smem + C::kMergeOBytes);
    if (z > 0) {
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (j >= team_rows) continue;
        float4* dst =
            reinterpret_cast<float4*>(merge_o + ((team * kRows + j) * C::kTeam + lane) * 8);
        dst[0] = make_float4(o[j][0], o[j][1], o[j][2], o[j][3]);
        dst[1] = make_float4(o[j][4], o[j][5], o[j][6], o[j][7]);
        if (lane == 0) merge_ml[team * kRows + j] = make_float2(m[j], l[j]);
      }
    }
    __syncthreads();
    if (z == 0) {
      for (int zz = 1; zz < key_teams; ++zz) {
        const int other = tr + row_teams * zz;
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          if (j >= team_rows) continue;
          const float2 ml = merge_ml[other * kRows + j];
          const float m_new = fmaxf(m[j], ml.x);
          if (m_new == -INFINITY) continue;
          const float mine = fast_exp2((m[j] - m_new) * a.score_scale_log2);
          const float theirs = fast_exp2((ml.x - m_new) * a.score_scale_log2);
          const float4* src = reinterpret_cast<const float4*>(
              merge_o + ((other * kRows + j) * C::kTeam + lane) * 8);
          const float4 x0 = src[0], x1 = src[1];
          const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          l[j] = l[j] * mine + ml.y * theirs;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[j][e] = o[j][e] * mine + xs[e] * theirs;
          m[j] = m_new;
        }
      }
    }
  }
  if (z != 0) return;

  // One split: the rows' ends. Several: the split's state of each row, for the combine.
  bool not_finite = false;
  const int64_t rows_all = a.total_q * a.heads_q;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (j >= team_rows) continue;
    if (a.splits == 1) {
      const RowEnd e = paged_row_end(a, m[j], l[j], head[j]);
      T* dst = static_cast<T*>(a.out) + token[j] * a.out_token_stride +
               head[j] * a.out_head_stride + lane * 8;
      store_scaled<T, 8>(dst, o[j], e.inv);
      if (a.lse != nullptr && lane == 0) a.lse[head[j] * a.total_q + token[j]] = e.lse;
      if (a.device_check != nullptr) not_finite |= paged_row_not_finite(a, lo[j] < hi[j], l[j], e);
    } else {
      const int64_t at = w.split * rows_all + token[j] * a.heads_q + head[j];
      if (m[j] != -INFINITY) {
        float4* dst = reinterpret_cast<float4*>(a.part_o + at * kD + lane * 8);
        dst[0] = make_float4(o[j][0], o[j][1], o[j][2], o[j][3]);
        dst[1] = make_float4(o[j][4], o[j][5], o[j][6], o[j][7]);
      }
      if (lane == 0) a.part_ml[at] = make_float2(m[j], l[j]);
      // The sum of a split that saw keys: the combine sees only the merged one.
      if (a.device_check != nullptr && lo[j] < hi[j] && !(l[j] > 0.f && l[j] < INFINITY))
        not_finite = true;
    }
  }
  if (not_finite) atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

}  // namespace jfa::sm90

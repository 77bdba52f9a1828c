// dQ in the backward: the consumers stage their parts of each step's dQ (stage_dq), and the dQ
// writer warps add them to the float32 accumulator (in deterministic mode in a fixed order) or, for
// a shared tile, convert them straight into dq.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/backward/bwd_gemms.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/warp_broadcast.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

__device__ __forceinline__ int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Hands this group's dQ part of a step (rows m of `head`) to the dQ writer: waits until the writer
// has read the group's previous one, stores it in the accumulator's layout and says where it goes.
// Its q tile, rows and rank come from dq_add_of_step: with kRows a group's q tile may lie past the
// sequence's end or (causal) before the first row that sees the item's keys; then it adds nothing
// (no bytes), and in deterministic mode it does not count on the q tile's semaphore.
template <typename Cfg>
__device__ __forceinline__ void stage_dq(typename Cfg::Shared& s, const DqTile<Cfg>& dq,
                                         const BwdArgs& a, const BwdItem& w, int32_t head,
                                         int32_t m, int group, uint32_t& dq_phase) {
  using Frag = DqTile<Cfg>;
  constexpr int kCols = Cfg::kDqPartCols;
  s.sync.dq_empty[group].wait(dq_phase ^ 1u);
  // Row r and the column pair (c, c + 1) of the fragment: chunk c / 4 of the row, permuted by the
  // token's index (dq_chunk_offset); the thread's two rows are 8 apart, so they share it.
  const int r0 = Frag::row(0);
  const int perm = ((w.seq.q_start + r0) & 3) << 1;  // q_start + 64 (q tile) + r0 = the token
  const uint32_t base = tlx::smem_addr(&s.dq[group][r0 * kCols]);
  const int pair = Frag::col(0, 0);  // 2 (t % 4): chunk (t % 4) / 2, offset 2 (t % 2)
#pragma unroll
  for (int j = 0; j < Frag::kBlocks; ++j) {
    const int chunk = ((2 * j + (pair >> 2)) ^ perm);
    const uint32_t at = base + ((chunk << 2) + (pair & 3)) * sizeof(float);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      tlx::st_shared_f32x2(at + 8 * h * kCols * sizeof(float), dq.at(j, h, 0), dq.at(j, h, 1));
  }
  if (threadIdx.x % 128 == 0) {
    const DqAdd add = dq_add_of_step<Cfg::kBlockM, Cfg::kBlockN, Cfg::kLocal>(a, w, m, group);
    const int64_t tile = static_cast<int64_t>(head) * a.sem_tiles + w.sem_tile + add.q_tile;
    const int part = Cfg::kDqSplit == DqSplit::kColumns ? group : 0;
    const int32_t first = w.seq.q_start + add.q_tile * kBwdTileRows;
    s.sync.dq_dest[group] = DqDestination{a.dq_acc + dq_part_base(a.total_q, Cfg::kD, head, part) +
                                              static_cast<int64_t>(first) * kCols,
                                          w.n_seqs > 1 ? nullptr : a.sems + tile,
                                          add.rank,
                                          static_cast<uint32_t>(add.rows * kCols * sizeof(float)),
                                          head,
                                          first};
  }
  tlx::fence_proxy_async_smem();  // the writer's bulk reduction reads it (async proxy)
  // The writer threads that convert a shared tile's part read what each thread staged, so then
  // every thread arrives; otherwise only the bulk reduction reads it, and a warp's leader arrives
  // for the warp.
  if (w.n_seqs > 1) {
    s.sync.dq_full[group].arrive();
  } else {
    __syncwarp();
    if (tlx::lane_is_leader()) s.sync.dq_full[group].arrive(32);
  }
  dq_phase ^= 1u;
}

// Converts a shared tile's staged dQ part into dq: softmax_scale times the part's rows (with kKeys,
// times the sum of both groups' parts, which cover the same rows over different keys), rounded to
// T, at columns col0 .. col0 + kDqPartCols - 1 of the destination's head. The writer threads take
// the part's 16-byte chunks in row order, so that a row's stores go together. Returns whether an
// element was NaN or infinite.
template <typename Cfg>
__device__ __forceinline__ bool store_staged_dq(const float* staged, const float* other,
                                                const DqDestination& d, int col0, const BwdArgs& a,
                                                int writer) {
  using T = typename Cfg::Element;
  constexpr int kCols = Cfg::kDqPartCols, kChunks = kCols / 4;
  const int n = static_cast<int>(d.bytes / (4 * sizeof(float)));  // rows x kChunks
  T* dq = static_cast<T*>(a.dq) + d.head * a.dq_head_stride + col0;
  const uint32_t base = tlx::smem_addr(staged);
  const uint32_t other_base = other != nullptr ? tlx::smem_addr(other) : 0;
  bool not_finite = false;
  for (int i = writer; i < n; i += Cfg::kDqWriterThreads) {
    const int r = i / kChunks, c = 4 * (i % kChunks);
    const int64_t token = d.first + r;
    const uint32_t at = (r * kCols + dq_chunk_offset(token, c)) * sizeof(float);
    float4 x = tlx::ld_shared_f32x4(base + at);
    if (other != nullptr) {
      const float4 y = tlx::ld_shared_f32x4(other_base + at);
      x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    const float k = a.softmax_scale;
    const uint2 packed =
        make_uint2(tlx::pack2<T>(x.x * k, x.y * k), tlx::pack2<T>(x.z * k, x.w * k));
    *reinterpret_cast<uint2*>(dq + token * a.dq_token_stride + c) = packed;
    not_finite |= tlx::pair_not_finite<T>(packed.x) || tlx::pair_not_finite<T>(packed.y);
  }
  return not_finite;
}

// The dQ writer (warps 1 to 3 of the producer group). Per step, its first thread adds each group's
// staged 64 x 64 part to the accumulator in L2 with one bulk reduction; a group's staging area is
// free again once its reduction has read it. In deterministic mode the adds to one q tile go in a
// fixed order of the K tiles (dq_add_rank): the q tile's semaphore counts the K tiles added, and
// each K tile waits for the ones before it. The groups' parts belong to one q tile (one
// semaphore; with kKeys both add to the same part, group 0's add completes first) or, with kRows,
// to two (two semaphores; a part without bytes adds nothing and does not count). A shared tile's
// parts (no semaphore) are the only dQ of their rows: all writer threads convert them straight
// into dq, and the accumulator's copy of those rows is neither cleared nor converted.
template <typename Cfg>
__device__ __forceinline__ void bwd_dq_writer(typename Cfg::Shared& s, const BwdArgs& a) {
  constexpr bool kRows = Cfg::kDqSplit == DqSplit::kRows;
  constexpr bool kKeys = Cfg::kDqSplit == DqSplit::kKeys;
  const int writer = static_cast<int>(threadIdx.x) - Cfg::kDqWriterFirstThread;
  const bool leader = writer == 0;
  const int lane = writer & 31;
  bool not_finite = false;
  uint32_t phase = 0;
  for (;;) {
    s.sync.dq_full[0].wait_suspended(phase);
    s.sync.dq_full[1].wait_suspended(phase);
    phase ^= 1u;
    // Lane 0 of each warp reads the destinations for its warp. In a step that only the bulk
    // reductions serve, a warp's lane 0 arrives on dq_empty for the warp (which lets the groups
    // write the next ones), so no other lane may read what they rewrite; in a shared tile's step
    // every thread reads staged dQ and arrives for itself.
    DqDestination d0{}, d1{};
    if (lane == 0) {
      d0 = s.sync.dq_dest[0];
      d1 = s.sync.dq_dest[1];
    }
    if (__shfl_sync(0xffffffffu, d0.part == nullptr ? 1 : 0, 0)) break;  // both groups stop
    if (__shfl_sync(0xffffffffu, d0.sem == nullptr ? 1 : 0, 0)) {        // a shared tile's step
      d0 = tlx::warp_broadcast(d0);
      d1 = tlx::warp_broadcast(d1);
      if (d0.bytes > 0)
        not_finite |= store_staged_dq<Cfg>(s.dq[0], kKeys ? s.dq[1] : nullptr, d0, 0, a, writer);
      if (!kKeys && d1.bytes > 0)
        not_finite |=
            store_staged_dq<Cfg>(s.dq[1], nullptr, d1, kRows ? 0 : Cfg::kDqPartCols, a, writer);
      s.sync.dq_empty[0].arrive();
      s.sync.dq_empty[1].arrive();
      continue;
    }
    const bool adds0 = d0.bytes > 0, adds1 = d1.bytes > 0;  // lane 0's
    if (leader) {
      if (adds0) {
        if (a.deterministic)
          while (load_acquire(d0.sem) < d0.target) __nanosleep(64);
        tlx::bulk_reduce_add_f32(d0.part, s.dq[0], d0.bytes);
      }
      if (kKeys && a.deterministic) {
        tlx::tma_store_commit();
        tlx::tma_store_wait<0>();
      }
      if (adds1) {
        if (kRows && a.deterministic)
          while (load_acquire(d1.sem) < d1.target) __nanosleep(64);
        tlx::bulk_reduce_add_f32(d1.part, s.dq[1], d1.bytes);
      }
      tlx::tma_store_commit();
      tlx::tma_store_wait_read<0>();
    }
    if (lane == 0) {
      s.sync.dq_empty[0].arrive(32);
      s.sync.dq_empty[1].arrive(32);
    }
    if (leader && a.deterministic) {
      tlx::tma_store_wait<0>();
      tlx::fence_proxy_async();
      __threadfence();
      if (adds0) atomicAdd(d0.sem, 1);
      if (kRows && adds1) atomicAdd(d1.sem, 1);
    }
  }
  if (leader) tlx::tma_store_wait<0>();
  if (not_finite && a.device_check != nullptr)
    atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

}  // namespace jfa::sm90

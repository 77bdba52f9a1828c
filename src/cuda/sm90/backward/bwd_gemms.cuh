// The backward's three MMA shapes for a consumer group's 64 keys: keys x rows (S^T, dP^T), the
// accumulations into dK and dV, and the group's part of dQ.
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

// A group's 64 keys x the step's queries (S^T, dP^T), and a dQ part (64 rows x kDqPartCols).
template <typename Cfg>
using ScoreTile = tlx::AccumFragment<Cfg::kBlockM>;
template <typename Cfg>
using DqTile = tlx::AccumFragment<Cfg::kDqPartCols>;

// out = keys x rows^T for 64 keys (from row key0 of the tile): S^T = K Q^T or dP^T = V dO^T (SS
// wgmma, both operands K-major over the head size).
template <typename Cfg, typename KeysTile, typename RowsTile>
__device__ __forceinline__ void gemm_keys_by_rows(ScoreTile<Cfg>& out, const KeysTile& keys,
                                                  const RowsTile& rows, int key0) {
  tlx::gemm_ss_k_major(out, keys, key0, rows);
}

// acc += a * rows: dV += P^T dO or dK += dS^T Q (RS wgmma, the q tile read as an MN-major B).
template <typename Cfg, int kCols, typename RowsTile>
__device__ __forceinline__ void gemm_accumulate(
    tlx::AccumFragment<kCols>& acc, const tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& a,
    const RowsTile& rows) {
  tlx::gemm_rs_mn_major(acc, a, rows);
}

// This group's part of dQ (see DqSplit) = dS K: dS read from its transposed tile (M-major A; with
// kRows the group's q tile is the tile's column box `group`, with kKeys its keys are the group's
// rows), K as an MN-major B (with kColumns from the first box of the group's half of the columns).
template <typename Cfg>
__device__ __forceinline__ void gemm_dq(DqTile<Cfg>& dq, const typename Cfg::DsTile& ds,
                                        const typename Cfg::KTile& k, int group) {
  using T = typename Cfg::Element;
  using DsTile = typename Cfg::DsTile;
  using KTile = typename Cfg::KTile;
  static_assert(Cfg::kDqPartCols % KTile::kBoxCols == 0, "a part starts on a box of K");
  // With kKeys both operands start at the group's first key (a row of each tile, whose row pitches
  // differ where K takes the 64-byte swizzle).
  const int key0 = Cfg::kDqSplit == DqSplit::kKeys ? group * 64 : 0;
  const uint32_t a_addr =
      ds.box_addr(Cfg::kDqSplit == DqSplit::kRows ? group : 0) + DsTile::row_bytes(key0);
  const int k_box =
      Cfg::kDqSplit == DqSplit::kColumns ? group * Cfg::kDqPartCols / KTile::kBoxCols : 0;
  const uint32_t b_addr = k.box_addr(k_box) + KTile::row_bytes(key0);
  const uint64_t a_desc = tlx::mn_major_desc<DsTile>(a_addr);
  const uint64_t b_desc = tlx::mn_major_desc<KTile>(b_addr);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kDqKeys / 16; ++kk)
    tlx::wgmma_ss<T, Cfg::kDqPartCols, 1, 1>(
        dq.reg, tlx::desc_advance(a_desc, DsTile::row_bytes(16 * kk)),
        tlx::desc_advance(b_desc, KTile::row_bytes(16 * kk)), kk > 0 ? 1u : 0u);
  tlx::wgmma_commit();
}

}  // namespace jfa::sm90

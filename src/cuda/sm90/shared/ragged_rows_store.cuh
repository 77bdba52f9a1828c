// One consumer group's rows of a ragged output (O in the forward, dK and dV in the backward),
// written from a staging tile in shared memory: every thread of the group writes its part of the
// tile, then one thread stores it with one TMA store per column box through a ragged map whose
// row bound falls on the sequence's end, so the rows past it are clipped (FwdArgs::out_ragged_rows
// describes the map). The store only has to finish reading the tile before the group stages again.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/tma.hpp"

namespace jfa::sm90 {

struct RaggedRowsStore {
  uint32_t barrier;  // named barrier of the group's 128 threads
  bool storer;       // the thread that issues the stores

  // Waits until the group's previous store has read the tile; then the group may write it.
  __device__ __forceinline__ void acquire() const {
    if (storer) tlx::tma_store_wait_read<0>();
    tlx::NamedBarrier::sync(barrier, 128);
  }

  // Once every thread of the group has written its part: rows first .. end - 1 (global rows of
  // the packed tensor) of `head` go out from `tile` into columns col0 .. col0 + Tile::cols - 1;
  // `ragged_rows` is the map's row bound.
  template <typename Tile>
  __device__ __forceinline__ void store(Tile& tile, const CUtensorMap* tm, int32_t head,
                                        int64_t ragged_rows, int64_t first, int64_t end,
                                        int col0 = 0) const {
    tlx::fence_proxy_async_smem();
    tlx::NamedBarrier::sync(barrier, 128);
    if (storer) {
      const int32_t r = static_cast<int32_t>(ragged_rows - (end - first));
#pragma unroll
      for (int bx = 0; bx < Tile::kBoxes; ++bx)
        tlx::tma_store_4d(tm, tile.box(bx), col0 + bx * Tile::kBoxCols, head, r,
                          static_cast<int32_t>(end));
      tlx::tma_store_commit();
    }
  }
};

}  // namespace jfa::sm90

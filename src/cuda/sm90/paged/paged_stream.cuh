// How the paged decode kernel (paged_decode.cuh) streams a split's keys and
// values through shared memory: a chunk at a time, each 16-byte vector fetched by cp.async from the
// page of its key through the block table, kStages deep.
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/shared/async_copy.cuh"

namespace jfa::sm90 {

// The keys and values of chunk keys key0 .. key0 + kChunkKeys - 1 of the sequence whose block
// table row is `table`, for KV head kv_head, from the caches (a.k_cache and a.v_cache as T) into
// the stage (sk, sv): the vector `col` of key `key` of the chunk at at(sk, key, col) and at(sv,
// key, col). Keys at or past key_end, and keys on a page outside the cache, as zeros.
template <typename T, int kD, int kChunkKeys, int kThreads, typename At>
__device__ __forceinline__ void paged_load_chunk(const PagedArgs& a, const T* k_cache,
                                                 const T* v_cache, const int32_t* table,
                                                 int32_t kv_head, int32_t key0, int32_t key_end,
                                                 T* sk, T* sv, At at) {
  constexpr int kVecsPerKey = kD / 8;
#pragma unroll
  for (int it = 0; it < kChunkKeys * kVecsPerKey / kThreads; ++it) {
    const int v = static_cast<int>(threadIdx.x) + it * kThreads;
    const int key = v / kVecsPerKey, col = v % kVecsPerKey;
    const int32_t t = key0 + key;
    int64_t elem = -1;
    if (t < key_end) {
      const int32_t column = a.page_shift >= 0 ? t >> a.page_shift : t / a.page_size;
      const int32_t in_page = a.page_shift >= 0 ? t & (a.page_size - 1) : t % a.page_size;
      const int32_t page = __ldg(table + column);
      if (page >= 0 && page < a.num_pages)
        elem = ((static_cast<int64_t>(page) * a.page_size + in_page) * a.heads_kv + kv_head) * kD +
               col * 8;
    }
    T* const dk = at(sk, key, col);
    T* const dv = at(sv, key, col);
    if (elem >= 0) {
      cp_async_16(dk, k_cache + elem);
      cp_async_16(dv, v_cache + elem);
    } else {
      *reinterpret_cast<uint4*>(dk) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// The pipeline over n_chunks chunks: kStages - 1 in flight ahead of the one computed. The
// __syncthreads at the top of an iteration makes chunk c visible to all and frees the stage of
// chunk c - 1, which chunk c + kStages - 1 then takes. A group is committed every iteration, empty
// or not, so that the wait counts the same. Returns with every copy landed and the CTA synced (the
// stages free for other use). load(c, stage) and compute(c, stage).
template <int kStages, typename Load, typename Compute>
__device__ __forceinline__ void paged_pipeline(int32_t n_chunks, Load load, Compute compute) {
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < n_chunks) load(c, c);
    cp_async_commit();
  }
  for (int32_t c = 0; c < n_chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int32_t next = c + kStages - 1;
    if (next < n_chunks) load(next, next % kStages);
    cp_async_commit();
    compute(c, c % kStages);
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace jfa::sm90

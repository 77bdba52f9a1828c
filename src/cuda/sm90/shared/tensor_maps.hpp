// The tensor maps of the sm90 forward: Q, K and V as packed [total, heads, d] tensors (or K and V
// as the pages of a paged cache), and the ragged output map that clips each tile at the end of its
// item.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/params.hpp"
#include "cuda/common/tensor_map.hpp"

namespace jfa::sm90 {

template <typename T>
CUtensorMapDataType map_dtype() {
  return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// The swizzle of a map whose boxes are `box_cols` 16-bit columns wide (SwizzledTile's boxes).
inline CUtensorMapSwizzle swizzle_of_box(uint32_t box_cols) {
  return box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

// Map over a packed [total, heads, d] tensor: dims (d, heads, total), box (box_cols, 1, rows).
template <typename T>
bool encode_qkv_map(const void* base, int64_t total, int32_t heads, int32_t d,
                    const jfa::detail::Layout& layout, uint32_t rows, uint32_t box_cols,
                    CUtensorMap* map, std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = map_dtype<T>();
  spec.rank = 3;
  spec.base = base;
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(heads);
  spec.dims[2] = static_cast<uint64_t>(std::max<int64_t>(total, 1));
  spec.strides[0] = static_cast<uint64_t>(layout.head_stride) * sizeof(T);
  spec.strides[1] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.box[0] = box_cols;
  spec.box[1] = 1;
  spec.box[2] = rows;
  spec.swizzle = swizzle_of_box(box_cols);
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

// Map over a paged cache [num_pages, page_size, heads, d] (packed): dims (d, heads, page_size,
// num_pages), box (box_cols, 1, box_rows, 1): box_rows rows of one page and head.
template <typename T>
bool encode_paged_cache_map(const void* cache, int64_t num_pages, int32_t page_size, int32_t heads,
                            int32_t d, uint32_t box_rows, uint32_t box_cols, CUtensorMap* map,
                            std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = map_dtype<T>();
  spec.rank = 4;
  spec.base = cache;
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(heads);
  spec.dims[2] = static_cast<uint64_t>(page_size);
  spec.dims[3] = static_cast<uint64_t>(std::max<int64_t>(num_pages, 1));
  spec.strides[0] = static_cast<uint64_t>(d) * sizeof(T);
  spec.strides[1] = spec.strides[0] * static_cast<uint64_t>(heads);
  spec.strides[2] = spec.strides[1] * static_cast<uint64_t>(page_size);
  spec.box[0] = box_cols;
  spec.box[1] = 1;
  spec.box[2] = box_rows;
  spec.box[3] = 1;
  spec.swizzle = swizzle_of_box(box_cols);
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

// The ragged output map (see FwdArgs::out_ragged_rows): dims (d, heads, rows, total + 1), both
// outer dims one token apart, box (box_cols, 1, 64, 1), based `rows` tokens before `out` (never
// dereferenced there: every stored element lies inside the item's rows).
template <typename T>
bool encode_out_map(void* out, int64_t total, int64_t rows, int32_t heads, int32_t d,
                    const jfa::detail::Layout& layout, uint32_t box_cols, CUtensorMap* map,
                    std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = map_dtype<T>();
  spec.rank = 4;
  const uint64_t before = static_cast<uint64_t>(rows * layout.token_stride) * sizeof(T);
  if (reinterpret_cast<uintptr_t>(out) < before) {
    *error = "the output lies too low in the address space for the ragged output map";
    return false;
  }
  spec.base = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(out) - before);
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(heads);
  spec.dims[2] = static_cast<uint64_t>(rows);
  spec.dims[3] = static_cast<uint64_t>(total + 1);
  spec.strides[0] = static_cast<uint64_t>(layout.head_stride) * sizeof(T);
  spec.strides[1] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.strides[2] = static_cast<uint64_t>(layout.token_stride) * sizeof(T);
  spec.box[0] = box_cols;
  spec.box[1] = 1;
  spec.box[2] = 64;
  spec.box[3] = 1;
  spec.swizzle = swizzle_of_box(box_cols);
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

// Map over the backward's per-row float32 arrays, `rows` rows of row_len floats each (the LSE rows
// of every head, then the D rows): dims (row_len, rows), box (box, 1), no swizzle.
inline bool encode_row_terms_map(const float* base, int64_t row_len, int64_t rows, uint32_t box,
                                 CUtensorMap* map, std::string* error) {
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  spec.rank = 2;
  spec.base = base;
  spec.dims[0] = static_cast<uint64_t>(row_len);
  spec.dims[1] = static_cast<uint64_t>(rows);
  spec.strides[0] = static_cast<uint64_t>(row_len) * sizeof(float);
  spec.box[0] = box;
  spec.box[1] = 1;
  spec.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  return jfa::cuda::encode_tiled_map(spec, map, error);
}

}  // namespace jfa::sm90

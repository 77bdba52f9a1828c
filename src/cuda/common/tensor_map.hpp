// Host encoding of TMA tensor maps. cuTensorMapEncodeTiled lives in the driver library; it is
// reached through the runtime's driver entry point so that libjfa never links libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace jfa::cuda {

struct TiledMapSpec {
  CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  int rank = 0;                // 1..5
  const void* base = nullptr;  // 16-byte aligned
  uint64_t dims[5] = {};       // elements, innermost first
  uint64_t strides[4] = {};    // bytes of dims 1..rank-1, multiples of 16
  uint32_t box[5] = {};        // elements per dim; box[0] * element size <= the swizzle span
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
};

// Fills `map`; on failure returns false and writes a message naming the failed rule or call. The
// last few maps each thread encoded are kept: a spec seen again (the same tensors called again,
// as in a loop over steps) is copied instead of encoded (the driver's encode costs about 1 us).
bool encode_tiled_map(const TiledMapSpec& spec, CUtensorMap* map, std::string* error);

}  // namespace jfa::cuda

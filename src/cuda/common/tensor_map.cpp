#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>

namespace jfa::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(std::string* error) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000,
                                                           cudaEnableDefault, &query);
    if (e != cudaSuccess || query != cudaDriverEntryPointSuccess || entry == nullptr) {
      failure = std::string("cuTensorMapEncodeTiled is not available from the driver (") +
                (e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found") + ")";
      cudaGetLastError();
      return;
    }
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  });
  if (fn == nullptr && error != nullptr) *error = failure;
  return fn;
}

bool same_spec(const TiledMapSpec& a, const TiledMapSpec& b) {
  if (a.dtype != b.dtype || a.rank != b.rank || a.base != b.base || a.swizzle != b.swizzle)
    return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.dims[i] != b.dims[i] || a.box[i] != b.box[i]) return false;
    if (i + 1 < a.rank && a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

// The last maps this thread encoded, replaced round-robin.
struct RecentMaps {
  static constexpr int kSize = 8;
  TiledMapSpec spec[kSize];
  CUtensorMap map[kSize];
  bool used[kSize] = {};
  int next = 0;
};
thread_local RecentMaps recent;

}  // namespace

bool encode_tiled_map(const TiledMapSpec& spec, CUtensorMap* map, std::string* error) {
  for (int i = 0; i < RecentMaps::kSize; ++i) {
    if (recent.used[i] && same_spec(recent.spec[i], spec)) {
      *map = recent.map[i];
      return true;
    }
  }
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn(error);
  if (fn == nullptr) return false;
  cuuint64_t dims[5];
  cuuint64_t strides[4];
  cuuint32_t box[5];
  cuuint32_t element_strides[5];
  for (int i = 0; i < spec.rank; ++i) {
    dims[i] = spec.dims[i];
    box[i] = spec.box[i];
    element_strides[i] = 1;
    if (i + 1 < spec.rank) strides[i] = spec.strides[i];
  }
  const CUresult r =
      fn(map, spec.dtype, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.base), dims,
         strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, spec.swizzle,
         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    if (error != nullptr) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "cuTensorMapEncodeTiled failed (CUresult %d) for a rank-%d map at %p",
                    static_cast<int>(r), spec.rank, spec.base);
      *error = buf;
    }
    return false;
  }
  const int slot = recent.next;
  recent.next = (slot + 1) % RecentMaps::kSize;
  recent.spec[slot] = spec;
  recent.map[slot] = *map;
  recent.used[slot] = true;
  return true;
}

}  // namespace jfa::cuda

// Unit tests of the tile layer (jfa::tlx) on the GPU: TMA round trip with out-of-bounds fill and
// clipped stores, wgmma SS/RS against a host reference for the kernel's tile shapes, mbarrier
// phases over many iterations, TMA rings, named barriers and setmaxnreg
// roles.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/tensor_map.hpp"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/smem_tile.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/tma_ring.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "cuda/tlx/wgmma.hpp"
#include "gpu_test_util.hpp"

namespace tlx = jfa::tlx;
using jfa::gpu_test::DeviceBuffer;

namespace {

// Host conversions (this file is C++17 CUDA; the library's converters need C++20).
uint16_t to_bits(float f, bool half) {
  if (half) {
    const __half_raw r = __float2half_rn(f);
    return r.x;
  }
  const __nv_bfloat16_raw r = __float2bfloat16_rn(f);
  return r.x;
}
float from_bits(uint16_t b, bool half) {
  if (half) {
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
  }
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}

// ------------------------------------------------------------------------------------------------
// TMA: load the column boxes of a 64-row tile of a [300 x kCols] fp16 matrix into a swizzled tile
// (twice, to flip the barrier phase), read them back through the tile's swizzle formula, add 1,
// store through TMA. 128 columns: two 128-byte-swizzled boxes; 96: three 64-byte-swizzled ones.

constexpr int kRows = 300;

template <int kCols>
struct TmaShared {
  using Tile = tlx::SwizzledTile<__half, 64, kCols>;
  Tile tile;
  tlx::MBarrier bar;
};

template <int kCols>
__global__ void tma_roundtrip_kernel(const __grid_constant__ CUtensorMap in_map,
                                     const __grid_constant__ CUtensorMap out_map, int row_a,
                                     int row_b, uint16_t* seen_a, uint16_t* seen_b) {
  extern __shared__ unsigned char raw[];
  using Shared = TmaShared<kCols>;
  using Tile = typename Shared::Tile;
  auto& s =
      *reinterpret_cast<Shared*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  if (threadIdx.x == 0) {
    s.bar.init(1);
    tlx::fence_barrier_init();
  }
  __syncthreads();
  const int rows[2] = {row_a, row_b};
  uint16_t* seen[2] = {seen_a, seen_b};
  for (int round = 0; round < 2; ++round) {
    if (threadIdx.x == 0) {
      s.bar.arrive_expect_tx(Tile::kBytes);
      for (int bx = 0; bx < Tile::kBoxes; ++bx)
        tlx::tma_load_2d(&in_map, &s.bar, s.tile.box(bx), bx * Tile::kBoxCols, rows[round]);
    }
    s.bar.wait(static_cast<uint32_t>(round & 1));
    for (int i = threadIdx.x; i < 64 * kCols; i += blockDim.x) {
      const int r = i / kCols, c = i % kCols;
      seen[round][i] = __half_as_ushort(s.tile.at(r, c));
    }
    __syncthreads();
  }
  // Modify with ordinary stores, then hand the tile to the async proxy for a TMA store.
  for (int i = threadIdx.x; i < 64 * kCols; i += blockDim.x) {
    const int r = i / kCols, c = i % kCols;
    s.tile.at(r, c) = __hadd(s.tile.at(r, c), __float2half(1.0f));
  }
  tlx::fence_proxy_async_smem();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int bx = 0; bx < Tile::kBoxes; ++bx)
      tlx::tma_store_2d(&out_map, s.tile.box(bx), bx * Tile::kBoxCols, row_b);
    tlx::tma_store_commit();
    tlx::tma_store_wait<0>();
  }
}

__host__ __device__ float matrix_value(int r, int c) {
  return static_cast<float>(((r * 37 + c * 11) % 512) - 256);
}

template <int kCols>
bool make_2d_map(void* base, int rows, CUtensorMap* map, std::string* err) {
  using Tile = typename TmaShared<kCols>::Tile;
  jfa::cuda::TiledMapSpec spec;
  spec.dtype = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  spec.rank = 2;
  spec.base = base;
  spec.dims[0] = kCols;
  spec.dims[1] = static_cast<uint64_t>(rows);
  spec.strides[0] = kCols * 2;
  spec.box[0] = Tile::kBoxCols;
  spec.box[1] = 64;
  spec.swizzle =
      Tile::kSwizzleRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return jfa::cuda::encode_tiled_map(spec, map, err);
}

template <int kCols = 128>
void run_tma_case(int row_a, int row_b) {
  SCOPED_TRACE("row_a=" + std::to_string(row_a) + " row_b=" + std::to_string(row_b) +
               " cols=" + std::to_string(kCols));
  std::vector<uint16_t> host(kRows * kCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) host[r * kCols + c] = to_bits(matrix_value(r, c), true);
  DeviceBuffer in(host.size() * 2), out(host.size() * 2), seen_a(64 * kCols * 2),
      seen_b(64 * kCols * 2);
  JFA_CUDA_OK(cudaMemcpy(in.ptr, host.data(), in.bytes, cudaMemcpyHostToDevice));
  JFA_CUDA_OK(cudaMemset(out.ptr, 0x77, out.bytes));
  CUtensorMap in_map, out_map;
  std::string err;
  ASSERT_TRUE(make_2d_map<kCols>(in.ptr, kRows, &in_map, &err)) << err;
  ASSERT_TRUE(make_2d_map<kCols>(out.ptr, kRows, &out_map, &err)) << err;
  const int smem = sizeof(TmaShared<kCols>) + 1024;
  auto kernel = tma_roundtrip_kernel<kCols>;
  JFA_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<1, 128, smem>>>(in_map, out_map, row_a, row_b, seen_a.as<uint16_t>(),
                           seen_b.as<uint16_t>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  const int rows[2] = {row_a, row_b};
  const DeviceBuffer* seen[2] = {&seen_a, &seen_b};
  for (int round = 0; round < 2; ++round) {
    std::vector<uint16_t> got(64 * kCols);
    JFA_CUDA_OK(cudaMemcpy(got.data(), seen[round]->ptr, got.size() * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < kCols; ++c) {
        const int gr = rows[round] + r;
        const float want = (gr >= 0 && gr < kRows) ? matrix_value(gr, c) : 0.0f;
        const float g = from_bits(got[r * kCols + c], true);
        if (g != want && bad++ < 5)
          ADD_FAILURE() << "load round " << round << " (" << r << "," << c << "): got " << g
                        << " want " << want;
      }
    }
    EXPECT_EQ(bad, 0);
  }
  std::vector<uint16_t> stored(host.size());
  JFA_CUDA_OK(cudaMemcpy(stored.data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const bool inside = r >= row_b && r < row_b + 64;
      const uint16_t g = stored[r * kCols + c];
      if (inside) {
        const float want = matrix_value(r, c) + 1.0f;
        if (from_bits(g, true) != want && bad++ < 5)
          ADD_FAILURE() << "store (" << r << "," << c << "): got " << from_bits(g, true);
      } else if (g != 0x7777 && bad++ < 5) {
        ADD_FAILURE() << "store wrote outside its box at (" << r << "," << c << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(TlxTma, RoundTripInBounds) { run_tma_case(0, 100); }
TEST(TlxTma, RoundTripTailZeroFillAndClippedStore) {
  run_tma_case(260, 280);  // boxes reaching past the last row: zero fill on load, clipped store
}
TEST(TlxTma, RoundTrip64ByteSwizzle) {
  run_tma_case<96>(0, 100);
  run_tma_case<32>(260, 280);
}
// Boxes starting before row 0 (the kernels never do this); kept apart so that a fault here cannot
// hide the other results of a run.
TEST(TlxTmaNegativeCoordinates, DISABLED_HeadZeroFill) { run_tma_case(-40, -20); }

// ------------------------------------------------------------------------------------------------
// wgmma: S = Q K^T (SS, K-major B), P = 16-bit(S) as register A fragments, O = P V (RS, V read
// through the transposed-B descriptor): exactly the kernel's two GEMMs and shapes.

template <typename T, int kD, int kNB>
struct GemmShared {
  tlx::SwizzledTile<T, 64, kD> q;
  tlx::SwizzledTile<T, kNB, kD> k;
  tlx::SwizzledTile<T, kNB, kD> v;
};

template <typename T>
__device__ T bits_to(uint16_t b) {
  if constexpr (std::is_same_v<T, __half>)
    return __ushort_as_half(b);
  else
    return __ushort_as_bfloat16(b);
}

template <typename T, int kD, int kNB>
__global__ void __launch_bounds__(128)
    wgmma_chain_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* s_out,
                       float* o_out, float* row_max_out, float* row_sum_out) {
  extern __shared__ unsigned char raw[];
  using Shared = GemmShared<T, kD, kNB>;
  auto& sm =
      *reinterpret_cast<Shared*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  for (int i = threadIdx.x; i < 64 * kD; i += blockDim.x)
    sm.q.at(i / kD, i % kD) = bits_to<T>(q[i]);
  for (int i = threadIdx.x; i < kNB * kD; i += blockDim.x) {
    sm.k.at(i / kD, i % kD) = bits_to<T>(k[i]);
    sm.v.at(i / kD, i % kD) = bits_to<T>(v[i]);
  }
  tlx::fence_proxy_async_smem();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  using QTile = decltype(sm.q);
  using KTile = decltype(sm.k);
  using VTile = decltype(sm.v);
  tlx::AccumFragment<kNB> s;
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t qa = sm.q.box_addr(0) + QTile::k_step_bytes(kk);
    const uint32_t kb = sm.k.box_addr(0) + KTile::k_step_bytes(kk);
    tlx::wgmma_ss<T, kNB, 0>(s.reg, tlx::k_major_desc<QTile>(qa), tlx::k_major_desc<KTile>(kb),
                             kk > 0 ? 1u : 0u);
  }
  tlx::wgmma_commit();
  tlx::wgmma_wait<0>();
  tlx::fence_operand(s);
  // S through the fragment's map from registers to (row, column).
  s.for_each([&](float& x, int h, int col) { s_out[s.row(h) * kNB + col] = x; });
  // Row maxima and sums through the fragment's row reductions (the identity map keeps S).
  float row_max[2], row_sum[2];
  s.thread_row_max(row_max);
  s.map_and_sum_rows([](float x, int) { return x; }, row_sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m = tlx::quad_max(row_max[h]), sum = tlx::quad_sum(row_sum[h]);
    if (lane % 4 == 0) {
      row_max_out[s.row(h)] = m;
      row_sum_out[s.row(h)] = sum;
    }
  }
  tlx::AFragment<T, kNB> p;
  s.template to_a<T>(p);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  tlx::fence_operand(o);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kNB / 16; ++kk) {
    const uint32_t vb = sm.v.box_addr(0) + VTile::row_bytes(16 * kk);
    tlx::wgmma_rs<T, kD, 1>(o, p.reg[kk], tlx::mn_major_desc<VTile>(vb), 1u);
  }
  tlx::wgmma_commit();
  tlx::wgmma_wait<0>();
  tlx::fence_operand(o);
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) {
    const int row = warp * 16 + lane / 4 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    o_out[row * kD + col] = o[i];
  }
}

template <typename T, int kD, int kNB>
void run_wgmma_case() {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  SCOPED_TRACE(std::string(kHalf ? "fp16" : "bf16") + " d=" + std::to_string(kD) +
               " n=" + std::to_string(kNB));
  std::mt19937_64 rng(jfa::gpu_test::fresh_seed("wgmma"));
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](std::vector<uint16_t>& buf) {
    for (auto& x : buf) x = to_bits(normal(rng), kHalf);
  };
  std::vector<uint16_t> q(64 * kD), k(kNB * kD), v(kNB * kD);
  fill(q);
  fill(k);
  fill(v);
  auto val = [&](const std::vector<uint16_t>& b, size_t i) {
    return static_cast<double>(from_bits(b[i], kHalf));
  };
  DeviceBuffer dq(q.size() * 2), dk(k.size() * 2), dv(v.size() * 2), ds(64 * kNB * 4),
      d_o(64 * kD * 4), d_max(64 * 4), d_sum(64 * 4);
  JFA_CUDA_OK(cudaMemcpy(dq.ptr, q.data(), dq.bytes, cudaMemcpyHostToDevice));
  JFA_CUDA_OK(cudaMemcpy(dk.ptr, k.data(), dk.bytes, cudaMemcpyHostToDevice));
  JFA_CUDA_OK(cudaMemcpy(dv.ptr, v.data(), dv.bytes, cudaMemcpyHostToDevice));
  const int smem = sizeof(GemmShared<T, kD, kNB>) + 1024;
  auto kernel = wgmma_chain_kernel<T, kD, kNB>;
  JFA_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<1, 128, smem>>>(dq.as<uint16_t>(), dk.as<uint16_t>(), dv.as<uint16_t>(), ds.as<float>(),
                           d_o.as<float>(), d_max.as<float>(), d_sum.as<float>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> s(64 * kNB), o(64 * kD);
  JFA_CUDA_OK(cudaMemcpy(s.data(), ds.ptr, ds.bytes, cudaMemcpyDeviceToHost));
  JFA_CUDA_OK(cudaMemcpy(o.data(), d_o.ptr, d_o.bytes, cudaMemcpyDeviceToHost));
  std::vector<float> row_max(64), row_sum(64);
  JFA_CUDA_OK(cudaMemcpy(row_max.data(), d_max.ptr, d_max.bytes, cudaMemcpyDeviceToHost));
  JFA_CUDA_OK(cudaMemcpy(row_sum.data(), d_sum.ptr, d_sum.bytes, cudaMemcpyDeviceToHost));
  double diff = 0, norm = 0;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < kNB; ++c) {
      double ref = 0;
      for (int e = 0; e < kD; ++e) ref += val(q, r * kD + e) * val(k, c * kD + e);
      diff += (s[r * kNB + c] - ref) * (s[r * kNB + c] - ref);
      norm += ref * ref;
    }
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "S = Q K^T (SS wgmma)";
  // The fragment's row reductions against the rows of S as the device wrote them.
  for (int r = 0; r < 64; ++r) {
    float want_max = -INFINITY;
    double want_sum = 0, magnitude = 0;
    for (int c = 0; c < kNB; ++c) {
      want_max = std::max(want_max, s[r * kNB + c]);
      want_sum += s[r * kNB + c];
      magnitude += std::abs(s[r * kNB + c]);
    }
    EXPECT_EQ(row_max[r], want_max) << "row max of row " << r;
    EXPECT_NEAR(row_sum[r], want_sum, 1e-5 * magnitude + 1e-6) << "row sum of row " << r;
  }
  // P as the device rounds it, then O = P V.
  std::vector<uint16_t> p(64 * kNB);
  for (size_t i = 0; i < p.size(); ++i) p[i] = to_bits(s[i], kHalf);
  diff = norm = 0;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < kD; ++c) {
      double ref = 0;
      for (int e = 0; e < kNB; ++e) ref += val(p, r * kNB + e) * val(v, e * kD + c);
      diff += (o[r * kD + c] - ref) * (o[r * kD + c] - ref);
      norm += ref * ref;
    }
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "O = P V (RS wgmma, transposed B)";
}

TEST(TlxWgmma, Fp16D64N64) { run_wgmma_case<__half, 64, 64>(); }
TEST(TlxWgmma, Fp16D64N128) { run_wgmma_case<__half, 64, 128>(); }
TEST(TlxWgmma, Fp16D128N128) { run_wgmma_case<__half, 128, 128>(); }
TEST(TlxWgmma, Bf16D64N64) { run_wgmma_case<__nv_bfloat16, 64, 64>(); }
TEST(TlxWgmma, Bf16D64N128) { run_wgmma_case<__nv_bfloat16, 64, 128>(); }
TEST(TlxWgmma, Bf16D128N128) { run_wgmma_case<__nv_bfloat16, 128, 128>(); }
TEST(TlxWgmma, Fp16D128N160) { run_wgmma_case<__half, 128, 160>(); }
TEST(TlxWgmma, Bf16D128N160) { run_wgmma_case<__nv_bfloat16, 128, 160>(); }
// 64-byte-swizzled operands (32 and 96 columns) and the widest value tile (256 columns).
TEST(TlxWgmma, Fp16D32N64) { run_wgmma_case<__half, 32, 64>(); }
TEST(TlxWgmma, Fp16D96N64) { run_wgmma_case<__half, 96, 64>(); }
TEST(TlxWgmma, Bf16D96N128) { run_wgmma_case<__nv_bfloat16, 96, 128>(); }
TEST(TlxWgmma, Bf16D256N64) { run_wgmma_case<__nv_bfloat16, 256, 64>(); }

// ------------------------------------------------------------------------------------------------
// mbarrier: a producer warp and a consumer warp hand a 3-stage ring back and forth many times;
// every lane arrives (count 32), so each write is released by its own thread.

__global__ void mbarrier_ring_kernel(int iters, int* errors, long long* sum) {
  constexpr int kStages = 3;
  __shared__ int buf[kStages][32];
  __shared__ tlx::MBarrier full[kStages], empty[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      full[i].init(32);
      empty[i].init(32);
    }
    tlx::fence_barrier_init();
  }
  __syncthreads();
  tlx::PipelineState<kStages> st;
  if (warp == 0) {
    for (int i = 0; i < iters; ++i) {
      empty[st.stage].wait(st.phase ^ 1u);
      buf[st.stage][lane] = i * 32 + lane;
      full[st.stage].arrive();
      st.advance();
    }
  } else {
    int bad = 0;
    long long total = 0;
    for (int i = 0; i < iters; ++i) {
      full[st.stage].wait(st.phase);
      const int x = buf[st.stage][lane];
      bad += x != i * 32 + lane;
      total += x;
      empty[st.stage].arrive();
      st.advance();
    }
    atomicAdd(errors, bad);
    atomicAdd(reinterpret_cast<unsigned long long*>(sum), static_cast<unsigned long long>(total));
  }
}

TEST(TlxMBarrier, PhaseFlipsOverManyIterations) {
  const int iters = 10007;
  DeviceBuffer errors(sizeof(int)), sum(sizeof(long long));
  JFA_CUDA_OK(cudaMemset(errors.ptr, 0, errors.bytes));
  JFA_CUDA_OK(cudaMemset(sum.ptr, 0, sum.bytes));
  mbarrier_ring_kernel<<<1, 64>>>(iters, errors.as<int>(), sum.as<long long>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  int h_errors = -1;
  long long h_sum = 0;
  JFA_CUDA_OK(cudaMemcpy(&h_errors, errors.ptr, sizeof h_errors, cudaMemcpyDeviceToHost));
  JFA_CUDA_OK(cudaMemcpy(&h_sum, sum.ptr, sizeof h_sum, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h_errors, 0);
  const long long n = static_cast<long long>(iters) * 32;
  EXPECT_EQ(h_sum, n * (n - 1) / 2);
}

// ------------------------------------------------------------------------------------------------
// TmaRing: one thread loads 64-row blocks of the matrix through two 2-stage rings, A (a TmaRing)
// and B (a TmaRingRef over barriers of its own arrays), B one load behind A as the forward's V is
// behind K, every third B handed over with nothing loaded; two consumer warps check a column of
// each tile and release it (one arrival per warp), over enough rounds that every phase flips.

constexpr int kRingCols = 64;
constexpr int kRingStages = 2;
using RingTile = TmaShared<kRingCols>::Tile;

struct RingShared {
  RingTile tiles[2][kRingStages];
  tlx::TmaRing<kRingStages> a;
  tlx::MBarrier b_full[kRingStages], b_empty[kRingStages];
};

__host__ __device__ int ring_first_row(int tile, int i) {
  return i * (tile ? 13 : 7) % (kRows - 64);
}
__host__ __device__ bool ring_nothing_loaded(int tile, int i) { return tile == 1 && i % 3 == 2; }

__global__ void tma_ring_kernel(const __grid_constant__ CUtensorMap map, int iters, int* errors) {
  extern __shared__ unsigned char raw[];
  auto& s =
      *reinterpret_cast<RingShared*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  tlx::TmaRingRef<kRingStages> b{{s.b_full, s.b_empty}};
  if (threadIdx.x == 0) {
    s.a.init(2);
    b.init(2);
    tlx::fence_barrier_init();
  }
  __syncthreads();
  tlx::PipelineState<kRingStages> pos[2];
  if (warp == 0) {
    if (lane != 0) return;
    auto load = [&](int t, int i) {
      tlx::PipelineState<kRingStages>& st = pos[t];
      if (t == 0) {
        s.a.acquire(st);
        tlx::MBarrier* full = s.a.commit(st, RingTile::kBytes);
        for (int bx = 0; bx < RingTile::kBoxes; ++bx)
          tlx::tma_load_2d(&map, full, s.tiles[0][st.stage].box(bx), bx * RingTile::kBoxCols,
                           ring_first_row(0, i));
      } else {
        b.acquire(st);
        if (ring_nothing_loaded(1, i)) {
          b.commit_empty(st);
        } else {
          tlx::MBarrier* full = b.commit(st, RingTile::kBytes);
          for (int bx = 0; bx < RingTile::kBoxes; ++bx)
            tlx::tma_load_2d(&map, full, s.tiles[1][st.stage].box(bx), bx * RingTile::kBoxCols,
                             ring_first_row(1, i));
        }
      }
      st.advance();
    };
    load(0, 0);
    for (int i = 1; i < iters; ++i) {
      load(0, i);
      load(1, i - 1);
    }
    load(1, iters - 1);
    return;
  }
  int bad = 0;
  const int r = (warp - 1) * 32 + lane;
  for (int i = 0; i < iters; ++i) {
    for (int t = 0; t < 2; ++t) {
      if (t == 0)
        s.a.wait(pos[0]);
      else
        b.wait(pos[1]);
      if (!ring_nothing_loaded(t, i)) {
        const int c = (i * 5 + lane) % kRingCols;
        bad += __half2float(s.tiles[t][pos[t].stage].at(r, c)) !=
               matrix_value(ring_first_row(t, i) + r, c);
      }
      __syncwarp();
      if (tlx::lane_is_leader()) {
        if (t == 0)
          s.a.release(pos[0]);
        else
          b.release(pos[1]);
      }
      pos[t].advance();
    }
  }
  atomicAdd(errors, bad);
}

TEST(TlxTmaRing, TwoRingsOverManyRounds) {
  std::vector<uint16_t> host(kRows * kRingCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kRingCols; ++c) host[r * kRingCols + c] = to_bits(matrix_value(r, c), true);
  DeviceBuffer in(host.size() * 2), errors(sizeof(int));
  JFA_CUDA_OK(cudaMemcpy(in.ptr, host.data(), in.bytes, cudaMemcpyHostToDevice));
  JFA_CUDA_OK(cudaMemset(errors.ptr, 0, errors.bytes));
  CUtensorMap map;
  std::string err;
  ASSERT_TRUE(make_2d_map<kRingCols>(in.ptr, kRows, &map, &err)) << err;
  const int smem = sizeof(RingShared) + 1024;
  JFA_CUDA_OK(
      cudaFuncSetAttribute(tma_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tma_ring_kernel<<<1, 96, smem>>>(map, 1001, errors.as<int>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  int h_errors = -1;
  JFA_CUDA_OK(cudaMemcpy(&h_errors, errors.ptr, sizeof h_errors, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h_errors, 0);
}

// ------------------------------------------------------------------------------------------------
// Named barriers: two independent writer/reader warp pairs on barriers 1 and 2 (bar.arrive from the
// writer, bar.sync from the reader, then the reverse handshake).

__global__ void named_barrier_kernel(int iters, int* errors) {
  __shared__ int slot[2][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / 2;
  const bool writer = (warp % 2) == 0;
  const uint32_t to_reader = 1 + pair, to_writer = 3 + pair;
  int bad = 0;
  for (int i = 0; i < iters; ++i) {
    if (writer) {
      slot[pair][lane] = i ^ (pair << 20);
      tlx::NamedBarrier::arrive(to_reader, 64);
      tlx::NamedBarrier::sync(to_writer, 64);
    } else {
      tlx::NamedBarrier::sync(to_reader, 64);
      bad += slot[pair][lane] != (i ^ (pair << 20));
      tlx::NamedBarrier::arrive(to_writer, 64);
    }
  }
  if (bad) atomicAdd(errors, bad);
}

TEST(TlxNamedBarrier, PairsExchangeValues) {
  DeviceBuffer errors(sizeof(int));
  JFA_CUDA_OK(cudaMemset(errors.ptr, 0, errors.bytes));
  named_barrier_kernel<<<1, 128>>>(5000, errors.as<int>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  int h = -1;
  JFA_CUDA_OK(cudaMemcpy(&h, errors.ptr, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0);
}

// ------------------------------------------------------------------------------------------------
// setmaxnreg: a producer group gives registers away, two consumer groups take them, all run.

__global__ void __launch_bounds__(384, 1) roles_kernel(int* out) {
  const int group = tlx::warp_group_index();
  if (group == 0) {
    tlx::warpgroup_reg_dealloc<24>();
    out[threadIdx.x] = 100;
  } else {
    tlx::warpgroup_reg_alloc<240>();
    out[threadIdx.x] = 200 + group;
  }
}

TEST(TlxWarpGroup, SetmaxnregRoles) {
  DeviceBuffer out(384 * sizeof(int));
  roles_kernel<<<1, 384>>>(out.as<int>());
  JFA_CUDA_OK(cudaGetLastError());
  JFA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<int> h(384);
  JFA_CUDA_OK(cudaMemcpy(h.data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost));
  for (int t = 0; t < 384; ++t) EXPECT_EQ(h[t], t < 128 ? 100 : 200 + t / 128) << "thread " << t;
}

}  // namespace

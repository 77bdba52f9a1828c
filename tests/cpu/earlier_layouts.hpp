// The parameter structs of earlier jfa.h releases, written out here as a caller built against
// them sees them (independently of the library's own copies), and memory that faults past a
// struct's end: what the tests of the struct_size rule need.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>

#include "jfa/jfa.h"

namespace jfa::testing {

// The layouts of jfa.h 0.1.0, as such a caller has them.
struct ParamsV1 {
  uint32_t struct_size;
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim;
  jfa_dtype dtype;
  jfa_tensor_layout q_layout, k_layout, v_layout, out_layout;
  float softmax_scale;
  int causal;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  jfa_backend backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  int32_t* device_check;
};

// A backward struct of an earlier release, embedding that release's forward.
template <typename Forward>
struct BackwardParamsOf {
  uint32_t struct_size;
  Forward forward;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  jfa_tensor_layout dout_layout, dq_layout, dk_layout, dv_layout;
  const float* dlse;
  int deterministic;
};

using BackwardParamsV1 = BackwardParamsOf<ParamsV1>;

// The layouts of the release that added head_dim_v (the last field then).
struct ParamsV2 {
  uint32_t struct_size;
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim;
  jfa_dtype dtype;
  jfa_tensor_layout q_layout, k_layout, v_layout, out_layout;
  float softmax_scale;
  int causal;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  jfa_backend backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  int32_t* device_check;
  int32_t head_dim_v;
};

using BackwardParamsV2 = BackwardParamsOf<ParamsV2>;

// Memory whose end is followed by an inaccessible page: a struct placed to end there faults when
// the library reads or writes a byte past it.
class GuardedPage {
 public:
  GuardedPage() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    void* m = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(m, MAP_FAILED);
    base_ = static_cast<unsigned char*>(m);
    EXPECT_EQ(mprotect(base_ + page_, page_, PROT_NONE), 0);
  }
  ~GuardedPage() { munmap(base_, 2 * page_); }
  template <typename T>
  T* place() {
    return new (base_ + page_ - sizeof(T)) T{};
  }

 private:
  size_t page_;
  unsigned char* base_ = nullptr;
};

// Copies the fields a 0.1.0 caller has from the current struct.
template <typename From, typename To>
void copy_v1_fields(const From& f, To& t) {
  t.q = f.q;
  t.k = f.k;
  t.v = f.v;
  t.out = f.out;
  t.lse = f.lse;
  t.cu_seqlens_q = f.cu_seqlens_q;
  t.cu_seqlens_k = f.cu_seqlens_k;
  t.batch = f.batch;
  t.total_q = f.total_q;
  t.total_k = f.total_k;
  t.heads_q = f.heads_q;
  t.heads_kv = f.heads_kv;
  t.head_dim = f.head_dim;
  t.dtype = f.dtype;
  t.q_layout = f.q_layout;
  t.k_layout = f.k_layout;
  t.v_layout = f.v_layout;
  t.out_layout = f.out_layout;
  t.softmax_scale = f.softmax_scale;
  t.causal = f.causal;
  t.backend = f.backend;
}

// Copies the fields a caller of the head_dim_v layout has from the current struct.
template <typename From, typename To>
void copy_v2_fields(const From& f, To& t) {
  copy_v1_fields(f, t);
  t.head_dim_v = f.head_dim_v;
}

}  // namespace jfa::testing

// C entry points over a paged KV cache (jfa_paged_kv): the cache's own checks, then each
// sequence's keys and values gathered from its pages (and the step's new rows, where the call
// appends) into packed host buffers, and the packed forward or reference on them, so that every
// rule and check of the packed path holds as it is. The forward writes the new rows into the pages
// only once every check has passed.
// The CPU backend: the gathered copy is host memory. A forward whose cache is in device memory, or
// that asks for backend=cuda, goes to the CUDA backend's paged kernels (cuda/sm90/paged/: decode
// and speculative decode, with the append), which read and write the pages where they are.
#include <cstring>
#include <limits>
#include <vector>

#include "api/buffer_checks.hpp"
#include "api/call_buffers.hpp"
#include "api/enum_bits.hpp"
#include "api/error.hpp"
#include "api/memory_probe.hpp"
#include "api/params_layouts.hpp"
#include "api/validate.hpp"
#include "jfa/jfa.h"
#ifdef JFA_WITH_CUDA
#include "cuda/gpu_backends.hpp"
#endif

using jfa::detail::BufferView;
using jfa::detail::fail;
using jfa::detail::guarded;

namespace {

// The keys and values of every sequence, packed by cu_k.
struct GatheredKv {
  std::vector<unsigned char> k, v;
  std::vector<int32_t> cu_k;
  int64_t total_k = 0;
};

// The caller's params in the current layout; the packed keys' fields must be unused.
jfa_status read_paged_params(const jfa_attention_params* in, jfa_attention_params* p) {
  if (in == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  if (const jfa_status s = jfa::detail::read_params(in, p); s != JFA_SUCCESS) return s;
  if (p->k != nullptr || p->v != nullptr || p->cu_seqlens_k != nullptr || p->total_k != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "with a paged KV cache, params->k, v, cu_seqlens_k and total_k are unused: set "
                "them to NULL and 0 (the keys and values come from the cache)");
  if (p->k_layout.token_stride != 0 || p->k_layout.head_stride != 0 ||
      p->v_layout.token_stride != 0 || p->v_layout.head_stride != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "with a paged KV cache, params->k_layout and v_layout are unused: leave them zero "
                "(the caches are packed [num_pages, page_size, heads_kv, head_dim])");
  return JFA_SUCCESS;
}

// The cache's fields, sizes and side; reads nothing through its pointers.
jfa_status check_cache_fields(const jfa_paged_kv* kv, const jfa_attention_params& p) {
  if (kv == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "kv must not be NULL");
  if (kv->struct_size != sizeof(jfa_paged_kv))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "kv->struct_size is %u, not %zu: fill the struct with jfa_paged_kv_init() first",
                kv->struct_size, sizeof(jfa_paged_kv));
  if (kv->page_size < 1)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "kv->page_size must be >= 1, got %d", kv->page_size);
  if (kv->num_pages < 0 || kv->max_pages_per_seq < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "kv->num_pages and kv->max_pages_per_seq must be >= 0, got %lld and %d",
                static_cast<long long>(kv->num_pages), kv->max_pages_per_seq);
  if (p.batch < 0 || p.batch > std::numeric_limits<int32_t>::max())
    return fail(JFA_ERROR_INVALID_ARGUMENT, "batch must be in [0, 2^31 - 1], got %lld",
                static_cast<long long>(p.batch));
  const int32_t dv = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
  if (p.heads_kv < 1 || p.head_dim < 1 || dv < 1 || p.head_dim > JFA_MAX_HEAD_DIM ||
      dv > JFA_MAX_HEAD_DIM)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "heads_kv, head_dim and head_dim_v must be in [1, %d] (heads_kv >= 1), got %d, %d "
                "and %d",
                JFA_MAX_HEAD_DIM, p.heads_kv, p.head_dim, dv);
  if (p.batch > 0 && (kv->block_table == nullptr || kv->seqused_k == nullptr))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "kv->block_table and kv->seqused_k must not be NULL when batch > 0");
  if (kv->num_pages > 0 && (kv->k_cache == nullptr || kv->v_cache == nullptr))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "kv->k_cache and kv->v_cache must not be NULL when num_pages > 0");
  if (kv->k_new != nullptr || kv->v_new != nullptr) {
    if (kv->k_new == nullptr || kv->v_new == nullptr)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "kv->k_new and kv->v_new must both be set to append, or both NULL");
    if (kv->total_new < 0 || kv->total_new > std::numeric_limits<int32_t>::max())
      return fail(JFA_ERROR_INVALID_ARGUMENT, "kv->total_new must be in [0, 2^31 - 1], got %lld",
                  static_cast<long long>(kv->total_new));
    if (p.batch > 0 && kv->cu_seqlens_new == nullptr)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "kv->cu_seqlens_new must not be NULL when appending to a batch");
  } else if (kv->cu_seqlens_new != nullptr || kv->total_new != 0) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "kv->cu_seqlens_new and kv->total_new are for an append: set kv->k_new and "
                "kv->v_new too, or leave them NULL and 0");
  }
  // The caches' sizes in bytes must fit int64.
  const double rows = static_cast<double>(kv->num_pages) * kv->page_size * p.heads_kv;
  if (rows * (p.head_dim > dv ? p.head_dim : dv) * 4.0 > 9.0e18)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "the caches' sizes overflow int64");
  if (static_cast<double>(p.batch) * kv->max_pages_per_seq > 9.0e18)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "batch * max_pages_per_seq overflows int64");
  return JFA_SUCCESS;
}

// Whether a buffer of the cache is in device memory.
bool cache_on_device(const jfa_paged_kv& kv) {
  for (const void* ptr :
       {static_cast<const void*>(kv.k_cache), static_cast<const void*>(kv.v_cache),
        static_cast<const void*>(kv.block_table), static_cast<const void*>(kv.seqused_k), kv.k_new,
        kv.v_new, static_cast<const void*>(kv.cu_seqlens_new)}) {
    if (ptr != nullptr && jfa::detail::memory_kind(ptr) == jfa::detail::MemoryKind::kDevice)
      return true;
  }
  return false;
}

// The gather reads the cache on the host. The forward sends a cache in device memory to the CUDA
// route before this; the reference, a host computation, refuses it as jfa_attention_reference
// refuses device buffers.
jfa_status check_host_cache(const jfa_paged_kv& kv) {
  if (cache_on_device(kv))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "the reference needs host buffers, but kv's cache, block table, seqused_k or new "
                "rows are in device memory");
  return JFA_SUCCESS;
}

// Bytes of one token's keys and of its values (all KV heads).
struct RowBytes {
  size_t k, v;
};

RowBytes row_bytes(const jfa_attention_params& p) {
  const size_t es = jfa_dtype_size(p.dtype);
  const int32_t dv = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
  return {static_cast<size_t>(p.heads_kv) * p.head_dim * es,
          static_cast<size_t>(p.heads_kv) * dv * es};
}

// Pages that n keys fill.
int64_t pages_of(const jfa_paged_kv& kv, int64_t n) {
  return (n + kv.page_size - 1) / kv.page_size;
}

// Rows of the step's new keys of sequence b (0 without an append).
int64_t new_rows(const jfa_paged_kv& kv, int64_t b) {
  return kv.k_new == nullptr ? 0 : kv.cu_seqlens_new[b + 1] - kv.cu_seqlens_new[b];
}

// Where row t of sequence b lies in the cache, as a row of [num_pages * page_size].
int64_t cache_row(const jfa_paged_kv& kv, int64_t b, int64_t t) {
  return static_cast<int64_t>(kv.block_table[b * kv.max_pages_per_seq + t / kv.page_size]) *
             kv.page_size +
         t % kv.page_size;
}

// A page that receives appended rows must hold keys of that sequence alone (else the result would
// depend on the order of the writes and reads).
jfa_status check_appended_pages(const jfa_paged_kv& kv, const std::vector<int32_t>& cu_k,
                                int64_t batch) {
  std::vector<int32_t> holders(static_cast<size_t>(kv.num_pages), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = pages_of(kv, cu_k[b + 1] - cu_k[b]);
    for (int64_t j = 0; j < pages; ++j) {
      const int32_t page = kv.block_table[b * kv.max_pages_per_seq + j];
      ++holders[page];
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t old = kv.seqused_k[b], n = cu_k[b + 1] - cu_k[b];
    for (int64_t j = old / kv.page_size; j * kv.page_size < n && old < n; ++j) {
      const int32_t page = kv.block_table[b * kv.max_pages_per_seq + j];
      if (holders[page] != 1)
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "kv->block_table: page %d receives appended rows of sequence %lld but holds "
                    "keys of another sequence too (or twice in one table): a page written by an "
                    "append must belong to its sequence alone",
                    page, static_cast<long long>(b));
    }
  }
  return JFA_SUCCESS;
}

// Reads seqused_k, the append's offsets and the block table entries of the pages that hold keys
// (host memory), checks them, and gathers the keys and values (the cache's rows, then the new
// ones) into packed buffers. Writes nothing.
jfa_status gather(const jfa_paged_kv& kv, const jfa_attention_params& p, GatheredKv* g) {
  if (jfa_dtype_size(p.dtype) == 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(p.dtype));
  if (kv.k_new != nullptr) {
    if (const jfa_status s = jfa::detail::validate_offsets_named(
            kv.cu_seqlens_new, p.batch, kv.total_new, "kv->cu_seqlens_new");
        s != JFA_SUCCESS)
      return s;
  }
  const int64_t capacity = static_cast<int64_t>(kv.max_pages_per_seq) * kv.page_size;
  g->cu_k.assign(static_cast<size_t>(p.batch) + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t used = kv.seqused_k[b];
    const int64_t n = static_cast<int64_t>(used) + new_rows(kv, b);
    if (used < 0 || n > capacity)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "kv->seqused_k[%lld]=%d (with %lld appended rows) must be in [0, "
                  "max_pages_per_seq * page_size = %lld]",
                  static_cast<long long>(b), used, static_cast<long long>(new_rows(kv, b)),
                  static_cast<long long>(capacity));
    const int64_t end = static_cast<int64_t>(g->cu_k[b]) + n;
    if (end > std::numeric_limits<int32_t>::max())
      return fail(JFA_ERROR_INVALID_ARGUMENT, "the sum of the sequences' keys exceeds 2^31 - 1");
    g->cu_k[b + 1] = static_cast<int32_t>(end);
    for (int64_t j = 0; j < pages_of(kv, n); ++j) {
      const int32_t page = kv.block_table[b * kv.max_pages_per_seq + j];
      if (page < 0 || page >= kv.num_pages)
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "kv->block_table[%lld][%lld]=%d is outside [0, num_pages=%lld) (page %lld of "
                    "sequence %lld, which holds keys)",
                    static_cast<long long>(b), static_cast<long long>(j), page,
                    static_cast<long long>(kv.num_pages), static_cast<long long>(j),
                    static_cast<long long>(b));
    }
  }
  if (kv.k_new != nullptr) {
    if (const jfa_status s = check_appended_pages(kv, g->cu_k, p.batch); s != JFA_SUCCESS) return s;
  }
  g->total_k = g->cu_k.back();
  const auto [row_k, row_v] = row_bytes(p);
  // At least one row each, so that the packed call gets non-NULL k and v.
  g->k.resize((g->total_k > 0 ? g->total_k : 1) * row_k);
  g->v.resize((g->total_k > 0 ? g->total_k : 1) * row_v);
  const auto* kc = static_cast<const unsigned char*>(kv.k_cache);
  const auto* vc = static_cast<const unsigned char*>(kv.v_cache);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used = kv.seqused_k[b];
    for (int64_t t = 0; t < used; t += kv.page_size) {
      const int64_t rows = used - t < kv.page_size ? used - t : kv.page_size;
      const int64_t dst = g->cu_k[b] + t, src = cache_row(kv, b, t);
      std::memcpy(g->k.data() + dst * row_k, kc + src * row_k, rows * row_k);
      std::memcpy(g->v.data() + dst * row_v, vc + src * row_v, rows * row_v);
    }
    const int64_t added = new_rows(kv, b);
    if (added > 0) {
      const int64_t from = kv.cu_seqlens_new[b], dst = g->cu_k[b] + used;
      std::memcpy(g->k.data() + dst * row_k,
                  static_cast<const unsigned char*>(kv.k_new) + from * row_k, added * row_k);
      std::memcpy(g->v.data() + dst * row_v,
                  static_cast<const unsigned char*>(kv.v_new) + from * row_v, added * row_v);
    }
  }
  return JFA_SUCCESS;
}

// The append: each sequence's new rows into its pages (checked by gather).
void write_appended(const jfa_paged_kv& kv, const jfa_attention_params& p) {
  const auto [row_k, row_v] = row_bytes(p);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t used = kv.seqused_k[b], added = new_rows(kv, b);
    for (int64_t i = 0; i < added; ++i) {
      const int64_t row = cache_row(kv, b, used + i), from = kv.cu_seqlens_new[b] + i;
      std::memcpy(static_cast<unsigned char*>(kv.k_cache) + row * row_k,
                  static_cast<const unsigned char*>(kv.k_new) + from * row_k, row_k);
      std::memcpy(static_cast<unsigned char*>(kv.v_cache) + row * row_v,
                  static_cast<const unsigned char*>(kv.v_new) + from * row_v, row_v);
    }
  }
}

// The packed params of the gathered keys (the caller's others unchanged).
jfa_attention_params packed_params(const jfa_attention_params& p, const GatheredKv& g) {
  jfa_attention_params q = p;
  q.k = g.k.data();
  q.v = g.v.data();
  q.cu_seqlens_k = g.cu_k.data();
  q.total_k = g.total_k;
  return q;
}

// The cache's buffers, beside the call's: the caches are written where the call appends.
void add_cache_views(const jfa::detail::Params& pp, const jfa_paged_kv& kv,
                     std::vector<BufferView>* views) {
  const int64_t cache_rows = kv.num_pages * kv.page_size;
  const size_t es = jfa_dtype_size(pp.dtype);
  const bool appending = kv.k_new != nullptr;
  views->push_back(jfa::detail::packed_view("kv->k_cache", kv.k_cache, cache_rows, pp.heads_kv,
                                            pp.head_dim, es, appending));
  views->push_back(jfa::detail::packed_view("kv->v_cache", kv.v_cache, cache_rows, pp.heads_kv,
                                            pp.head_dim_v, es, appending));
  views->push_back(jfa::detail::packed_view("kv->k_new", kv.k_new, kv.total_new, pp.heads_kv,
                                            pp.head_dim, es, false));
  views->push_back(jfa::detail::packed_view("kv->v_new", kv.v_new, kv.total_new, pp.heads_kv,
                                            pp.head_dim_v, es, false));
  views->push_back(jfa::detail::array_view("kv->cu_seqlens_new", kv.cu_seqlens_new,
                                           appending ? pp.batch + 1 : 0, sizeof(int32_t), false));
  views->push_back(jfa::detail::array_view(
      "kv->block_table", kv.block_table, pp.batch * kv.max_pages_per_seq, sizeof(int32_t), false));
  views->push_back(
      jfa::detail::array_view("kv->seqused_k", kv.seqused_k, pp.batch, sizeof(int32_t), false));
}

// The outputs must not share memory with the cache, nor (when appending) the cache with anything
// else (the packed call sees only the copy); the packed call's host checks, passed before the
// append writes.
jfa_status check_outputs_apart_from_cache(const jfa_attention_params& packed,
                                          const jfa_paged_kv& kv) {
  jfa::detail::Params pp;
  if (const jfa_status s = jfa::detail::build_params(&packed, &pp); s != JFA_SUCCESS) return s;
  std::vector<BufferView> views = jfa::detail::forward_buffers(pp);
  add_cache_views(pp, kv, &views);
  jfa::detail::MemoryKind kind;
  jfa_status s;
  if ((s = jfa::detail::check_call_buffers(views, &kind)) != JFA_SUCCESS) return s;
  // What the packed call checks on the host, before the append writes anything.
  if ((s = jfa::detail::validate_host_offsets(pp)) != JFA_SUCCESS) return s;
  return jfa::detail::validate_host_sinks(pp);
}

// The checks and the gather that both entries share; *packed is ready for the packed call.
jfa_status prepare(const jfa_attention_params* params, const jfa_paged_kv* kv, GatheredKv* g,
                   jfa_attention_params* packed, bool outputs) {
  jfa_attention_params p;
  jfa_status s;
  if ((s = read_paged_params(params, &p)) != JFA_SUCCESS) return s;
  if ((s = check_cache_fields(kv, p)) != JFA_SUCCESS) return s;
  if ((s = check_host_cache(*kv)) != JFA_SUCCESS) return s;
  // Aligned before anything is read through them.
  if ((s = jfa::detail::check_aligned("kv->block_table", kv->block_table, sizeof(int32_t))) !=
          JFA_SUCCESS ||
      (s = jfa::detail::check_aligned("kv->seqused_k", kv->seqused_k, sizeof(int32_t))) !=
          JFA_SUCCESS)
    return s;
  if ((s = gather(*kv, p, g)) != JFA_SUCCESS) return s;
  *packed = packed_params(p, *g);
  return outputs ? check_outputs_apart_from_cache(*packed, *kv) : JFA_SUCCESS;
}

// The fields the size query reads, checked as the forward checks them (no pointer: the query may
// come before the buffers exist).
jfa_status check_query_fields(const jfa_attention_params& p) {
  if (const jfa_status s = jfa::detail::check_batch_and_total_q(p.batch, p.total_q);
      s != JFA_SUCCESS)
    return s;
  if (p.heads_q <= 0 || p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "heads_q and heads_kv must be > 0, heads_q a multiple of heads_kv (GQA/MQA), got "
                "heads_q=%d heads_kv=%d",
                p.heads_q, p.heads_kv);
  if (p.head_dim <= 0 || p.head_dim_v < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "head_dim must be > 0 and head_dim_v >= 0 (0 for head_dim), got %d and %d",
                p.head_dim, p.head_dim_v);
  const int32_t dtype = jfa::detail::enum_bits(p.dtype);
  if (dtype != JFA_DTYPE_FLOAT16 && dtype != JFA_DTYPE_BFLOAT16 && dtype != JFA_DTYPE_FLOAT32)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "dtype %d is not a jfa_dtype (float16=0, bfloat16=1, float32=2)", dtype);
  const int32_t backend = jfa::detail::enum_bits(p.backend);
  if (backend != JFA_BACKEND_AUTO && backend != JFA_BACKEND_CPU && backend != JFA_BACKEND_CUDA)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "backend %d is not a jfa_backend (auto=0, cpu=1, cuda=2)", backend);
  if (p.max_seqlen_q < 0 || p.max_seqlen_k < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "max_seqlen_q and max_seqlen_k must be >= 0 (0 = unknown), got %d and %d",
                p.max_seqlen_q, p.max_seqlen_k);
  if (p.window_left < -1 || p.window_right < -1)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "window_left and window_right must be >= 0, or -1 for unbounded, got "
                "window_left=%d window_right=%d",
                p.window_left, p.window_right);
  return JFA_SUCCESS;
}

// Whether the call goes to the CPU backend (host memory): backend=cpu, or auto with its buffers in
// host memory, as the forward resolves it (a call with no buffer given resolves to the host too).
bool host_call(const jfa_attention_params& p, const jfa_paged_kv& kv) {
  const int32_t backend = jfa::detail::enum_bits(p.backend);
  if (backend != JFA_BACKEND_AUTO) return backend == JFA_BACKEND_CPU;
  if (cache_on_device(kv)) return false;
  for (const void* ptr :
       {p.q, static_cast<const void*>(p.out), static_cast<const void*>(p.cu_seqlens_q)})
    if (ptr != nullptr && jfa::detail::memory_kind(ptr) == jfa::detail::MemoryKind::kDevice)
      return false;
  return true;
}

#ifdef JFA_WITH_CUDA
// The CUDA route: the packed forward's checks of params with no packed keys (cu_seqlens_q stands
// in for cu_seqlens_k, which they require and the kernels never read), every buffer of the call
// and the cache's on the device and apart from the outputs, then the current device's backend.
// seqused_k and the block table are device memory, never read here (the checked mode checks them).
jfa_status forward_paged_cuda(const jfa_attention_params& p, const jfa_paged_kv& kv) {
  jfa_attention_params with_offsets = p;
  with_offsets.cu_seqlens_k = p.cu_seqlens_q;
  jfa::detail::Params pp;
  jfa_status s;
  if ((s = jfa::detail::build_params(&with_offsets, &pp)) != JFA_SUCCESS) return s;
  pp.cu_seqlens_k = nullptr;
  std::vector<BufferView> views = jfa::detail::forward_buffers(pp);
  add_cache_views(pp, kv, &views);
  jfa::detail::MemoryKind kind;
  if ((s = jfa::detail::check_call_buffers(views, &kind)) != JFA_SUCCESS) return s;
  const jfa_backend backend = jfa::detail::resolve_backend(p.backend, kind);
  if ((s = jfa::detail::check_backend_side(backend, kind)) != JFA_SUCCESS) return s;
  const jfa::cuda::GpuBackend* gpu = nullptr;
  if ((s = jfa::cuda::current_gpu_backend(&gpu)) != JFA_SUCCESS) return s;
  if (gpu->paged_forward == nullptr)
    return fail(JFA_ERROR_UNSUPPORTED, "the %s kernels of this build take no paged KV cache",
                gpu->name);
  return gpu->paged_forward(pp, kv);
}
#endif

}  // namespace

extern "C" {

jfa_status jfa_paged_kv_init_sized(jfa_paged_kv* kv, size_t struct_size) {
  if (kv == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "kv must not be NULL");
  if (struct_size != sizeof(jfa_paged_kv))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "struct_size %zu is not the size of jfa_paged_kv this libjfa knows (%zu)",
                struct_size, sizeof(jfa_paged_kv));
  std::memset(kv, 0, sizeof *kv);
  kv->struct_size = sizeof(jfa_paged_kv);
  jfa::detail::clear_error();
  return JFA_SUCCESS;
}

jfa_status jfa_attention_forward_paged(const jfa_attention_params* params, const jfa_paged_kv* kv) {
  return guarded([&] {
    jfa_attention_params p;
    jfa_status s;
    if ((s = read_paged_params(params, &p)) != JFA_SUCCESS) return s;
    if ((s = check_cache_fields(kv, p)) != JFA_SUCCESS) return s;
    if (cache_on_device(*kv) || p.backend == JFA_BACKEND_CUDA) {
#ifdef JFA_WITH_CUDA
      return forward_paged_cuda(p, *kv);
#else
      // The packed forward's answer to backend=cuda without CUDA (no pointer reads as device).
      return jfa::detail::check_backend_side(JFA_BACKEND_CUDA, jfa::detail::MemoryKind::kHost);
#endif
    }
    GatheredKv g;
    jfa_attention_params packed;
    if ((s = prepare(params, kv, &g, &packed, true)) != JFA_SUCCESS) return s;
    if (kv->k_new != nullptr) write_appended(*kv, packed);
    return jfa_attention_forward(&packed);
  });
}

jfa_status jfa_attention_paged_workspace_size(const jfa_attention_params* params,
                                              const jfa_paged_kv* kv, size_t* bytes) {
  return guarded([&] {
    jfa_attention_params p;
    jfa_status s;
    if ((s = read_paged_params(params, &p)) != JFA_SUCCESS) return s;
    if (kv == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "kv must not be NULL");
    if (kv->struct_size != sizeof(jfa_paged_kv))
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "kv->struct_size is %u, not %zu: fill the struct with jfa_paged_kv_init() first",
                  kv->struct_size, sizeof(jfa_paged_kv));
    if (bytes == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "bytes must not be NULL");
    if ((s = check_query_fields(p)) != JFA_SUCCESS) return s;
    *bytes = 0;
    if (host_call(p, *kv)) return JFA_SUCCESS;  // the CPU backend's copies are host memory
#ifdef JFA_WITH_CUDA
    jfa::detail::Params shape{};
    shape.batch = p.batch;
    shape.total_q = p.total_q;
    shape.heads_q = p.heads_q;
    shape.heads_kv = p.heads_kv;
    shape.head_dim = p.head_dim;
    shape.head_dim_v = p.head_dim_v == 0 ? p.head_dim : p.head_dim_v;
    shape.dtype = p.dtype;
    shape.causal = p.causal != 0;
    shape.window = jfa::detail::resolve_window(shape.causal, p.window_left, p.window_right);
    shape.max_seqlen_q = p.max_seqlen_q;
    shape.max_seqlen_k = p.max_seqlen_k;
    return jfa::cuda::paged_workspace_bytes(shape, bytes);
#else
    return JFA_SUCCESS;
#endif
  });
}

jfa_status jfa_attention_reference_paged(const jfa_attention_params* params, const jfa_paged_kv* kv,
                                         const int64_t* q_tokens, int64_t n_tokens, double* out,
                                         double* lse) {
  return guarded([&] {
    GatheredKv g;
    jfa_attention_params packed;
    if (const jfa_status s = prepare(params, kv, &g, &packed, false); s != JFA_SUCCESS) return s;
    return jfa_attention_reference(&packed, q_tokens, n_tokens, out, lse);
  });
}

}  // extern "C"

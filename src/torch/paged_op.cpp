// torch.ops.jfa.paged_attention: the forward over a paged KV cache (jfa_attention_forward_paged)
// for CPU and CUDA tensors. Its checks are those of jfa._torch_checks.check_paged_inputs, in the
// same order and with the same messages, so both kinds of op reject a call alike.
#include <cstdint>
#include <limits>
#include <string>

#include "torch/op_support.hpp"
#include "torch/ops.hpp"

namespace jfa::torch_ops {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string str(int64_t value) { return std::to_string(value); }

// An int32 tensor of `dims` (1 or 2) dimensions on `device`, dense as the C ABI reads it: a copy in
// stream order where strided (as the offsets; no host synchronization).
Tensor dense_int32(const char* name, const char* shape, const Tensor& t, int64_t dims,
                   DeviceId device) {
  if (dtype_of(t) != aoti_torch_dtype_int32())
    raise("TypeError", std::string(name) + " must be an int32 tensor " + shape + ", got " +
                           dtype_string(dtype_of(t)));
  if (t.dim() != dims)
    raise("ValueError", std::string(name) + " must be " + str(dims) + "-D " + shape +
                            ", got shape " + shape_string(t));
  check_on_device(name, t, device);
  if (t.is_contiguous()) return t;
  Tensor copy = dims == 1 ? empty({t.size(0)}, aoti_torch_dtype_int32(), device)
                          : empty({t.size(0), t.size(1)}, aoti_torch_dtype_int32(), device);
  check_shim(aoti_torch_copy_(copy.get(), t.get(), 0), name);
  return copy;
}

// k_new or v_new: [total_new, heads_kv, cols], q's dtype and device, packed.
void check_new_rows(const char* name, const Tensor& t, const Tensor& q, int64_t heads_kv,
                    int64_t cols) {
  if (t.dim() != 3 || t.size(1) != heads_kv || t.size(2) != cols)
    raise("ValueError", std::string(name) + " must have shape [total_new, " + str(heads_kv) + ", " +
                            str(cols) + "], got " + shape_string(t));
  if (dtype_of(t) != dtype_of(q))
    raise("TypeError", std::string(name) + " must have the dtype of q (" +
                           dtype_string(dtype_of(q)) + "), got " + dtype_string(dtype_of(t)));
  check_on_device(name, t, device_of(q));
  if (!t.is_contiguous())
    raise("ValueError", std::string(name) +
                            " must be contiguous (the new rows are read packed); call "
                            ".contiguous() on it");
}

// A pointer for a buffer the call may not read: an empty tensor's is NULL, which the C ABI takes
// for "absent" (no append, no block table), so such a tensor lends the data of a one-element
// stand-in instead.
void* data_or_stand_in(const Tensor& t, Tensor& stand_in, int32_t dtype, DeviceId device) {
  if (t.numel() > 0) return t.data_ptr();
  stand_in = empty({1}, dtype, device);
  return stand_in.data_ptr();
}

// The checks of the tensors, metadata only (libjfa checks the values: page indices, lengths,
// offsets). Returns the dense block table, seqused_k and cu_seqlens_q.
struct PagedTensors {
  Tensor table, used, cu_q;
};

PagedTensors check_paged_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor& block_table, const Tensor& seqused_k,
                                const Tensor& cu_seqlens_q) {
  if (q.dim() != 3)
    raise("ValueError",
          "q must have 3 dimensions [total_q, heads_q, head_dim], got shape " + shape_string(q));
  if (k_cache.dim() != 4)
    raise("ValueError",
          "k_cache must have 4 dimensions [num_pages, page_size, heads_kv, head_dim], got shape " +
              shape_string(k_cache));
  if (v_cache.dim() != 4)
    raise("ValueError",
          "v_cache must have 4 dimensions [num_pages, page_size, heads_kv, head_dim_v], got "
          "shape " +
              shape_string(v_cache));
  for (int i = 0; i < 3; ++i)
    if (v_cache.size(i) != k_cache.size(i))
      raise("ValueError",
            "v_cache must have the shape of k_cache but for its last dimension [num_pages, "
            "page_size, heads_kv, head_dim_v], got k_cache " +
                shape_string(k_cache) + " and v_cache " + shape_string(v_cache));
  const int64_t heads_q = q.size(1), d = q.size(2), page_size = k_cache.size(1);
  const int64_t heads_kv = k_cache.size(2), d_v = v_cache.size(3);
  if (k_cache.size(3) != d)
    raise("ValueError", "q and k_cache must have the same head_dim (last dimension), got q " +
                            str(d) + " and k_cache " + str(k_cache.size(3)));
  if (heads_q < 1 || heads_kv < 1)
    raise("ValueError", "heads must be >= 1, got heads_q=" + str(heads_q) +
                            " (q) and heads_kv=" + str(heads_kv) + " (k_cache, v_cache)");
  if (heads_q % heads_kv != 0)
    raise("ValueError",
          "the heads of q must be a multiple of the heads of the caches (GQA/MQA), got heads_q=" +
              str(heads_q) + " and heads_kv=" + str(heads_kv));
  if (d < 1) raise("ValueError", "head_dim must be >= 1, got " + str(d));
  if (d_v < 1)
    raise("ValueError", "the head_dim of v_cache (head_dim_v) must be >= 1, got " + str(d_v));
  if (page_size < 1 || page_size > kInt32Max)
    raise("ValueError",
          "page_size (dimension 1 of the caches) must be in [1, 2^31 - 1], got " + str(page_size));

  const int32_t dtype = dtype_of(q);
  jfa_dtype_of(dtype);  // raises for a dtype the library does not take
  const char* cache_names[] = {"k_cache", "v_cache"};
  const Tensor* caches[] = {&k_cache, &v_cache};
  for (int i = 0; i < 2; ++i)
    if (dtype_of(*caches[i]) != dtype)
      raise("TypeError", std::string("q, k_cache and v_cache must have the same dtype, got q ") +
                             dtype_string(dtype) + " and " + cache_names[i] + " " +
                             dtype_string(dtype_of(*caches[i])));
  const DeviceId device = device_of(q);
  const DeviceId dk = device_of(k_cache), dv = device_of(v_cache);
  if (!(dk == device) || !(dv == device))
    raise("ValueError", "q, k_cache and v_cache must be on the same device, got q on " +
                            device_string(device) + ", k_cache on " + device_string(dk) +
                            ", v_cache on " + device_string(dv));
  if (device.type != aoti_torch_device_type_cuda() && device.type != aoti_torch_device_type_cpu())
    raise("ValueError", "q, k_cache and v_cache must be CPU or CUDA tensors, got device " +
                            device_string(device));
  // No copy here: an append must land in the caller's cache.
  for (int i = 0; i < 2; ++i)
    if (!caches[i]->is_contiguous())
      raise("ValueError", std::string(cache_names[i]) +
                              " must be contiguous (its pages are addressed packed, and appended "
                              "to in place: pass the cache itself, not a copy)");
  layout_of("q", q);

  PagedTensors t;
  t.table = dense_int32("block_table", "[batch, max_pages_per_seq]", block_table, 2, device);
  if (t.table.size(1) > kInt32Max)
    raise("ValueError", "block_table must have at most 2^31 - 1 columns (max_pages_per_seq), got " +
                            str(t.table.size(1)));
  t.used = dense_int32("seqused_k", "[batch]", seqused_k, 1, device);
  t.cu_q = dense_offsets("cu_seqlens_q", cu_seqlens_q, device);
  if (t.cu_q.size(0) < 1)
    raise("ValueError",
          "cu_seqlens_q must hold batch + 1 >= 1 offsets, got " + str(t.cu_q.size(0)) + " entries");
  const int64_t batch = t.cu_q.size(0) - 1;
  if (t.table.size(0) != batch || t.used.size(0) != batch)
    raise("ValueError", "block_table has " + str(t.table.size(0)) + " rows and seqused_k " +
                            str(t.used.size(0)) + " entries, but cu_seqlens_q describes " +
                            str(batch) + " sequences");
  return t;
}

}  // namespace

std::tuple<Tensor, Tensor> paged_attention(
    Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seqused_k,
    Tensor cu_seqlens_q, std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,
    bool causal, std::optional<double> softmax_scale, bool return_lse,
    std::optional<Tensor> device_check, int64_t window_left, int64_t window_right, double softcap,
    std::optional<Tensor> sinks, std::optional<Tensor> k_new, std::optional<Tensor> v_new,
    std::optional<Tensor> cu_seqlens_new) {
  const PagedTensors t =
      check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q);
  const int64_t total_q = q.size(0), heads_q = q.size(1), d = q.size(2);
  const int64_t heads_kv = k_cache.size(2), d_v = v_cache.size(3);
  const DeviceId device = device_of(q);
  const int32_t dtype = dtype_of(q);
  const bool appending = k_new.has_value();
  if (appending != v_new.has_value() || appending != cu_seqlens_new.has_value())
    raise("ValueError", "k_new, v_new and cu_seqlens_new go together (an append), or none");
  Tensor cu_new;
  if (appending) {
    check_new_rows("k_new", *k_new, q, heads_kv, d);
    check_new_rows("v_new", *v_new, q, heads_kv, d_v);
    if (k_new->size(0) != v_new->size(0))
      raise("ValueError", "k_new and v_new must have the same number of rows (total_new), got " +
                              str(k_new->size(0)) + " and " + str(v_new->size(0)));
    cu_new = dense_offsets("cu_seqlens_new", *cu_seqlens_new, device);
    if (cu_new.size(0) != t.cu_q.size(0))
      raise("ValueError",
            "cu_seqlens_q and cu_seqlens_new must have the same length (batch + 1), got " +
                str(t.cu_q.size(0)) + " and " + str(cu_new.size(0)));
  }

  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.device_check = device_check_word(device_check, device);
  set_scores(p, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right,
             softcap, sinks, heads_q, device);
  p.q = q.data_ptr();
  p.q_layout = layout_of("q", q);
  p.cu_seqlens_q = static_cast<const int32_t*>(t.cu_q.data_ptr());
  p.batch = t.cu_q.size(0) - 1;
  p.total_q = total_q;
  p.heads_q = static_cast<int32_t>(heads_q);
  p.heads_kv = static_cast<int32_t>(heads_kv);
  p.head_dim = static_cast<int32_t>(d);
  p.head_dim_v = static_cast<int32_t>(d_v);
  p.dtype = jfa_dtype_of(dtype);
  const bool on_cuda = device.type == aoti_torch_device_type_cuda();
  p.backend = on_cuda ? JFA_BACKEND_CUDA : JFA_BACKEND_CPU;

  jfa_paged_kv kv;
  jfa_paged_kv_init(&kv);
  kv.k_cache = k_cache.data_ptr();
  kv.v_cache = v_cache.data_ptr();
  kv.num_pages = k_cache.size(0);
  kv.page_size = static_cast<int32_t>(k_cache.size(1));
  kv.max_pages_per_seq = static_cast<int32_t>(t.table.size(1));
  Tensor table_stand_in, k_stand_in, v_stand_in;
  // A table of no columns is valid (every sequence empty) but its data is NULL.
  kv.block_table = static_cast<const int32_t*>(
      data_or_stand_in(t.table, table_stand_in, aoti_torch_dtype_int32(), device));
  kv.seqused_k = static_cast<const int32_t*>(t.used.data_ptr());
  if (appending) {
    // An append of no rows still has its offsets checked: NULL k_new would mean no append.
    kv.k_new = data_or_stand_in(*k_new, k_stand_in, dtype, device);
    kv.v_new = data_or_stand_in(*v_new, v_stand_in, dtype, device);
    kv.cu_seqlens_new = static_cast<const int32_t*>(cu_new.data_ptr());
    kv.total_new = k_new->size(0);
  }

  Tensor out = empty({total_q, heads_q, d_v}, dtype, device);
  Tensor lse = return_lse ? empty({heads_q, total_q}, aoti_torch_dtype_float32(), device)
                          : empty({0}, aoti_torch_dtype_float32(), device);
  p.out = out.data_ptr();
  p.lse = return_lse ? static_cast<float*>(lse.data_ptr()) : nullptr;
  p.out_layout = {heads_q * d_v, d_v};
  if (!on_cuda) {
    check_status("jfa_attention_forward_paged", jfa_attention_forward_paged(&p, &kv));
    return {out, lse};
  }
  const CudaDeviceScope scope(device.index);
  p.stream = current_cuda_stream(device.index);
  size_t workspace_bytes = 0;
  check_status("jfa_attention_paged_workspace_size",
               jfa_attention_paged_workspace_size(&p, &kv, &workspace_bytes));
  // From torch's caching allocator, as the packed forward's: no device allocation on a warm path,
  // and inside a captured graph the graph's pool holds it.
  const Tensor workspace =
      empty({static_cast<int64_t>(workspace_bytes)}, aoti_torch_dtype_uint8(), device);
  p.workspace = workspace_bytes > 0 ? workspace.data_ptr() : nullptr;
  p.workspace_bytes = workspace_bytes;
  check_status("jfa_attention_forward_paged", jfa_attention_forward_paged(&p, &kv));
  return {out, lse};
}

}  // namespace jfa::torch_ops

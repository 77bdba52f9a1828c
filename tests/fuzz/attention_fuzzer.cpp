// libFuzzer harness of the C ABI on the CPU backend (built with ASan and UBSan, preset `fuzz`):
// random parameters, offsets, strides, sizes and enum values, including invalid ones, into
// jfa_attention_forward, jfa_attention_backward, jfa_attention_reference, the workspace queries,
// the jagged utilities and jfa_attention_forward_paged. Buffers are allocated exactly as large as
// the parameters describe, so any access outside them is caught. Beyond "no crash, no undefined
// behaviour" it checks:
// - every call returns a jfa_status that is one of the enumerators;
// - a rejected forward writes nothing (the output keeps its poison), unless it failed while
//   computing (scores beyond float32), which leaves the outputs unspecified;
// - an accepted forward on moderate inputs writes every output element, all finite;
// - the jagged utilities in place or on overlapping buffers: lengths_to_offsets in place gives what
//   it gives into a separate buffer, any other overlap (and a misaligned buffer) is rejected with
//   nothing written;
// - packed tensors whose sizes reach beyond int64 are rejected before any buffer is read.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "jfa/jfa.h"

namespace {

constexpr int64_t kMaxElements = 1 << 18;  // per buffer, to keep one input fast

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s (last message: %s)\n", what,
                 jfa_last_error_message());
    std::abort();
  }
}

bool valid_status(jfa_status s) {
  int32_t bits;
  std::memcpy(&bits, &s, sizeof bits);
  return bits >= JFA_SUCCESS && bits <= JFA_ERROR_INTERNAL;
}

// Every element a [total, heads, d] tensor with layout l (0 strides: packed) describes in `buffer`
// is finite (float32, or bf16 as the top half of a float); the poison (all ones) is a NaN.
void require_finite(const std::vector<unsigned char>& buffer, size_t es, int64_t total,
                    int32_t heads, int32_t d, jfa_tensor_layout l, const char* what) {
  const int64_t ts = l.token_stride ? l.token_stride : int64_t{heads} * d;
  const int64_t hs = l.head_stride ? l.head_stride : d;
  for (int64_t t = 0; t < total; ++t)
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t j = 0; j < d; ++j) {
        uint32_t bits = 0;
        std::memcpy(&bits, &buffer[(t * ts + h * hs + j) * es], es);
        if (es == 2) bits <<= 16;
        float x;
        std::memcpy(&x, &bits, 4);
        require(std::isfinite(x), what);
      }
}

// A failure found while computing (scores beyond float32), after which the outputs are unspecified,
// unlike a rejected call, which writes nothing.
bool failed_while_computing(jfa_status s) {
  return s == JFA_ERROR_UNSUPPORTED &&
         std::strstr(jfa_last_error_message(), "not finite in float32") != nullptr;
}

// An int32 enum field set to any value, as a C caller may.
template <typename Enum>
void set_enum(Enum* field, int32_t value) {
  std::memcpy(field, &value, sizeof value);
}

// Elements a [total, heads, d] tensor with these strides spans (0 when the layout is invalid or
// the span is too large to allocate here).
int64_t span_elements(int64_t total, int32_t heads, int32_t d, jfa_tensor_layout l) {
  if (total <= 0 || heads <= 0 || d <= 0) return 0;
  int64_t ts = l.token_stride, hs = l.head_stride;
  if (ts == 0 && hs == 0) {
    hs = d;
    ts = int64_t{heads} * d;
  }
  if (ts <= 0 || hs <= 0 || ts > kMaxElements || hs > kMaxElements) return 0;
  const __int128 reach = (__int128{total} - 1) * ts + (__int128{heads} - 1) * hs + d;
  return reach > kMaxElements ? 0 : static_cast<int64_t>(reach);
}

std::vector<int32_t> make_offsets(FuzzedDataProvider& in, int64_t batch, int64_t* total) {
  std::vector<int32_t> cu(static_cast<size_t>(batch) + 1, 0);
  const bool garbage = in.ConsumeBool() && in.ConsumeBool();  // a quarter: any values
  for (int64_t b = 1; b <= batch; ++b) {
    cu[b] = garbage ? in.ConsumeIntegral<int32_t>()
                    : cu[b - 1] + in.ConsumeIntegralInRange<int32_t>(0, 48);
  }
  *total = garbage && in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 300) : cu[batch];
  return cu;
}

jfa_tensor_layout make_layout(FuzzedDataProvider& in, int32_t heads, int32_t d) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return {0, 0};  // packed
    case 1:
      return {int64_t{heads} * d + in.ConsumeIntegralInRange<int>(0, 16),
              d + in.ConsumeIntegralInRange<int>(0, 4)};  // padded rows
    case 2:
      return {d, int64_t{d} * in.ConsumeIntegralInRange<int>(1, 64)};  // heads outermost
    default:
      return {in.ConsumeIntegralInRange<int64_t>(-8, 4096),
              in.ConsumeIntegralInRange<int64_t>(-8, 512)};
  }
}

void fuzz_attention(FuzzedDataProvider& in) {
  jfa_attention_params p;
  require(jfa_attention_params_init(&p) == JFA_SUCCESS, "init");
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(in.ConsumeBool() ? -2 : 0, 6);
  const int64_t offsets_count = batch >= 0 ? batch : 0;
  int64_t total_q = 0, total_k = 0;
  const std::vector<int32_t> cu_q = make_offsets(in, offsets_count, &total_q);
  std::vector<int32_t> cu_k;
  if (in.ConsumeBool()) {
    cu_k = cu_q;  // self-attention
    total_k = total_q;
  } else {
    cu_k = make_offsets(in, offsets_count, &total_k);
  }
  const int32_t heads_kv = in.ConsumeIntegralInRange<int32_t>(in.ConsumeBool() ? -1 : 1, 3);
  const int32_t heads_q = in.ConsumeBool() ? heads_kv * in.ConsumeIntegralInRange<int32_t>(1, 3)
                                           : in.ConsumeIntegralInRange<int32_t>(0, 6);
  const int32_t d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 40)
                                     : in.ConsumeIntegralInRange<int32_t>(-2, 600);
  // The value head size: mostly the default (0, head_dim), sometimes its own, small or wild.
  const int32_t head_dim_v = in.ConsumeIntegralInRange<int>(0, 3) != 0 ? 0
                             : in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 40)
                                                : in.ConsumeIntegralInRange<int32_t>(-2, 600);
  const int32_t dv = head_dim_v == 0 ? d : head_dim_v;  // columns of v, out, dout and dv
  const int32_t dtype =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 2) : in.ConsumeIntegral<int32_t>();
  const jfa_tensor_layout lq = make_layout(in, heads_q, d), lk = make_layout(in, heads_kv, d),
                          lv = make_layout(in, heads_kv, dv), lo = make_layout(in, heads_q, dv);
  const bool moderate = in.ConsumeBool();
  float scale = std::numeric_limits<float>::quiet_NaN();
  if (!moderate && in.ConsumeBool()) scale = in.ConsumeFloatingPoint<float>();
  if (moderate && in.ConsumeBool()) scale = in.ConsumeFloatingPointInRange<float>(-2.f, 2.f);
  const bool with_lse = in.ConsumeBool();

  const size_t es = dtype == JFA_DTYPE_FLOAT32 ? 4 : 2;
  const int64_t nq = span_elements(total_q, heads_q, d, lq);
  const int64_t nk = span_elements(total_k, heads_kv, d, lk);
  const int64_t nv = span_elements(total_k, heads_kv, dv, lv);
  const int64_t no = span_elements(total_q, heads_q, dv, lo);
  const int64_t nlse = total_q > 0 && heads_q > 0 ? total_q * heads_q : 0;
  if (nlse > kMaxElements) return;
  // Inputs: small values (fp16/bf16 bit patterns of moderate numbers, or floats in [-4, 4]).
  auto fill = [&](std::vector<unsigned char>& buf, int64_t n) {
    buf.assign(static_cast<size_t>(n) * es, 0);
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>((i * 2654435761u % 1000) / 125.0 - 4.0);
      if (es == 4) {
        std::memcpy(&buf[i * 4], &x, 4);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        const uint16_t half_like = dtype == JFA_DTYPE_BFLOAT16
                                       ? static_cast<uint16_t>(bits >> 16)
                                       : static_cast<uint16_t>(0x3C00 ^ (i & 0x3FF));
        std::memcpy(&buf[i * 2], &half_like, 2);
      }
    }
  };
  std::vector<unsigned char> q, k, v, out(static_cast<size_t>(no) * es, 0xFF);
  fill(q, nq);
  fill(k, nk);
  fill(v, nv);
  std::vector<float> lse(static_cast<size_t>(nlse), std::numeric_limits<float>::quiet_NaN());

  p.q = nq ? q.data() : nullptr;
  p.k = nk ? k.data() : nullptr;
  p.v = nv ? v.data() : nullptr;
  p.out = no ? out.data() : nullptr;
  p.lse = with_lse && nlse ? lse.data() : nullptr;
  p.cu_seqlens_q = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  p.batch = batch;
  p.total_q = total_q;
  p.total_k = total_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = d;
  p.head_dim_v = head_dim_v;
  set_enum(&p.dtype, dtype);
  p.q_layout = lq;
  p.k_layout = lk;
  p.v_layout = lv;
  p.out_layout = lo;
  p.softmax_scale = scale;
  p.causal = in.ConsumeIntegral<int>();
  // Local attention and score modifiers, mostly off; windows around the lengths drawn, sometimes
  // invalid (< -1), softcaps and sinks sometimes not finite.
  std::vector<float> sinks(static_cast<size_t>(heads_q > 0 ? heads_q : 0));
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    p.window_left = in.ConsumeIntegralInRange<int32_t>(-3, 80);
    p.window_right = in.ConsumeIntegralInRange<int32_t>(-3, 80);
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    p.softcap = in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(0.f, 60.f)
                                 : in.ConsumeFloatingPoint<float>();
  if (!sinks.empty() && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    for (float& x : sinks)
      x = in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(-12.f, 12.f)
                           : in.ConsumeFloatingPoint<float>();
    p.sinks = sinks.data();
  }
  p.max_seqlen_q = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int32_t>(-1, 64);
  p.max_seqlen_k = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int32_t>(-1, 64);
  set_enum(&p.backend,
           in.ConsumeBool() ? JFA_BACKEND_CPU : in.ConsumeIntegralInRange<int32_t>(-1, 3));
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) p.struct_size = in.ConsumeIntegral<uint32_t>();
  // The 0.1.0 layout ends before head_dim_v, which then takes its default, as drawn here.
  if (head_dim_v == 0 && in.ConsumeIntegralInRange<int>(0, 15) == 0)
    p.struct_size = offsetof(jfa_attention_params, head_dim_v);

  // A buffer the parameters describe but that was too large to allocate here: skip the call
  // rather than hand the library a buffer smaller than the parameters say.
  if ((total_q > 0 && heads_q > 0 && ((d > 0 && !nq) || (dv > 0 && !no))) ||
      (total_k > 0 && heads_kv > 0 && ((d > 0 && !nk) || (dv > 0 && !nv))))
    return;

  size_t ws = 0;
  require(valid_status(jfa_attention_workspace_size(&p, &ws)), "workspace_size status");
  const jfa_status s = jfa_attention_forward(&p);
  require(valid_status(s), "forward status");
  const bool rejected = s != JFA_SUCCESS && !failed_while_computing(s);
  if (rejected) {
    for (unsigned char b : out) require(b == 0xFF, "a rejected call wrote its output");
    for (float x : lse) require(std::isnan(x), "a rejected call wrote the LSE");
  } else if (s == JFA_SUCCESS && moderate && dtype != JFA_DTYPE_FLOAT16) {
    // float32 and bf16 inputs here are all in [-4, 4]: every output element is finite (the
    // poison, all ones, is a NaN in both).
    require_finite(out, es, total_q, heads_q, dv, lo,
                   "an accepted call left an output element unwritten or NaN");
  }
  // The backward on the forward's result (or on a rejected one: then it must reject too): gradient
  // buffers as large as q, k, v and out are described, dlse sometimes, poison checked after a
  // rejection; an accepted call on moderate float32/bf16 inputs gives finite dq.
  if (in.ConsumeBool()) {
    jfa_attention_backward_params b;
    require(jfa_attention_backward_params_init(&b) == JFA_SUCCESS, "backward init");
    b.forward = p;
    std::vector<unsigned char> dout(out.size()), dq(static_cast<size_t>(nq) * es, 0xFF),
        dk(static_cast<size_t>(nk) * es, 0xFF), dv(static_cast<size_t>(nv) * es, 0xFF);
    fill(dout, no);
    b.dout = no ? dout.data() : nullptr;
    b.dq = nq ? dq.data() : nullptr;
    b.dk = nk ? dk.data() : nullptr;
    b.dv = nv ? dv.data() : nullptr;
    b.dout_layout = lo;
    b.dq_layout = lq;
    b.dk_layout = lk;
    b.dv_layout = lv;
    std::vector<float> dlse(static_cast<size_t>(nlse), 0.5f);
    b.dlse = nlse && in.ConsumeBool() ? dlse.data() : nullptr;
    b.deterministic = in.ConsumeIntegral<int>();
    std::vector<float> dsinks(sinks.size(), std::numeric_limits<float>::quiet_NaN());
    if (!dsinks.empty() && in.ConsumeBool()) b.dsinks = dsinks.data();
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0) b.struct_size = in.ConsumeIntegral<uint32_t>();
    size_t bws = 0;
    require(valid_status(jfa_attention_backward_workspace_size(&b, &bws)),
            "backward workspace_size status");
    const jfa_status bs = jfa_attention_backward(&b);
    require(valid_status(bs), "backward status");
    require(!rejected || bs != JFA_SUCCESS, "a backward of a rejected forward ran");
    if (bs != JFA_SUCCESS && !failed_while_computing(bs)) {
      for (auto* g : {&dq, &dk, &dv})
        for (unsigned char c : *g) require(c == 0xFF, "a rejected backward wrote a gradient");
      for (float x : dsinks) require(std::isnan(x), "a rejected backward wrote dsinks");
    } else if (bs == JFA_SUCCESS && moderate && dtype != JFA_DTYPE_FLOAT16) {
      require_finite(dq, es, total_q, heads_q, d, lq,
                     "an accepted backward left dq unwritten or NaN");
    }
  }
  // The float64 reference on a few rows when the problem is small.
  if (total_q > 0 && total_k >= 0 && heads_q > 0 && d > 0 && dv > 0 && total_q <= 256 &&
      total_k <= 256 && total_q * (total_k + 1) * heads_q * (d + dv) < (1 << 16)) {
    const int64_t n = in.ConsumeIntegralInRange<int64_t>(-1, 3);
    std::vector<int64_t> tokens(static_cast<size_t>(n > 0 ? n : 0));
    for (int64_t& t : tokens) t = in.ConsumeIntegralInRange<int64_t>(-1, total_q);
    const int64_t rows = n > 0 ? n : total_q;
    std::vector<double> ref(static_cast<size_t>(rows * heads_q * dv + 1));
    std::vector<double> ref_lse(static_cast<size_t>(rows * heads_q + 1));
    require(valid_status(jfa_attention_reference(&p, n > 0 ? tokens.data() : nullptr,
                                                 n > 0 ? n : total_q, ref.data(), ref_lse.data())),
            "reference status");
  }
}

void fuzz_jagged_utils(FuzzedDataProvider& in) {
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(-1, 5);
  int64_t total = 0;
  std::vector<int32_t> cu = make_offsets(in, batch >= 0 ? batch : 0, &total);
  const int64_t row = in.ConsumeIntegralInRange<int64_t>(-1, 8);
  const int32_t max_len = in.ConsumeIntegralInRange<int32_t>(-1, 64);
  // Enums passed by value hold their enumerators here: in C++ the call itself would load an
  // invalid one (C callers can pass any int; the unit tests cover that through an int signature).
  const jfa_dtype dtype = static_cast<jfa_dtype>(in.ConsumeIntegralInRange<int32_t>(0, 2));
  int32_t m = 0;
  require(valid_status(jfa_validate_offsets(cu.data(), batch, total)), "validate status");
  require(valid_status(jfa_max_length(cu.data(), batch, &m)), "max_length status");
  // Buffers as large as the description, when it is small enough; else nothing is called.
  const int64_t n = cu.empty() ? 0 : cu.back();
  if (n < 0 || n > 4096 || row < 0 || max_len < 0 || batch < 0) return;
  std::vector<unsigned char> jagged(static_cast<size_t>(n * row * 4 + 1));
  std::vector<unsigned char> padded(static_cast<size_t>(batch * max_len * row * 4 + 1));
  require(valid_status(jfa_jagged_to_padded(jagged.data(), cu.data(), batch, row, dtype, max_len,
                                            in.ConsumeFloatingPoint<double>(), padded.data())),
          "jagged_to_padded status");
  require(valid_status(jfa_padded_to_jagged(padded.data(), cu.data(), batch, row, dtype, max_len,
                                            jagged.data())),
          "padded_to_jagged status");
}

// jfa_lengths_to_offsets in place (offsets == lengths) gives what it gives into its own buffer;
// an output overlapping the lengths otherwise is rejected with nothing written.
void fuzz_lengths_aliasing(FuzzedDataProvider& in) {
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 8);
  // The lengths at arena[1 ..], the output at arena[1 + shift ..] (batch + 1 entries).
  std::vector<int32_t> arena(static_cast<size_t>(batch) + 3, -7);
  for (int64_t b = 0; b < batch; ++b)
    arena[1 + b] = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 100)
                                    : in.ConsumeIntegral<int32_t>();
  const int shift = in.ConsumeIntegralInRange<int>(-1, 1);
  std::vector<int32_t> expected(static_cast<size_t>(batch) + 1, -7);
  const jfa_status apart = jfa_lengths_to_offsets(arena.data() + 1, batch, expected.data());
  require(valid_status(apart), "lengths_to_offsets status");
  const std::vector<int32_t> before = arena;
  const jfa_status s = jfa_lengths_to_offsets(arena.data() + 1, batch, arena.data() + 1 + shift);
  require(valid_status(s), "lengths_to_offsets in place status");
  // Lengths [1, 1 + batch) and offsets [1 + shift, 2 + shift + batch) of the arena.
  const bool overlap = shift != 0 && batch > 0 && shift < batch;
  if (overlap) {
    require(s == JFA_ERROR_INVALID_ARGUMENT, "overlapping lengths and offsets accepted");
  } else {
    require(s == apart, "lengths_to_offsets in place differs in status");
  }
  if (s != JFA_SUCCESS) {
    require(arena == before, "a rejected lengths_to_offsets wrote its output");
    return;
  }
  require(std::equal(expected.begin(), expected.end(), arena.begin() + 1 + shift),
          "lengths_to_offsets in place differs from the copy");
}

// The jagged <-> padded copies with both buffers placed anywhere in one arena: overlapping or
// misaligned buffers are rejected with nothing written; otherwise the call writes exactly what it
// writes into separate buffers.
void fuzz_copy_aliasing(FuzzedDataProvider& in) {
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 4);
  std::vector<int32_t> lengths(static_cast<size_t>(batch));
  int32_t longest = 0;
  for (int32_t& l : lengths) {
    l = in.ConsumeIntegralInRange<int32_t>(0, 6);
    longest = std::max(longest, l);
  }
  std::vector<int32_t> cu(static_cast<size_t>(batch) + 1);
  require(jfa_lengths_to_offsets(lengths.data(), batch, cu.data()) == JFA_SUCCESS,
          "lengths_to_offsets of valid lengths");
  const int64_t row = in.ConsumeIntegralInRange<int64_t>(0, 4);
  const int32_t max_len = longest + in.ConsumeIntegralInRange<int32_t>(0, 2);
  const jfa_dtype dtype = static_cast<jfa_dtype>(in.ConsumeIntegralInRange<int32_t>(0, 2));
  const double padding = in.ConsumeIntegralInRange<int32_t>(-4, 4) / 2.0;
  const bool to_padded = in.ConsumeBool();
  const size_t es = jfa_dtype_size(dtype);
  const size_t jagged_bytes = static_cast<size_t>(cu.back() * row) * es;
  const size_t padded_bytes = static_cast<size_t>(batch * max_len * row) * es;
  std::vector<unsigned char> arena(jagged_bytes + padded_bytes + 16);
  for (size_t i = 0; i < arena.size(); ++i) arena[i] = static_cast<unsigned char>(i * 37 + 11);
  const size_t at_jagged = in.ConsumeIntegralInRange<size_t>(0, arena.size() - jagged_bytes);
  const size_t at_padded = in.ConsumeIntegralInRange<size_t>(0, arena.size() - padded_bytes);
  // The same call on separate copies of the inputs (vector storage is aligned; never NULL).
  std::vector<unsigned char> jagged(arena.begin() + at_jagged,
                                    arena.begin() + at_jagged + jagged_bytes);
  std::vector<unsigned char> padded(arena.begin() + at_padded,
                                    arena.begin() + at_padded + padded_bytes);
  jagged.resize(jagged_bytes + 4);
  padded.resize(padded_bytes + 4);
  auto call = [&](unsigned char* j, unsigned char* p) {
    return to_padded ? jfa_jagged_to_padded(j, cu.data(), batch, row, dtype, max_len, padding, p)
                     : jfa_padded_to_jagged(p, cu.data(), batch, row, dtype, max_len, j);
  };
  require(call(jagged.data(), padded.data()) == JFA_SUCCESS, "a copy between separate buffers");
  const bool overlap = jagged_bytes > 0 && padded_bytes > 0 &&
                       at_jagged < at_padded + padded_bytes && at_padded < at_jagged + jagged_bytes;
  const bool misaligned =
      (jagged_bytes > 0 && at_jagged % es != 0) || (padded_bytes > 0 && at_padded % es != 0);
  std::vector<unsigned char> expected = arena;
  const std::vector<unsigned char>& written = to_padded ? padded : jagged;
  std::copy_n(written.begin(), to_padded ? padded_bytes : jagged_bytes,
              expected.begin() + (to_padded ? at_padded : at_jagged));
  const std::vector<unsigned char> before = arena;
  const jfa_status s = call(arena.data() + at_jagged, arena.data() + at_padded);
  if (overlap || misaligned) {
    require(s == JFA_ERROR_INVALID_ARGUMENT, "overlapping or misaligned copy buffers accepted");
    require(arena == before, "a rejected copy wrote its output");
  } else {
    require(s == JFA_SUCCESS, "a copy between disjoint aligned buffers rejected");
    require(arena == expected, "a copy wrote other than its output");
  }
}

// Packed strides (0, 0) follow from the sizes; sizes whose tensors reach beyond int64 are rejected
// before any buffer is read, so pointers that point nowhere are safe here.
void fuzz_packed_overflow(FuzzedDataProvider& in) {
  const int64_t total_q = in.ConsumeIntegralInRange<int64_t>(0, INT32_MAX);
  const int64_t total_k = in.ConsumeIntegralInRange<int64_t>(0, INT32_MAX);
  const int32_t heads_kv = in.ConsumeIntegralInRange<int32_t>(1, 1 << 24);
  const int32_t heads_q = heads_kv * in.ConsumeIntegralInRange<int32_t>(1, INT32_MAX / heads_kv);
  const int32_t d = in.ConsumeIntegralInRange<int32_t>(1, JFA_MAX_HEAD_DIM);
  auto overflows = [d](int64_t total, int32_t heads) {
    const __int128 elements = __int128{total > 0 ? total : 1} * heads * d;
    return elements > std::numeric_limits<int64_t>::max();
  };
  // A call that validation accepts would read the pointers.
  if (!overflows(total_q, heads_q) && !overflows(total_k, heads_kv)) return;
  void* nowhere = reinterpret_cast<void*>(uintptr_t{1} << 16);
  const int32_t cu_q[2] = {0, static_cast<int32_t>(total_q)};
  const int32_t cu_k[2] = {0, static_cast<int32_t>(total_k)};
  jfa_attention_params p;
  require(jfa_attention_params_init(&p) == JFA_SUCCESS, "init");
  p.q = p.k = p.v = p.out = nowhere;
  p.lse = in.ConsumeBool() ? static_cast<float*>(nowhere) : nullptr;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.batch = 1;
  p.total_q = total_q;
  p.total_k = total_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = d;
  set_enum(&p.dtype, in.ConsumeIntegralInRange<int32_t>(0, 2));
  set_enum(&p.backend, in.ConsumeIntegralInRange<int32_t>(0, 1));
  auto rejected = [](jfa_status s) {
    return s == JFA_ERROR_INVALID_ARGUMENT &&
           std::strstr(jfa_last_error_message(), "strides times sizes overflow int64") != nullptr;
  };
  require(rejected(jfa_attention_forward(&p)), "a forward reaching beyond int64 accepted");
  double row[1];
  require(rejected(jfa_attention_reference(&p, nullptr, total_q, row, nullptr)),
          "a reference reaching beyond int64 accepted");
  jfa_attention_backward_params b;
  require(jfa_attention_backward_params_init(&b) == JFA_SUCCESS, "backward init");
  b.forward = p;
  b.forward.lse = static_cast<float*>(nowhere);
  b.dout = b.dq = b.dk = b.dv = nowhere;
  require(rejected(jfa_attention_backward(&b)), "a backward reaching beyond int64 accepted");
}

// jfa_attention_forward_paged with random caches, block tables (entries in and out of range),
// cache lengths (negative, past the table), page sizes (0 and negative too) and sizes: every
// buffer exactly as large as the fields say; a rejected call writes nothing, an accepted one every
// output element, finite.
void fuzz_paged(FuzzedDataProvider& in) {
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 5);
  const int32_t page_size = in.ConsumeIntegralInRange<int32_t>(-2, 24);
  const int64_t num_pages = in.ConsumeIntegralInRange<int64_t>(-1, 10);
  const int32_t max_pages = in.ConsumeIntegralInRange<int32_t>(-1, 6);
  const int32_t heads_kv = in.ConsumeIntegralInRange<int32_t>(1, 3);
  const int32_t heads_q = heads_kv * in.ConsumeIntegralInRange<int32_t>(1, 3);
  const int32_t d = in.ConsumeIntegralInRange<int32_t>(1, 24);
  const int32_t dv = in.ConsumeBool() ? d : in.ConsumeIntegralInRange<int32_t>(1, 24);
  const bool bf16 = in.ConsumeBool();
  const size_t es = bf16 ? 2 : 4;
  int64_t total_q = 0;
  std::vector<int32_t> cu_q = make_offsets(in, batch, &total_q);
  if (total_q < 0 || total_q > 400) return;
  const int64_t cache_rows = num_pages > 0 && page_size > 0 ? num_pages * page_size : 0;
  std::vector<unsigned char> k_cache(cache_rows * heads_kv * d * es),
      v_cache(cache_rows * heads_kv * dv * es);
  for (size_t i = 0; i < k_cache.size(); ++i) k_cache[i] = static_cast<unsigned char>(i * 37 % 61);
  for (size_t i = 0; i < v_cache.size(); ++i) v_cache[i] = static_cast<unsigned char>(i * 53 % 59);
  std::vector<int32_t> table(static_cast<size_t>(batch * std::max(max_pages, 0)));
  for (int32_t& e : table)
    e = in.ConsumeIntegralInRange<int32_t>(
        -2, static_cast<int32_t>(std::max<int64_t>(num_pages, 0)) + 1);
  std::vector<int32_t> used(static_cast<size_t>(batch));
  for (int32_t& n : used) n = in.ConsumeIntegralInRange<int32_t>(-1, 80);
  std::vector<unsigned char> q(std::max<int64_t>(total_q, 1) * heads_q * d * es, 0x3c);
  std::vector<unsigned char> out(total_q * heads_q * dv * es, 0xFF);
  std::vector<float> lse(total_q * heads_q);
  if (!lse.empty()) std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.q = q.data();
  p.out = out.empty() ? nullptr : out.data();
  p.lse = lse.empty() || in.ConsumeBool() ? nullptr : lse.data();
  p.cu_seqlens_q = cu_q.data();
  p.batch = batch;
  p.total_q = total_q;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = d;
  p.head_dim_v = dv;
  p.dtype = bf16 ? JFA_DTYPE_BFLOAT16 : JFA_DTYPE_FLOAT32;
  p.causal = in.ConsumeBool() ? 1 : 0;
  p.window_left = in.ConsumeIntegralInRange<int32_t>(-1, 30);
  p.backend = JFA_BACKEND_CPU;
  jfa_paged_kv kv;
  require(jfa_paged_kv_init(&kv) == JFA_SUCCESS, "jfa_paged_kv_init");
  kv.k_cache = k_cache.empty() ? nullptr : k_cache.data();
  kv.v_cache = v_cache.empty() ? nullptr : v_cache.data();
  kv.block_table = table.empty() ? nullptr : table.data();
  kv.seqused_k = used.empty() ? nullptr : used.data();
  kv.num_pages = num_pages;
  kv.page_size = page_size;
  kv.max_pages_per_seq = max_pages;
  // Half the time an append of the step's new rows (offsets garbage a quarter of the time).
  int64_t total_new = 0;
  std::vector<int32_t> cu_new;
  std::vector<unsigned char> k_new, v_new;
  if (in.ConsumeBool()) {
    cu_new = make_offsets(in, batch, &total_new);
    const int64_t rows = std::clamp<int64_t>(total_new, 0, 200);
    k_new.assign(std::max<int64_t>(rows, 1) * heads_kv * d * es, 0x3b);
    v_new.assign(std::max<int64_t>(rows, 1) * heads_kv * dv * es, 0x3a);
    kv.k_new = k_new.data();
    kv.v_new = v_new.data();
    kv.cu_seqlens_new = cu_new.data();
    kv.total_new = total_new > 200 ? 200 : total_new;  // the arrays hold at most 200 rows
  }
  const std::vector<unsigned char> k_before = k_cache, v_before = v_cache;
  const jfa_status s = jfa_attention_forward_paged(&p, &kv);
  require(valid_status(s), "paged forward: a status outside the enum");
  if (s != JFA_SUCCESS) {
    if (!failed_while_computing(s)) {
      require(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0xFF; }),
              "a rejected paged forward wrote out");
      require(k_cache == k_before && v_cache == v_before,
              "a rejected paged forward wrote the cache");
    }
    return;
  }
  require_finite(out, es, total_q, heads_q, dv, {0, 0}, "an accepted paged forward left out");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    fuzz_jagged_utils(in);
    fuzz_lengths_aliasing(in);
    fuzz_copy_aliasing(in);
  } else if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    fuzz_paged(in);
  } else {
    fuzz_attention(in);
  }
  // On the bytes left (none left: sizes that fit, so nothing is called).
  fuzz_packed_overflow(in);
  return 0;
}

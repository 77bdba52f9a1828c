#include "api/overlap.hpp"

#include <algorithm>

#include "common/status.hpp"

namespace jfa::detail {
namespace {

// Bytes [first, last) that the view's elements lie in.
struct ByteRange {
  uintptr_t first, last;
};

ByteRange range_of(const BufferView& v) {
  const int64_t reach =
      (v.total - 1) * v.layout.token_stride + (v.heads - 1) * v.layout.head_stride + v.d;
  const uintptr_t first = reinterpret_cast<uintptr_t>(v.base);
  return {first, first + static_cast<uintptr_t>(reach) * v.element_bytes};
}

bool empty(const BufferView& v) {
  return v.base == nullptr || v.total <= 0 || v.heads <= 0 || v.d <= 0;
}

// Whether two views of one element type and one layout share an element, b starting `delta`
// elements after a: delta = dt * token_stride + dh * head_stride + dc with dt in (-b.total,
// a.total), dh in (-b.heads, a.heads), |dc| < d. Validated layouts nest one dimension inside the
// other (strides of size-1 dimensions made packed), so only the quotients next to delta / stride
// can work.
bool same_layout_views_share(const BufferView& a, const BufferView& b, int64_t delta) {
  const Layout& l = a.layout;
  const bool tokens_outer = l.token_stride >= l.head_stride;
  const int64_t outer = tokens_outer ? l.token_stride : l.head_stride;
  const int64_t inner = tokens_outer ? l.head_stride : l.token_stride;
  const int64_t outer_a = tokens_outer ? a.total : a.heads,
                outer_b = tokens_outer ? b.total : b.heads;
  const int64_t inner_a = tokens_outer ? a.heads : a.total,
                inner_b = tokens_outer ? b.heads : b.total;
  const int64_t q_outer = delta / outer;
  for (int64_t i = q_outer - 1; i <= q_outer + 1; ++i) {
    if (i <= -outer_b || i >= outer_a) continue;
    const int64_t rest = delta - i * outer;
    const int64_t q_inner = rest / inner;
    for (int64_t j = q_inner - 1; j <= q_inner + 1; ++j) {
      if (j <= -inner_b || j >= inner_a) continue;
      const int64_t c = rest - j * inner;
      if (c > -a.d && c < a.d) return true;
    }
  }
  return false;
}

bool share_an_element(const BufferView& a, const BufferView& b) {
  const ByteRange ra = range_of(a), rb = range_of(b);
  if (ra.last <= rb.first || rb.last <= ra.first) return false;
  const intptr_t bytes = static_cast<intptr_t>(rb.first) - static_cast<intptr_t>(ra.first);
  const bool same_layout = a.element_bytes == b.element_bytes && a.d == b.d &&
                           a.layout.token_stride == b.layout.token_stride &&
                           a.layout.head_stride == b.layout.head_stride;
  if (!same_layout || bytes % static_cast<intptr_t>(a.element_bytes) != 0) return true;
  return same_layout_views_share(a, b, bytes / static_cast<intptr_t>(a.element_bytes));
}

}  // namespace

jfa_status check_outputs_disjoint(const std::vector<BufferView>& buffers) {
  for (size_t i = 0; i < buffers.size(); ++i)
    for (size_t j = i + 1; j < buffers.size(); ++j) {
      const BufferView &a = buffers[i], &b = buffers[j];
      if ((!a.written && !b.written) || empty(a) || empty(b)) continue;
      if (share_an_element(a, b))
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "%s and %s share memory; a buffer the call writes must not overlap any other "
                    "buffer of the call (not even in place)",
                    a.written ? a.name : b.name, a.written ? b.name : a.name);
    }
  return JFA_SUCCESS;
}

}  // namespace jfa::detail

// jfa_device_check_message: the text of a word of the checked mode (device offsets and results).
#include <string>

#include "jfa/jfa.h"

extern "C" const char* jfa_device_check_message(int32_t word) {
  static thread_local std::string text;
  if (word == 0) return "valid";
  struct Rule {
    int32_t bit;
    const char* what;
  };
  static constexpr Rule kRules[] = {
      {JFA_OFFSETS_Q_FIRST_NOT_ZERO, "cu_seqlens_q[0] is not 0"},
      {JFA_OFFSETS_Q_DECREASING, "cu_seqlens_q decreases"},
      {JFA_OFFSETS_Q_LAST_NOT_TOTAL, "cu_seqlens_q[batch] is not total_q"},
      {JFA_OFFSETS_Q_ABOVE_MAX, "a q length is above max_seqlen_q"},
      {JFA_OFFSETS_K_FIRST_NOT_ZERO, "cu_seqlens_k[0] is not 0"},
      {JFA_OFFSETS_K_DECREASING, "cu_seqlens_k decreases"},
      {JFA_OFFSETS_K_LAST_NOT_TOTAL, "cu_seqlens_k[batch] is not total_k"},
      {JFA_OFFSETS_K_ABOVE_MAX, "a k length is above max_seqlen_k"},
      {JFA_CHECK_RESULT_NOT_FINITE,
       "a result is NaN or infinite (a score q.k beyond float32, a NaN or infinite input, or an "
       "LSE beyond float32)"},
      {JFA_PAGED_APPEND_INVALID,
       "the paged append is invalid (cu_seqlens_new breaks the rules of offsets, or a page "
       "receiving new rows holds another sequence's keys)"},
  };
  text.clear();
  int32_t known = 0;
  for (const Rule& r : kRules) {
    known |= r.bit;
    if ((word & r.bit) == 0) continue;
    if (!text.empty()) text += "; ";
    text += r.what;
  }
  if ((word & ~known) != 0) {
    if (!text.empty()) text += "; ";
    text += "unknown bits " + std::to_string(word & ~known);
  }
  return text.c_str();
}

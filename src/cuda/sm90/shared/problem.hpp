// What the forward's and the backward's kernels both know of a call: the offsets, totals, heads,
// scale, mask, the checked mode's word and the work list's header. Built once from Params on the
// host (make_problem) and embedded as the base of FwdArgs and BwdArgs, so the kernels read it the
// same way and a field added here reaches both.
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace jfa::sm90 {

struct Problem {
  const int32_t* cu_q;
  const int32_t* cu_k;
  int32_t* device_check;  // nullable: the checked mode's word, JFA_CHECK_RESULT_NOT_FINITE ORed in
  const int32_t* work_count;      // number of valid entries of the work list
  unsigned long long* next_item;  // items claimed so far (zeroed by the work-list kernel)
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t group;  // heads_q / heads_kv
  int32_t work_capacity;
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
  int32_t causal;
};

inline Problem make_problem(const jfa::detail::Params& p, const int32_t* work_count,
                            unsigned long long* next_item, int64_t work_capacity) {
  Problem r{};
  r.cu_q = p.cu_seqlens_q;
  r.cu_k = p.cu_seqlens_k;
  r.device_check = p.device_check;
  r.work_count = work_count;
  r.next_item = next_item;
  r.batch = p.batch;
  r.total_q = p.total_q;
  r.total_k = p.total_k;
  r.heads_q = p.heads_q;
  r.heads_kv = p.heads_kv;
  r.group = p.group_size();
  r.work_capacity = static_cast<int32_t>(work_capacity);
  r.softmax_scale = p.softmax_scale;
  r.scale_log2 = static_cast<float>(static_cast<double>(p.softmax_scale) * 1.4426950408889634);
  r.causal = p.causal ? 1 : 0;
  return r;
}

}  // namespace jfa::sm90

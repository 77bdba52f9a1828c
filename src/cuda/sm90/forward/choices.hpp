// The choices the Hopper forward makes, in one table. Each was settled by an A/B measurement on an
// H200 across the benchmark workloads (bench/DECISIONS.md names the measurement behind each,
// bench/NOTES.md holds the numbers and how they were taken): the winner is what ships. The
// alternatives that lost stay compiled in tuning builds (CMake -DJFA_SM90_TUNING=ON, picked there
// by JFA_SM90_* environment variables) and in the GPU tests, which instantiate them; the shipped
// library reads no environment and holds only these kernels.
#pragma once

#include <cstdint>
#include <type_traits>

namespace jfa::sm90 {

// How a consumer warp group walks the K tiles of an item.
enum class Mainloop {
  kOneTileAtATime,         // S = Q K^T, softmax, O += P V, each waited for before the next
  kOverlappedTakingTurns,  // S(n) issued with P(n-1) V(n-1); the groups issue their MMAs in turn
  kOverlappedIndependent,  // the same overlap, groups not synchronised with each other
};

// Compile-time choices of the attention kernel.
template <Mainloop kLoop, bool kHeadMajor>
struct KernelChoices {
  static constexpr Mainloop kMainloop = kLoop;
  // Without the causal mask, the items of the q tiles of one sequence go head by head (see
  // decode_item), so that the CTAs at work share a few heads' K/V in L2.
  static constexpr bool kHeadMajorRuns = kHeadMajor;
};

using ShippedKernel = KernelChoices<Mainloop::kOverlappedTakingTurns, true>;

// The choices of `Base` with local attention: sliding windows and softcap (FwdLocalArgs), to which
// forward_shape routes the calls that ask for either; the kernels of `Base` itself, which the other
// calls run (sinks alone among them: only a row's end reads them), hold no trace of them. Softcap
// has kernels of its own (kWithSoftcap), whose softmax differs throughout (tanh, half the
// exponentials off the MUFU unit): one kernel with both softmaxes in its loop held more registers
// and spilled.
template <typename Base, bool kWithSoftcap = false>
struct WithLocalAttention : Base {
  static constexpr bool kLocalAttention = true;
  static constexpr bool kSoftcap = kWithSoftcap;
};

// Whether choices K take local attention (only WithLocalAttention's do).
template <typename K, typename = void>
struct LocalAttentionOf : std::false_type {};
template <typename K>
struct LocalAttentionOf<K, std::void_t<decltype(K::kLocalAttention)>>
    : std::bool_constant<K::kLocalAttention> {};

// Whether choices K are the softcap kernels' (WithLocalAttention<Base, true>).
template <typename K, typename = void>
struct SoftcapOf : std::false_type {};
template <typename K>
struct SoftcapOf<K, std::void_t<decltype(K::kSoftcap)>> : std::bool_constant<K::kSoftcap> {};

// How the paged kernels' producer brings a K/V tile from its pages (paged_loads.hpp chooses).
// kPagesByTma: one warp loads every box of whole pages by TMA and copies only the tile's rows at
// and past the sequence's last partial box by cp.async (producer_paged_tma.cuh); taken where pages
// come in boxes of 8 rows or more. kRowsByCpAsync: the warp group copies every row by cp.async,
// after acquiring the tile's stage and looking up its pages (producer_paged.cuh); pages of 1, 2 or
// 4 rows (or odd sizes) and JFA_CUDA_PAGED_LOADS=rows.
enum class PagedLoads { kRowsByCpAsync, kPagesByTma };

// The choices of `Base` over a paged KV cache (FwdPagedArgs): the producer loads each K/V tile
// from its pages as `kLoads` says, the rest is `Base`'s. Chunked prefill over a paged cache runs
// these (paged_prefill.cu). kKeySplits: each item holds one of FwdPagedSplitArgs::splits parts of
// its K tiles and ends in partial results that the paged combine kernel merges (split_epilogue,
// epilogue.cuh), so that a batch of few (q tile, head) items fills the SMs
// (paged_prefill_splits.hpp).
template <typename Base, PagedLoads kLoads = PagedLoads::kRowsByCpAsync, bool kKeySplits = false>
struct WithPagedKV : Base {
  static constexpr bool kPagedKV = true;
  static constexpr PagedLoads kPagedLoads = kLoads;
  static constexpr bool kSplitsKeys = kKeySplits;
};

// Whether choices K read a paged KV cache (only WithPagedKV's do).
template <typename K, typename = void>
struct PagedKVOf : std::false_type {};
template <typename K>
struct PagedKVOf<K, std::void_t<decltype(K::kPagedKV)>> : std::bool_constant<K::kPagedKV> {};

// Whether choices K's items hold splits of their keys (only WithPagedKV's with kKeySplits).
template <typename K>
constexpr bool key_splits_of() {
  if constexpr (PagedKVOf<K>::value)
    return K::kSplitsKeys;
  else
    return false;
}

// How choices K's producer loads a paged tile (kRowsByCpAsync where K reads no paged cache).
template <typename K>
constexpr PagedLoads paged_loads_of() {
  if constexpr (PagedKVOf<K>::value)
    return K::kPagedLoads;
  else
    return PagedLoads::kRowsByCpAsync;
}

// Choices of the launch, taken on the host.
struct LaunchChoices {
  // The work list heaviest sequences first (a counting sort on the device) instead of in sequence
  // order; it needs a second list in the workspace.
  bool sort_work_list;
  // The attention kernel as a programmatic dependent launch of the work-list kernel (its CTAs set
  // up while the list is built) instead of two plain launches.
  bool dependent_launch;
};

inline constexpr LaunchChoices kShippedLaunch{/*sort_work_list=*/false, /*dependent_launch=*/true};

// Tile shapes, chosen per call from the mean query length (no read of the offsets):
// - head_dim 64: three consumer groups (192-row Q tiles), whose third group hides the softmax of
//   the others, unless the sequences are short on average: a shared tile of short sequences holds
//   at most one K tile of them, so a third of a 192-row tile would be padding; two groups there.
// - head_dim 128: K tiles of 160 keys without the causal mask on long sequences (fewer softmax
//   passes and barrier hand-overs per FLOP), else 128 (160 leaves more of each diagonal tile
//   masked, and holds one Q tile only, which short items need two of).
// - head_dim 192 (q.k; v 192 or 128): two consumer groups, K tiles of 64 keys, which is what lets
//   the Q tile, a two-stage K/V ring and the O staging tiles share the 227 KB (one Q stage at
//   v 192, two at v 128). Not yet tuned by measurement.
// - head_dim 32: as 64. head_dim 96: two groups, K tiles of 128 keys. head_dim 256: two groups,
//   K tiles of 64 keys, one Q stage, O staged in two passes of 128 columns (FwdConfig). Not yet
//   tuned by measurement.
// - softcap: two groups at 32 and 64, 128 keys at 128: the softcap kernels' softmax with three
//   groups (128 registers a thread) or 160 keys spills in the K loop.
inline constexpr int64_t kShortMeanQueryTokens = 128;

constexpr bool short_on_average(int64_t total_q, int64_t batch) {
  return total_q <= kShortMeanQueryTokens * batch;
}
constexpr int head_dim_64_groups(int64_t total_q, int64_t batch, bool softcap = false) {
  return softcap || short_on_average(total_q, batch) ? 2 : 3;
}
constexpr int head_dim_128_keys(int64_t total_q, int64_t batch, bool causal, bool softcap = false) {
  return !causal && !softcap && !short_on_average(total_q, batch) ? 160 : 128;
}

// Pipeline depths and the register split (FwdConfig): K/V ring stages 4 at head_dim 64 and 2 at
// 128; a second Q tile (the next item's Q arrives during this one) wherever shared memory holds
// it; with two consumer groups the producer claims items from a global counter (three groups have
// no registers left for the decode and walk the items round-robin); groups skip the K tiles none
// of their rows sees with three groups only (with two it rarely applies and costs code on tiny
// sequences); registers 56 / 224 (producer / consumers) with two groups, 32 / 160 with three.
// Tuning builds may override these with JFA_SM90_KV_STAGES, JFA_SM90_Q_STAGES and
// JFA_SM90_PRODUCER_REGS + JFA_SM90_CONSUMER_REGS (compiler definitions).
#ifdef JFA_SM90_KV_STAGES
inline constexpr int kKvStagesOverride = JFA_SM90_KV_STAGES;
#else
inline constexpr int kKvStagesOverride = 0;
#endif
#ifdef JFA_SM90_Q_STAGES
inline constexpr int kQStagesCap = JFA_SM90_Q_STAGES;
#else
inline constexpr int kQStagesCap = 2;
#endif

constexpr int kv_stages(int head_dim) {
  return kKvStagesOverride > 0 ? kKvStagesOverride : (head_dim <= 64 ? 4 : 2);
}
constexpr int producer_registers(int groups) {
#if defined(JFA_SM90_PRODUCER_REGS) && defined(JFA_SM90_CONSUMER_REGS)
  if (groups == 2) return JFA_SM90_PRODUCER_REGS;
#endif
  return groups == 2 ? 56 : 32;
}
constexpr int consumer_registers(int groups) {
#if defined(JFA_SM90_PRODUCER_REGS) && defined(JFA_SM90_CONSUMER_REGS)
  if (groups == 2) return JFA_SM90_CONSUMER_REGS;
#endif
  return groups == 2 ? 224 : 160;
}

}  // namespace jfa::sm90

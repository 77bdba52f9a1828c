// The shape of the paged decode kernel at one head_dim (64, 128 or 256; values of the same size),
// host and device code alike: the launch needs its shared memory and rows per CTA, the kernel the
// rest.
//
// A team of kTeam lanes holds one row's head_dim, 8 columns (16 bytes of q) a lane, so a 128-thread
// CTA has kTeams teams of up to kRowsPerTeam rows each. Keys arrive kChunkKeys at a time, 16 KB of
// keys and 16 KB of values a stage at every head size, kStages stages deep (96 KB: two CTAs an SM),
// and are scored kSubKeys at a time (one maximum and one rescale of O per 8 keys).
#pragma once

namespace jfa::sm90 {

template <int kD>
struct PagedConfig {
  static_assert(kD == 64 || kD == 128 || kD == 256, "the paged kernels take head_dim 64, 128, 256");
  static constexpr int kThreads = 128;
  static constexpr int kVec = 8;  // 16-bit elements of a 16-byte vector
  static constexpr int kTeam = kD / kVec;
  static constexpr int kTeams = kThreads / kTeam;
  static constexpr int kRowsPerTeam = 4;
  static constexpr int kRowsPerCta = kTeams * kRowsPerTeam;
  static constexpr int kSubKeys = 8;
  static constexpr int kChunkKeys = 8192 / kD;
  static constexpr int kSubTiles = kChunkKeys / kSubKeys;
  static constexpr int kStages = 3;
  static constexpr int kVecsPerKey = kD / kVec;
  static constexpr int kStageElems = kChunkKeys * kD;  // of keys, and as many of values
  static constexpr int kSmemBytes = kStages * 2 * kStageElems * 2;
  // After the key loop the stages hold the merge of the key teams: O (fp32) and (max, sum) of each
  // team's rows.
  static constexpr int kMergeOBytes = kThreads * kRowsPerTeam * kVec * 4;
  static constexpr int kMergeBytes = kMergeOBytes + kTeams * kRowsPerTeam * 8;
  static_assert(kMergeBytes <= kSmemBytes, "the merge reuses the stages");
  static_assert(kSubTiles >= kTeams, "every key team gets a sub-tile of each chunk");
  static_assert(kChunkKeys * kVecsPerKey % kThreads == 0, "a chunk's vectors split evenly");
};

// Query tokens per sequence the kernel takes (decode and speculative decode); longer ones
// (chunked prefill) are not served yet.
inline constexpr int kPagedMaxQueryTokens = 16;
// Query tokens per sequence the tensor-core kernel takes (paged_decode_mma.cuh: chunks of a
// chunked prefill too, each CTA's rows over the keys they see), while it runs only under its
// switch (paged_dispatch.cu).
inline constexpr int kPagedMmaMaxQueryTokens = 4096;
// The fewest keys a split takes (a multiple of every kChunkKeys): shorter sequences use fewer
// splits than the launch has, and the others exit at once.
inline constexpr int kPagedMinSplitKeys = 256;

}  // namespace jfa::sm90

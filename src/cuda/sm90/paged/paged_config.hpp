// The shape of the paged decode kernel (paged_decode.cuh) at one head_dim (64, 128 or 256; values
// of the same size), host and device code alike: the launch needs its shared memory and rows per
// CTA, the kernel the rest.
//
// A CTA of 4 warps holds kRowsPerCta rows, 16 a warp; where the rows are fewer, the spare warps
// split each chunk's 16-key sub-tiles. Keys arrive kChunkKeys at a time, 16 KB of keys and 16 KB of
// values a stage at every head size, kStages stages deep (96 KB: two CTAs an SM).
#pragma once

namespace jfa::sm90 {

template <int kD>
struct PagedConfig {
  static_assert(kD == 64 || kD == 128 || kD == 256, "the paged kernels take head_dim 64, 128, 256");
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  // 64 rows at 64, 32 at 128, 16 at 256 (one to four row warps), as measured; a warp's registers
  // do not depend on it (16 rows a warp at every size), but at 256 q's shared copy (kQBytes)
  // grows with it, and more than 32 rows would leave one CTA an SM.
  static constexpr int kRowsPerCta = 8192 / 2 / kD;
  static constexpr int kChunkKeys = 8192 / kD;
  static constexpr int kStages = 3;
  static constexpr int kStageElems = kChunkKeys * kD;  // of keys, and as many of values
  static constexpr int kStageBytes = kStages * 2 * kStageElems * 2;
  // Past 128, q's fragments and O's would not fit the registers together: q waits in shared
  // memory after the stages (16 rows of each row warp, swizzled as the stages) and each step
  // loads its A fragment with ldmatrix.
  static constexpr bool kQShared = kD > 128;
  static constexpr int kQBytes = kQShared ? kRowsPerCta * kD * 2 : 0;
  static constexpr int kSmemBytes = kStageBytes + kQBytes;
  static constexpr int kVecsPerKey = kD / 8;
  static constexpr int kSubKeys = 16;
  static constexpr int kSubTiles = kChunkKeys / kSubKeys;
  static constexpr int kKSteps = kD / 16;  // of q.k
  static constexpr int kNTiles = kD / 8;   // of O
  // The merge of the key warps, in the stages: each warp's O (16 x kD floats) and its rows'
  // (max, sum).
  static constexpr int kMergeOBytes = kWarps * 16 * kD * 4;
  static constexpr int kMergeBytes = kMergeOBytes + kWarps * 16 * 8;
  static_assert(kRowsPerCta % 16 == 0 && kRowsPerCta / 16 <= kWarps, "16 rows a warp");
  static_assert(kMergeBytes <= kStageBytes, "the merge reuses the stages");
  static_assert(kVecsPerKey >= 8, "the swizzle XORs 3 bits of a key's vector index");
  static_assert(kChunkKeys * kVecsPerKey % kThreads == 0, "a chunk's vectors split evenly");
};

// Query tokens per sequence the kernel takes: decode, speculative decode and the chunks of a
// chunked prefill (each CTA's rows over the keys they see).
inline constexpr int kPagedMaxQueryTokens = 4096;
// The fewest keys a split takes (a multiple of every kChunkKeys): shorter sequences use fewer
// splits than the launch has, and the others exit at once.
inline constexpr int kPagedMinSplitKeys = 256;

}  // namespace jfa::sm90

// Hopper-path tile shape per head dim: keys per block, K/V pipeline stages, consumer
// warpgroups (64 query rows each); hd 64 has a second one for short causal calls. hd 64, 96
// and 128 take three consumers, so a K/V block read from L2 serves 192 query rows (a third
// less L2 traffic per FLOP); hd 96 and 128 then need 64-key blocks to fit 160 registers per
// consumer thread (hd 128: 96 keys spill; hd 96: 128 keys spill), hd 128 beats at every key
// range the 176-key, two-consumer tile it once took for long ones, and hd 96 gains 4-13 % over
// two consumers on 128-key blocks from 2k on. Chosen by measurement on H200 (see
// benchmarks/results/README.md); FLASHCUTE_HOPPER_TILES overrides the first ones for tuning.
// Key blocks such as 80 rely on CuTe's extended WGMMA shapes (CMakeLists.txt). Plain C++: the
// host API sizes the forward's workspace from these values.
#pragma once

#include "hopper_tile_overrides.h"      // generated
#include "hopper_fp8_tile_overrides.h"  // generated

#ifndef FLASHCUTE_HOPPER_TILE_64
#define FLASHCUTE_HOPPER_TILE_64 128, 2, 3
#endif
#ifndef FLASHCUTE_HOPPER_TILE_96
#define FLASHCUTE_HOPPER_TILE_96 64, 3, 3
#endif
#ifndef FLASHCUTE_HOPPER_TILE_128
#define FLASHCUTE_HOPPER_TILE_128 64, 3, 3
#endif
#ifndef FLASHCUTE_HOPPER_TILE_192
#define FLASHCUTE_HOPPER_TILE_192 96, 2, 2
#endif
#ifndef FLASHCUTE_HOPPER_TILE_256
#define FLASHCUTE_HOPPER_TILE_256 80, 2, 2
#endif
// hd 64 where causal rows see few keys (fwd_second_tile): 64-key blocks halve the masked keys
// a consumer computes on the diagonal, which are a large part of such a walk (two to four
// blocks of 128 keys), and four stages keep the shorter blocks coming. Measured -5 % time at
// causal 512, -0.5 to -3 % at 768 and 1k, +2 to +6 % from 1.5k on.
#ifndef FLASHCUTE_HOPPER_TILE_64_SHORT_CAUSAL
#define FLASHCUTE_HOPPER_TILE_64_SHORT_CAUSAL 64, 4, 3
#endif

// FP8 (e4m3) tiles: 128-key blocks, each in one 128-row descale block (one K and V descale
// per block), which halve the per-block work per key against 64; V also takes a transposed
// copy in shared memory (fwd_v_transpose.h). hd 64 runs three consumers (192-row tiles: less
// L2 traffic per FLOP); hd 128 two, as a third spills on 128 keys, and two on 128 keys beat
// three on 64 from 4k on; hd 256's consumers need 240 registers (the producer warpgroup keeps
// 24) and O is staged in V's buffer. Measured on H100: benchmarks/results/README.md.
#ifndef FLASHCUTE_HOPPER_FP8_TILE_64
#define FLASHCUTE_HOPPER_FP8_TILE_64 128, 2, 3
#endif
#ifndef FLASHCUTE_HOPPER_FP8_TILE_128
#define FLASHCUTE_HOPPER_FP8_TILE_128 128, 2, 2
#endif
#ifndef FLASHCUTE_HOPPER_FP8_TILE_256
#define FLASHCUTE_HOPPER_FP8_TILE_256 128, 2, 2
#endif

namespace flashcute::hopper {

template <int kHeadDim> struct FwdTileShape;
template <int kBlockN, int kStages, int kConsumers> struct FwdTileValues {
  static constexpr int kBlockN_ = kBlockN, kStages_ = kStages, kConsumers_ = kConsumers;
};
template <> struct FwdTileShape<64> : FwdTileValues<FLASHCUTE_HOPPER_TILE_64> {};
template <> struct FwdTileShape<96> : FwdTileValues<FLASHCUTE_HOPPER_TILE_96> {};
template <> struct FwdTileShape<128> : FwdTileValues<FLASHCUTE_HOPPER_TILE_128> {};
template <> struct FwdTileShape<192> : FwdTileValues<FLASHCUTE_HOPPER_TILE_192> {};
template <> struct FwdTileShape<256> : FwdTileValues<FLASHCUTE_HOPPER_TILE_256> {};

template <int kHeadDim> struct FwdFp8TileShape;
template <> struct FwdFp8TileShape<64> : FwdTileValues<FLASHCUTE_HOPPER_FP8_TILE_64> {};
template <> struct FwdFp8TileShape<128> : FwdTileValues<FLASHCUTE_HOPPER_FP8_TILE_128> {};
template <> struct FwdFp8TileShape<256> : FwdTileValues<FLASHCUTE_HOPPER_FP8_TILE_256> {};
static_assert(128 % FwdFp8TileShape<64>::kBlockN_ == 0 && 128 % FwdFp8TileShape<128>::kBlockN_ == 0 &&
                  128 % FwdFp8TileShape<256>::kBlockN_ == 0,
              "an FP8 key block must lie in one 128-row descale block");

// The second tile shape of a head dim: hd 64 for short causal calls.
template <int kHeadDim> struct FwdSecondTileShape;
template <> struct FwdSecondTileShape<64> : FwdTileValues<FLASHCUTE_HOPPER_TILE_64_SHORT_CAUSAL> {};
constexpr bool fwd_has_second_tile(int headdim) { return headdim == 64; }

// Mean keys per query row up to which a causal hd 64 call takes the short-causal tile.
constexpr int kFwdShortCausalKeys = 512;

// Whether a call takes its head dim's second tile. A causal row sees seqlen_k - seqlen_q / 2
// keys on average (fewer when seqlen_q > seqlen_k: the estimate then stays low).
constexpr bool fwd_second_tile(int headdim, int seqlen_q, int seqlen_k, bool causal) {
  const int mean_keys = causal ? seqlen_k - seqlen_q / 2 : seqlen_k;
  return headdim == 64 && causal && mean_keys <= kFwdShortCausalKeys;
}

// Keys per block and consumer warpgroups of a head dim's tile (0, 0 for other head dims).
struct FwdTileSize {
  int block_n, consumers;
};
constexpr FwdTileSize fwd_tile_size(int headdim, bool second_tile = false) {
  if (second_tile && headdim == 64)
    return FwdTileSize{FwdSecondTileShape<64>::kBlockN_, FwdSecondTileShape<64>::kConsumers_};
  return headdim == 64    ? FwdTileSize{FwdTileShape<64>::kBlockN_, FwdTileShape<64>::kConsumers_}
         : headdim == 96  ? FwdTileSize{FwdTileShape<96>::kBlockN_, FwdTileShape<96>::kConsumers_}
         : headdim == 128 ? FwdTileSize{FwdTileShape<128>::kBlockN_, FwdTileShape<128>::kConsumers_}
         : headdim == 192 ? FwdTileSize{FwdTileShape<192>::kBlockN_, FwdTileShape<192>::kConsumers_}
         : headdim == 256 ? FwdTileSize{FwdTileShape<256>::kBlockN_, FwdTileShape<256>::kConsumers_}
                          : FwdTileSize{0, 0};
}

}  // namespace flashcute::hopper

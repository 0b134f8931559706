// Tile shapes of the Ampere-path backward per head dim, one table per code generation as for
// the forward (fwd_config.h): sm90 code may use up to 227 KB of shared memory, sm80 code
// stays within 99 KB so that sm86/sm89 run it too. Each entry is
// "BlockM, BlockN, Warps, WarpsMSdP, WarpsNdKV, QStages" (see bwd_traits.h).
// FLASHCUTE_AMPERE_BWD_TILES="128=64,128,8,2,4,2;..." overrides sm90 entries for measurements.
// sm90 entries as measured on an H200 (benchmarks/results/README.md); every kernel is at the
// 255-register cap, without local memory (checked by benchmarks/check_sass.sh).
#pragma once

#include <utility>

#include "ampere/bwd_traits.h"
#include "ampere/tile_arch.h"
#include "ampere_bwd_tile_overrides.h"  // generated

#ifndef FLASHCUTE_AMPERE_BWD_TILE_32
#define FLASHCUTE_AMPERE_BWD_TILE_32 128, 128, 8, 4, 4, 2
#endif
#ifndef FLASHCUTE_AMPERE_BWD_TILE_64
#define FLASHCUTE_AMPERE_BWD_TILE_64 128, 128, 8, 4, 4, 2
#endif
#ifndef FLASHCUTE_AMPERE_BWD_TILE_96
#define FLASHCUTE_AMPERE_BWD_TILE_96 64, 128, 8, 2, 4, 2
#endif
#ifndef FLASHCUTE_AMPERE_BWD_TILE_128
#define FLASHCUTE_AMPERE_BWD_TILE_128 64, 128, 8, 2, 4, 2
#endif
#ifndef FLASHCUTE_AMPERE_BWD_TILE_192
#define FLASHCUTE_AMPERE_BWD_TILE_192 64, 64, 8, 4, 2, 2
#endif
#ifndef FLASHCUTE_AMPERE_BWD_TILE_256
#define FLASHCUTE_AMPERE_BWD_TILE_256 64, 64, 8, 4, 2, 2
#endif

namespace flashcute::ampere {

template <int kHeadDim, int kArch> struct BwdTileConfig;
template <int... kValues> using BwdTile = std::integer_sequence<int, kValues...>;

template <> struct BwdTileConfig<32, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_32>; };
template <> struct BwdTileConfig<64, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_64>; };
template <> struct BwdTileConfig<96, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_96>; };
template <> struct BwdTileConfig<128, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_128>; };
template <> struct BwdTileConfig<192, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_192>; };
template <> struct BwdTileConfig<256, 90> { using type = BwdTile<FLASHCUTE_AMPERE_BWD_TILE_256>; };

template <> struct BwdTileConfig<32, 80> { using type = BwdTile<64, 128, 8, 2, 4, 2>; };   // 64 KB
template <> struct BwdTileConfig<64, 80> { using type = BwdTile<64, 128, 8, 2, 4, 2>; };   // 96 KB
template <> struct BwdTileConfig<96, 80> { using type = BwdTile<64, 64, 8, 2, 4, 2>; };    // 88 KB
template <> struct BwdTileConfig<128, 80> { using type = BwdTile<64, 64, 8, 2, 4, 1>; };   // 80 KB
template <> struct BwdTileConfig<192, 80> { using type = BwdTile<32, 64, 8, 2, 4, 1>; };   // 80 KB
template <> struct BwdTileConfig<256, 80> { using type = BwdTile<32, 32, 4, 2, 2, 1>; };   // 68 KB

template <class Element, int kHeadDim, int kArch,
          class Config = typename BwdTileConfig<kHeadDim, kArch>::type>
struct BwdTraitsFor;
template <class Element, int kHeadDim, int kArch, int kBlockM, int kBlockN, int kNWarps,
          int kWarpsMSdP, int kWarpsNdKV, int kQStages>
struct BwdTraitsFor<Element, kHeadDim, kArch,
                    BwdTile<kBlockM, kBlockN, kNWarps, kWarpsMSdP, kWarpsNdKV, kQStages>> {
  using type = BwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps, kWarpsMSdP, kWarpsNdKV,
                         kQStages>;
};

}  // namespace flashcute::ampere

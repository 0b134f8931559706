// Tile shapes of the Ampere-path forward, one entry per head dim, chosen by measurement
// (benchmarks/results/). Each is "BlockM, BlockN, Warps, Stages, QInRegs"; a build can
// override one with -DFLASHCUTE_AMPERE_TILE_<hd>="..." (CMake: FLASHCUTE_AMPERE_TILE_DEFINES)
// to measure alternatives without editing this table.
#pragma once

#include <utility>

#include "ampere/fwd_traits.h"

#ifndef FLASHCUTE_AMPERE_TILE_32
#define FLASHCUTE_AMPERE_TILE_32 128, 64, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_64
#define FLASHCUTE_AMPERE_TILE_64 128, 64, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_96
#define FLASHCUTE_AMPERE_TILE_96 128, 64, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_128
#define FLASHCUTE_AMPERE_TILE_128 128, 64, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_192
#define FLASHCUTE_AMPERE_TILE_192 128, 32, 8, 2, 0
#endif
#ifndef FLASHCUTE_AMPERE_TILE_256
#define FLASHCUTE_AMPERE_TILE_256 128, 32, 8, 2, 0
#endif

namespace flashcute::ampere {

template <int kHeadDim> struct FwdTileConfig;
template <> struct FwdTileConfig<32> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_32>; };
template <> struct FwdTileConfig<64> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_64>; };
template <> struct FwdTileConfig<96> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_96>; };
template <> struct FwdTileConfig<128> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_128>; };
template <> struct FwdTileConfig<192> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_192>; };
template <> struct FwdTileConfig<256> { using type = std::integer_sequence<int, FLASHCUTE_AMPERE_TILE_256>; };

template <class Element, int kHeadDim, class Config = typename FwdTileConfig<kHeadDim>::type>
struct FwdTraitsFor;
template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kNWarps, int kStages, int kQInRegs>
struct FwdTraitsFor<Element, kHeadDim,
                    std::integer_sequence<int, kBlockM, kBlockN, kNWarps, kStages, kQInRegs>> {
  using type = FwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs != 0>;
};

}  // namespace flashcute::ampere

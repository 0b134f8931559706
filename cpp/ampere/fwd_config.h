// Tile shapes of the Ampere-path forward per head dim, one table per code generation:
//  - sm90 code (H100/H200): measured on the bench grid (benchmarks/results/).
//  - sm80 code (A100, and sm86/sm89, which allow only 99 KB of shared memory per block):
//    every entry fits 99 KB. The same kernel symbol carries both (the device pass picks its
//    table by __CUDA_ARCH__, the host by the loaded binary's PTX version), so the second
//    table costs no extra instantiation.
// Each entry is "BlockM, BlockN, Warps, Stages, QInRegs". The CMake list
// FLASHCUTE_AMPERE_TILES="128=128,64,8,2,1;..." overrides sm90 entries for measurements
// (FLASHCUTE_AMPERE_NARROW_TILES the narrow ones).
//  - narrow tiles (sm90 code, a second kernel symbol): split-KV calls with at most BlockM query
//    rows per (batch, head), i.e. decoding with packed query heads, where the wide tile's warps
//    mostly wait on empty rows (runs_narrow_tile in kernel_registry.h). Measured in
//    benchmarks/results/ (feature "decode").
#pragma once

#include <utility>

#include "ampere/fwd_traits.h"
#include "ampere/tile_arch.h"
#include "ampere_tile_overrides.h"  // generated
#include "ampere_narrow_tile_overrides.h"  // generated

#ifndef FLASHCUTE_AMPERE_TILE_32
#define FLASHCUTE_AMPERE_TILE_32 128, 64, 4, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_64
#define FLASHCUTE_AMPERE_TILE_64 64, 64, 4, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_96
#define FLASHCUTE_AMPERE_TILE_96 128, 128, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_128
#define FLASHCUTE_AMPERE_TILE_128 128, 128, 8, 2, 1
#endif
#ifndef FLASHCUTE_AMPERE_TILE_192
#define FLASHCUTE_AMPERE_TILE_192 128, 64, 8, 2, 0
#endif
#ifndef FLASHCUTE_AMPERE_TILE_256
#define FLASHCUTE_AMPERE_TILE_256 128, 64, 8, 2, 0
#endif

namespace flashcute::ampere {

template <int kHeadDim, int kArch> struct FwdTileConfig;
template <int... kValues> using Tile = std::integer_sequence<int, kValues...>;

template <> struct FwdTileConfig<32, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_32>; };
template <> struct FwdTileConfig<64, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_64>; };
template <> struct FwdTileConfig<96, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_96>; };
template <> struct FwdTileConfig<128, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_128>; };
template <> struct FwdTileConfig<192, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_192>; };
template <> struct FwdTileConfig<256, 90> { using type = Tile<FLASHCUTE_AMPERE_TILE_256>; };

template <> struct FwdTileConfig<32, 80> { using type = Tile<128, 64, 4, 2, 1>; };   // 16 KB
template <> struct FwdTileConfig<64, 80> { using type = Tile<64, 64, 4, 2, 1>; };    // 24 KB
template <> struct FwdTileConfig<96, 80> { using type = Tile<128, 64, 8, 2, 1>; };   // 48 KB
template <> struct FwdTileConfig<128, 80> { using type = Tile<128, 64, 8, 2, 1>; };  // 64 KB
template <> struct FwdTileConfig<192, 80> { using type = Tile<128, 32, 8, 2, 0>; };  // 96 KB
template <> struct FwdTileConfig<256, 80> { using type = Tile<64, 32, 4, 2, 0>; };   // 96 KB

#ifndef FLASHCUTE_AMPERE_NARROW_TILE_128
#define FLASHCUTE_AMPERE_NARROW_TILE_128 64, 64, 4, 2, 1
#endif

// void: the head dim has no narrow kernel and every call runs the wide tile (head dims but 128;
// their FLASHCUTE_AMPERE_NARROW_TILES entries are ignored).
template <int kHeadDim> struct FwdNarrowTileConfig { using type = void; };
template <> struct FwdNarrowTileConfig<128> { using type = Tile<FLASHCUTE_AMPERE_NARROW_TILE_128>; };

template <class Element, int kHeadDim, int kArch,
          class Config = typename FwdTileConfig<kHeadDim, kArch>::type>
struct FwdTraitsFor;
template <class Element, int kHeadDim, int kArch, int kBlockM, int kBlockN, int kNWarps,
          int kStages, int kQInRegs>
struct FwdTraitsFor<Element, kHeadDim, kArch, Tile<kBlockM, kBlockN, kNWarps, kStages, kQInRegs>> {
  using type = FwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps, kStages, kQInRegs != 0>;
};

template <class Element, int kHeadDim, class Config = typename FwdNarrowTileConfig<kHeadDim>::type>
struct FwdNarrowTraitsFor : FwdTraitsFor<Element, kHeadDim, 90, Config> {};
template <class Element, int kHeadDim>
struct FwdNarrowTraitsFor<Element, kHeadDim, void> { using type = void; };

}  // namespace flashcute::ampere

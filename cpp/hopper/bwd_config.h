// Hopper-path backward tiles per head dim: Q/dO pipeline stages, how the two consumers split
// dQ (0: by head-dim columns, 1: by keys, 2: by query rows; see bwd_traits.h) and query rows
// per block (64 or 128). 128 keys per CTA.
// FLASHCUTE_HOPPER_BWD_TILES overrides them for tuning.
#pragma once

#include "hopper/bwd_traits.h"
#include "hopper_bwd_tile_overrides.h"  // generated

#ifndef FLASHCUTE_HOPPER_BWD_TILE_64
#define FLASHCUTE_HOPPER_BWD_TILE_64 3, 2, 128
#endif
#ifndef FLASHCUTE_HOPPER_BWD_TILE_96
#define FLASHCUTE_HOPPER_BWD_TILE_96 2, 1, 64
#endif
#ifndef FLASHCUTE_HOPPER_BWD_TILE_128
#define FLASHCUTE_HOPPER_BWD_TILE_128 2, 0, 64
#endif

namespace flashcute::hopper {

template <int kHeadDim> struct BwdTileShape;
template <int kStages, int kDqSplit, int kBlockM> struct BwdTileValues {
  static constexpr int kStages_ = kStages;
  static constexpr int kDqSplit_ = kDqSplit;
  static constexpr int kBlockM_ = kBlockM;
};
template <> struct BwdTileShape<64> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_64> {};
template <> struct BwdTileShape<96> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_96> {};
template <> struct BwdTileShape<128> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_128> {};

template <class Element, int kHeadDim, class Shape = BwdTileShape<kHeadDim>>
using BwdTraitsFor = BwdTraits<Element, kHeadDim, Shape::kStages_, Shape::kDqSplit_, Shape::kBlockM_>;

}  // namespace flashcute::hopper

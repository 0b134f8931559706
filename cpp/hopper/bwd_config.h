// Hopper-path backward tiles per head dim: Q/dO pipeline stages, how the two consumers split
// dQ (0: by head-dim columns, 1: by keys, 2: by query rows; see bwd_traits.h) and query rows
// per block (64 or 128). 128 keys per CTA.
// Head dim 256 takes the wide design (bwd_wide_traits.h: 64 keys per CTA, consumers split the
// head dim): only the stage count is a choice there, the split is 0 and blocks 64.
// FLASHCUTE_HOPPER_BWD_TILES overrides them for tuning.
#pragma once

#include "hopper/bwd_traits.h"
#include "hopper/bwd_wide_traits.h"
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
#ifndef FLASHCUTE_HOPPER_BWD_TILE_256
#define FLASHCUTE_HOPPER_BWD_TILE_256 2, 0, 64
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
template <> struct BwdTileShape<256> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_256> {};

template <class Element, int kHeadDim, class Shape = BwdTileShape<kHeadDim>>
struct BwdTraitsSelect {
  using type = BwdTraits<Element, kHeadDim, Shape::kStages_, Shape::kDqSplit_, Shape::kBlockM_>;
};
template <class Element, int kHeadDim, class Shape = BwdTileShape<kHeadDim>>
struct BwdWideTraitsSelect {
  static_assert(Shape::kDqSplit_ == 0 && Shape::kBlockM_ == 64, "wide head dims: split 0, 64-row blocks");
  using type = BwdWideTraits<Element, kHeadDim, Shape::kStages_>;
};
template <class Element>
struct BwdTraitsSelect<Element, 256> : BwdWideTraitsSelect<Element, 256> {};

template <class Element, int kHeadDim>
using BwdTraitsFor = typename BwdTraitsSelect<Element, kHeadDim>::type;

}  // namespace flashcute::hopper

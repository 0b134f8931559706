// Hopper-path backward tiles per head dim: Q/dO pipeline stages, how the two consumers split
// the work, query rows per block (64 or 128) and keys per CTA.
// Split 0, 1, 2: each consumer owns half of the CTA's 128 keys (dK, dV in registers) and they
// split dQ by head-dim columns, keys or query rows (bwd_traits.h).
// Split 3: the wide design (bwd_wide_traits.h): the consumers split the keys for S and dP and
// the head dim for everything else; 64-row blocks, keys per CTA a multiple of 16. Head dim 256
// fits only this one. Head dim 128 measured faster on split 0 with the deferred dQ of
// bwd_consumer.h (4-5 % from 2k on).
// FLASHCUTE_HOPPER_BWD_TILES overrides them for tuning.
#pragma once

#include "hopper/bwd_traits.h"
#include "hopper/bwd_wide_traits.h"
#include "hopper_bwd_tile_overrides.h"  // generated

#ifndef FLASHCUTE_HOPPER_BWD_TILE_64
#define FLASHCUTE_HOPPER_BWD_TILE_64 3, 2, 128, 128
#endif
#ifndef FLASHCUTE_HOPPER_BWD_TILE_96
#define FLASHCUTE_HOPPER_BWD_TILE_96 2, 1, 64, 128
#endif
#ifndef FLASHCUTE_HOPPER_BWD_TILE_128
#define FLASHCUTE_HOPPER_BWD_TILE_128 2, 0, 64, 128
#endif
#ifndef FLASHCUTE_HOPPER_BWD_TILE_256
#define FLASHCUTE_HOPPER_BWD_TILE_256 2, 3, 64, 80
#endif

namespace flashcute::hopper {

template <int kHeadDim> struct BwdTileShape;
template <int kStages, int kDqSplit, int kBlockM, int kBlockN> struct BwdTileValues {
  static constexpr int kStages_ = kStages;
  static constexpr int kDqSplit_ = kDqSplit;
  static constexpr int kBlockM_ = kBlockM;
  static constexpr int kBlockN_ = kBlockN;
};
template <> struct BwdTileShape<64> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_64> {};
template <> struct BwdTileShape<96> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_96> {};
template <> struct BwdTileShape<128> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_128> {};
template <> struct BwdTileShape<256> : BwdTileValues<FLASHCUTE_HOPPER_BWD_TILE_256> {};

constexpr int kBwdSplitHeadDim = 3;

// The key-split kernels whose dQ needs both consumers' dS issue it one block late from this
// many query blocks per CTA on (bwd_launch.h has the measurements).
constexpr int bwd_defer_dq_min_blocks(int head_dim) { return head_dim <= 64 ? 0 : 24; }
// Deferred-dQ kernels compiled for fixed lengths only; variable-length calls (seq_view.h) run
// the same kernel without the deferred dQ. At the register cap, a sequence's lengths kept in
// registers spilled in hd 128's deferred kernel.
constexpr bool bwd_deferred_dq_fixed_only(int head_dim) { return bwd_defer_dq_min_blocks(head_dim) > 0; }

template <class Element, int kHeadDim, class Shape = BwdTileShape<kHeadDim>,
          bool kWide = Shape::kDqSplit_ == kBwdSplitHeadDim>
struct BwdTraitsSelect {
  static_assert(Shape::kBlockN_ == 128, "splits 0-2: 128 keys per CTA");
  using type = BwdTraits<Element, kHeadDim, Shape::kStages_, Shape::kDqSplit_, Shape::kBlockM_>;
};
template <class Element, int kHeadDim, class Shape>
struct BwdTraitsSelect<Element, kHeadDim, Shape, true> {
  static_assert(Shape::kBlockM_ == 64, "split 3: 64-row blocks");
  static_assert(Shape::kBlockN_ % 16 == 0, "split 3: keys per CTA a multiple of 16");
  using type = BwdWideTraits<Element, kHeadDim, Shape::kStages_, Shape::kBlockN_>;
};

template <class Element, int kHeadDim>
using BwdTraitsFor = typename BwdTraitsSelect<Element, kHeadDim>::type;

}  // namespace flashcute::hopper

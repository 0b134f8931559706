// Dropout's keep bits (dropout.h) for one thread's Ampere-path accumulator fragment, drawn into
// a few registers before the fragment exists and applied once it holds the weights.
//
// The Ampere kernels run near the 255-register cap, and some at a register count that sets
// their CTAs per SM: the Philox calls, unrolled next to a block's scores,
// raised the forward's count (hd 64, sm80 code: 164 to 190) or spilled it (hd 128, sm90 code).
// Drawn here instead, in a loop that is not unrolled (a few calls at a time) and before the
// score GEMM, they need a few registers where the fewest are live, and the kept bits (one per
// weight) are all that waits for the weights.
//
// Fragments in (row, col) view with MaskPolicy::apply's coordinates (row_base +
// offsets_rc(r, c).row, col_base + offsets_rc(r, c).col): rows r, r + 1 (r even) are query rows
// i, i + 8 with i % 16 < 8 and columns c, c + 1 (c even) keys j, j + 1 with j even, as in every
// m16n8 accumulator. Two cases:
// - kWholeGroups: column pairs c, c + 2 (c % 4 == 0) are keys j, j + 8 with j % 16 < 8: the
//   thread holds whole groups of dropout.h's bits (TiledMMAs with warps along M only: the
//   forward, the deterministic dQ pass). One keep_bits() call per group.
// - otherwise: consecutive n8 tiles lie further apart (the backward's S/dP TiledMMA has warps
//   along N too, bwd_traits.h TiledMmaWith), so a thread holds only the keys j, j + 1 of a group
//   and bit 3 of j depends on its warp: one keep_bits() call per (row pair, column pair), 4 of
//   its 8 bits used.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "dropout.h"

namespace flashcute::ampere {

template <int kRows, int kCols>
struct KeepMask {
  static_assert(kRows % 2 == 0 && kCols % 2 == 0, "expected m16n8-shaped accumulator fragments");
  static constexpr int kPairCols = kCols / 2;
  static constexpr int kPairs = kRows / 2 * kPairCols;
  static constexpr int kWords = (kPairs + 7) / 8;
  // Pair p = (r / 2) · kPairCols + c / 2 owns bits 4p .. 4p + 3: (r, c), (r, c + 1), (r + 1, c),
  // (r + 1, c + 1).
  uint32_t words[kWords];

  CUTE_HOST_DEVICE bool kept(int r, int c) const {
    const int bit = 4 * ((r / 2) * kPairCols + c / 2) + 2 * (r % 2) + c % 2;
    return words[bit / 32] >> (bit % 32) & 1u;
  }

  template <bool kWholeGroups, int kIlp = 1, class Offsets>
  CUTE_DEVICE void draw(Dropout const& dropout, Offsets const& offsets_rc, int row_base, int col_base, int bh) {
    using namespace cute;
    static_assert(decltype(size<0>(offsets_rc))::value == kRows && decltype(size<1>(offsets_rc))::value == kCols);
    static_assert(!kWholeGroups || kPairCols % 2 == 0);
    constexpr int kStep = kWholeGroups ? 2 : 1;  // pairs per call
    CUTE_UNROLL
    for (int w = 0; w < kWords; ++w) {
      const int pairs = kPairs - 8 * w < 8 ? kPairs - 8 * w : 8;
      uint32_t word = 0;
      // Not unrolled: kIlp Philox calls in flight (their rounds interleave), whatever the
      // fragment's size.
#pragma unroll 1
      for (int q0 = 0; q0 < pairs; q0 += kStep * kIlp) {
        uint32_t bits[kIlp];
        int keys[kIlp];
        CUTE_UNROLL
        for (int k = 0; k < kIlp; ++k) {
          const int q = q0 + kStep * k < pairs ? q0 + kStep * k : pairs - kStep;
          const int p = 8 * w + q;
          const int r = p / kPairCols * 2, c = p % kPairCols * 2;
          keys[k] = col_base + get<1>(offsets_rc(r, c));
          bits[k] = dropout.keep_bits(row_base + get<0>(offsets_rc(r, c)), keys[k], bh);
        }
        CUTE_UNROLL
        for (int k = 0; k < kIlp; ++k) {
          const int q = q0 + kStep * k;
          if (q >= pairs) continue;
          // Bit e = 4·(row bit 3) + 2·(key bit 3) + (key bit 0) of the group, to pair order.
          if constexpr (kWholeGroups) {
            const uint32_t low = (bits[k] & 3u) | (bits[k] >> 2 & 12u);      // keys j, j + 1
            const uint32_t high = (bits[k] >> 2 & 3u) | (bits[k] >> 4 & 12u);  // keys j + 8, j + 9
            word |= (low | high << 4) << (4 * q);
          } else {
            const uint32_t half = bits[k] >> (uint32_t(keys[k]) >> 2 & 2u);  // this pair's key bit 3
            word |= ((half & 3u) | (half >> 2 & 12u)) << (4 * q);
          }
        }
      }
      words[w] = word;
    }
  }

  // Zeroes the dropped weights of the fragment (fp32 accumulators or their Element copy).
  template <class Weights>
  CUTE_DEVICE void apply(Weights& p_rc) const {
    using Value = typename std::decay_t<Weights>::value_type;
    static_assert(decltype(cute::size<0>(p_rc))::value == kRows && decltype(cute::size<1>(p_rc))::value == kCols);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c)
        if (!kept(r, c)) p_rc(r, c) = Value(0.f);
    }
  }
};

// The keep mask of a fragment whose (row, col) view has the shape of offsets_rc.
template <class Offsets>
using KeepMaskFor = KeepMask<decltype(cute::size<0>(std::declval<Offsets>()))::value,
                             decltype(cute::size<1>(std::declval<Offsets>()))::value>;

}  // namespace flashcute::ampere

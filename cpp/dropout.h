// The P hook: dropout on the attention weights, after the softmax, in the forward and (the same
// mask, regenerated) in the backward, on both paths.
//
// Weight (b, h, i, j) — sequence b, query head h, query row i and key j within the sequence — is
// kept iff its 16-bit random value r satisfies r >= threshold, threshold = round(p · 65536);
// kept weights are scaled by 1 / (1 - p). The values come from Philox4x32-10 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3"), keyed by the seed, so no mask is ever stored.
//
// One Philox call gives 8 values: those of the group of the 8 weights
//   rows {i0, i0 + 8} × keys {j0, j0 + 1, j0 + 8, j0 + 9},  i0 % 16 < 8, j0 % 16 < 8, j0 even,
// which is what one thread holds of an MMA accumulator with queries as rows (m16n8 and m64nN
// fragments). Value e = 4·(i bit 3) + 2·(j bit 3) + (j bit 0) of the group is the low (even e)
// or high (odd e) half of output word e / 2. The call's counter is (key group, row group,
// b · nheads + h, offset low word) with key group = j without bits 0 and 3 (j / 16 · 4 + j / 2 % 4)
// and row group = i without bit 3 (i / 16 · 8 + i % 8); its key is (seed low word, seed high
// word ^ offset high word). flashcute.testing.dropout_keep_mask() computes the same bits.
// A thread holding the transposed accumulator (keys as rows: Sᵀ in a backward) holds half of
// two groups per 8 weights; the lane beside it holds the other halves, so each computes one
// group and they trade them (mask_transposed).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "fragment_views.h"
#include "philox.h"

namespace flashcute {

struct Dropout {
  uint32_t threshold;  // round(p · 65536); 0: off
  float rescale;       // 1 / (1 - p)
  uint32_t key0, key1, offset_lo;

  // Seed and offset from the params' scalars, or from the device pair {seed, offset} where the
  // params point at one (CUDA graphs: the pair is written on the device before each replay).
  template <class KernelParams>
  CUTE_DEVICE static Dropout of(KernelParams const& p) {
    uint64_t seed = p.dropout_seed, offset = p.dropout_offset;
    if (p.dropout_threshold != 0 && p.dropout_rng_state != nullptr) {
      seed = static_cast<uint64_t>(__ldg(p.dropout_rng_state));
      offset = static_cast<uint64_t>(__ldg(p.dropout_rng_state + 1));
    }
    const DropoutKey key = DropoutKey::of(p.dropout_threshold, seed, offset);
    return Dropout{key.threshold, p.dropout_rescale, key.key0, key.key1, key.offset_lo};
  }
  CUTE_HOST_DEVICE bool active() const { return threshold != 0; }

  // Keep bits of the group holding weight (row, key) of slice `bh` (philox.h).
  CUTE_HOST_DEVICE uint32_t keep_bits(int row, int key, int bh) const {
    return DropoutKey{threshold, key0, key1, offset_lo}.keep_bits(row, key, bh);
  }

  // Zeroes the dropped weights of `p`, weights already converted to a 16-bit type (P as the A
  // operand of P·V), straight from the Philox words; scaling by `rescale` is left to the caller
  // (on O). `p` in the accumulator's compact layout, in (row, col) view with MaskPolicy::apply's
  // coordinates (row_base + offsets_rc(r, c) row, col_base + col): rows in pairs (i, i + 8),
  // columns in fours (j, j + 1, j + 8, j + 9), bases 16-aligned apart from the thread's own
  // offset. Word w of a group holds the values of keys (j, j + 1) + 8·(w bit 0) of row
  // i + 8·(w bit 1) in its halves, and those two weights share one 32-bit register of `p`, so
  // one SIMD compare gives that register's mask. Unrolled: the registers are indexed statically,
  // and the group calls interleave.
  template <class Weights16, class Offsets>
  CUTE_DEVICE void apply_words(Weights16& p, Offsets const& offsets_rc, int row_base, int col_base, int bh) const {
    using namespace cute;
    static_assert(sizeof(typename Weights16::value_type) == 2, "expected 16-bit weights");
    constexpr int kRows = decltype(size<0>(offsets_rc))::value;
    constexpr int kCols = decltype(size<1>(offsets_rc))::value;
    static_assert(kRows % 2 == 0 && kCols % 4 == 0, "expected whole groups of columns (j, j + 1, j + 8, j + 9)");
    Tensor words = recast<uint32_t>(p);
    constexpr auto rc = decltype(rowcol_layout(p.layout())){};
    const uint32_t threshold2 = threshold | threshold << 16;
    CUTE_UNROLL
    for (int r = 0; r < kRows; r += 2) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; c += 4) {
        const Philox4x32 g = DropoutKey{threshold, key0, key1, offset_lo}.group_words(
            row_base + get<0>(offsets_rc(r, c)), col_base + get<1>(offsets_rc(r, c)), bh);
        const uint32_t values[4] = {g.x, g.y, g.z, g.w};
        CUTE_UNROLL
        for (int w = 0; w < 4; ++w)
          words(rc(r + (w >> 1), c + (w & 1) * 2) / 2) &= __vcmpgeu2(values[w], threshold2);
      }
    }
  }

  // A thread's keep bits of a fragment in (row, col) view: 4 bits per row pair (r, r + 1) and
  // column pair (c, c + 1), r and c even, in pair order (row pair major), element (r + k, c + q)
  // at bit 2·k + q of its four; 8 pairs per word.
  template <int kRows, int kCols>
  struct Mask {
    static constexpr int kPairs = kRows / 2 * (kCols / 2);
    uint32_t words[(kPairs + 7) / 8];
    CUTE_DEVICE static constexpr int index(int r, int c) { return (r / 2 * (kCols / 2) + c / 2) * 4 + r % 2 * 2 + c % 2; }
    CUTE_DEVICE bool kept(int r, int c) const { return words[index(r, c) / 32] >> (index(r, c) % 32) & 1u; }
    // From all of a thread's bits in one word.
    CUTE_DEVICE static Mask of_bits(uint64_t bits) {
      static_assert(kPairs * 4 <= 64, "at most 64 keep bits per thread");
      Mask m;
      CUTE_UNROLL
      for (int w = 0; w < int(sizeof(m.words) / 4); ++w) m.words[w] = uint32_t(bits >> (32 * w));
      return m;
    }
  };

  // The keep bits of a fragment with queries as rows whose columns come in pairs (j, j + 1),
  // j even, the pairs 8 keys apart (m64nN accumulators), from any multiple of 8 past the
  // thread's own offset (a consumer's keys that start 8 past a multiple of 16: the hd 256
  // backward's second consumer, at key 40). One keep_bits() per row pair covers the column
  // pairs at keys j and j + 8 where j bit 3 is clear, or a pair alone at either end: 3 calls
  // for 5 column pairs. A rolled loop, so the code holds one Philox body (unrolled, the hd 256
  // backward spilled).
  template <class Offsets>
  CUTE_DEVICE auto mask_by_key_groups(Offsets const& offsets_rc, int row_base, int col_base, int bh) const {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(offsets_rc))::value;
    constexpr int kCols = decltype(size<1>(offsets_rc))::value;
    static_assert(kRows % 2 == 0 && kCols % 2 == 0, "expected m16n8-shaped accumulator fragments");
    using M = Mask<kRows, kCols>;
    constexpr int kColPairs = kCols / 2;
    auto key_of = [&](int q) { return col_base + get<1>(offsets_rc(0, 2 * q)); };
    // Calls per row pair: the first pair alone where its key bit 3 is set, then pairs of pairs.
    const int odd = key_of(0) >> 3 & 1;
    const int calls = (kColPairs + odd + 1) / 2;
    uint64_t bits = 0;
#pragma unroll 1
    for (int t = 0; t < kRows / 2 * calls; ++t) {
      const int row_pair = t / calls, call = t % calls;
      const int q = call == 0 ? 0 : 2 * call - odd;  // the call's first column pair
      const int r = 2 * row_pair;
      const int key = key_of(q);
      const uint32_t group = keep_bits(row_base + get<0>(offsets_rc(r, 2 * q)), key, bh);
      // Pair of key bit 3 = h: group bits 4·(row bit 3) + 2h + (key bit 0), packed to bit
      // 2·(row bit 3) + key bit 0 (Mask's order).
      auto nibble = [&](int h) { return uint64_t((group >> 2 * h & 3u) | (group >> (2 * h + 2) & 0xCu)); };
      const int h = key >> 3 & 1;
      const int pair = row_pair * kColPairs + q;
      bits |= nibble(h) << (4 * pair);
      if (h == 0 && q + 1 < kColPairs) bits |= nibble(1) << (4 * (pair + 1));
    }
    return M::of_bits(bits);
  }

  // The keep bits of a transposed fragment (keys as rows, queries as columns: Sᵀ in a
  // backward), in (row, col) view with MaskPolicy::apply_transposed's coordinates (key_base +
  // offsets_rc(r, c) row, query_base + col): rows in pairs (j, j + 8), columns in fours (i,
  // i + 1, i + 8, i + 9), bases 16-aligned apart from the thread's own offset. Such a thread
  // holds half of group (i, j) and half of group (i + 1, j): it computes the group of query
  // i + (j bit 0), and the lane holding key j ^ 1 of the same queries (lane ^ 4 in MMA
  // accumulator layouts) the other one; the two trade them with one shuffle, so each group
  // costs one keep_bits() as in the forward. All 32 lanes of the warp call it together.
  // Fragment group g (row pair g / (kCols / 4), column four g % (kCols / 4)) fills bits 8g to
  // 8g + 7 of the mask. At most kAtOnce groups are drawn at once (0: all): fewer keep fewer
  // Philox states live where the caller holds most registers already.
  template <int kAtOnce = 0, class Offsets>
  CUTE_DEVICE auto mask_transposed(Offsets const& offsets_rc, int key_base, int query_base, int bh) const {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(offsets_rc))::value;
    constexpr int kCols = decltype(size<1>(offsets_rc))::value;
    static_assert(kRows % 2 == 0 && kCols % 4 == 0, "expected m16n8-shaped accumulator fragments");
    constexpr int kGroups = kRows / 2 * (kCols / 4);
    static_assert(kGroups <= 8, "at most 64 keep bits per thread");
    constexpr int kDrawn = kAtOnce > 0 && kAtOnce < kGroups ? kAtOnce : kGroups;
    static_assert(kGroups % kDrawn == 0, "whole rounds of groups");
    uint64_t bits = 0;
#pragma unroll 1
    for (int g0 = 0; g0 < kGroups; g0 += kDrawn) {
      CUTE_UNROLL
      for (int u = 0; u < kDrawn; ++u) {
        const int g = g0 + u;
        const int r = g / (kCols / 4) * 2, c = g % (kCols / 4) * 4;
        const int key = key_base + get<0>(offsets_rc(r, c));
        const int query = query_base + get<1>(offsets_rc(r, c));  // even, bit 3 clear
        const uint32_t key_odd = uint32_t(key) & 1u;
        const uint32_t mine = keep_bits(query + int(key_odd), key, bh);
        const uint32_t theirs = __shfl_xor_sync(0xffffffffu, mine, 4);
        // Groups of queries i and i + 1, shifted so that bit 2·(2·(query bit 3) + key bit 3)
        // is this thread's key's.
        const uint32_t even = (key_odd ? theirs : mine) >> key_odd;
        const uint32_t odd = (key_odd ? mine : theirs) >> key_odd;
        uint32_t chunk = 0;
        CUTE_UNROLL
        for (int k = 0; k < 2; ++k) {      // key j + 8k: row r + k
          CUTE_UNROLL
          for (int q = 0; q < 4; ++q) {    // query i, i + 1, i + 8, i + 9: column c + q
            const uint32_t bit = ((q & 1) ? odd : even) >> (2 * (2 * (q >> 1) + k)) & 1u;
            chunk |= bit << ((q >> 1) * 4 + 2 * k + (q & 1));  // Mask::index(r + k, c + q) - 8g
          }
        }
        bits |= uint64_t(chunk) << (8 * g);
      }
    }
    return Mask<kRows, kCols>::of_bits(bits);
  }
};

}  // namespace flashcute

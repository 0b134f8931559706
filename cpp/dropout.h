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
// two groups per 8 weights: keep_bits() of both, half of each used.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace flashcute {

struct Philox4x32 {
  uint32_t x, y, z, w;
};

// Philox4x32 with 10 rounds: counter (c0..c3), key (k0, k1).
CUTE_HOST_DEVICE Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                          uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  CUTE_UNROLL
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0;  // one wide multiply gives both halves
    const uint64_t p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

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
    return Dropout{p.dropout_threshold, p.dropout_rescale, uint32_t(seed),
                   uint32_t(seed >> 32) ^ uint32_t(offset >> 32), uint32_t(offset)};
  }
  CUTE_HOST_DEVICE bool active() const { return threshold != 0; }

  // Keep bits of the group holding weight (row, key) of slice `bh` (b · nheads + h): bit e as in
  // the header (row's bit 3 and key's bits 0 and 3 select the bit; the rest select the group).
  CUTE_HOST_DEVICE uint32_t keep_bits(int row, int key, int bh) const {
    const uint32_t key_group = uint32_t(key >> 4) << 2 | (uint32_t(key) >> 1 & 3u);
    const uint32_t row_group = uint32_t(row >> 4) << 3 | (uint32_t(row) & 7u);
    const Philox4x32 r = philox4x32_10(key_group, row_group, uint32_t(bh), offset_lo, key0, key1);
    const uint32_t hi_threshold = threshold << 16;
    const uint32_t words[4] = {r.x, r.y, r.z, r.w};
    uint32_t bits = 0;
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) {
      bits |= uint32_t((words[w] & 0xFFFFu) >= threshold) << (2 * w);
      bits |= uint32_t(words[w] >= hi_threshold) << (2 * w + 1);
    }
    return bits;
  }

  // Zeroes the dropped weights of a thread's accumulator fragment with queries as rows, in
  // (row, col) view with MaskPolicy::apply's coordinates (row_base + offsets_rc(r, c) row, col_base
  // + col): rows in pairs (i, i + 8), columns in fours (j, j + 1, j + 8, j + 9), bases 16-aligned
  // apart from the thread's own offset. Scaling by `rescale` is left to the caller (on O, dV).
  template <class Weights, class Offsets>
  CUTE_DEVICE void apply(Weights& p_rc, Offsets const& offsets_rc, int row_base, int col_base, int bh) const {
    using namespace cute;
    constexpr int kRows = decltype(size<0>(p_rc))::value;
    constexpr int kCols = decltype(size<1>(p_rc))::value;
    static_assert(kRows % 2 == 0 && kCols % 4 == 0, "expected m16n8-shaped accumulator fragments");
    CUTE_UNROLL
    for (int r = 0; r < kRows; r += 2) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; c += 4) {
        const uint32_t bits = keep_bits(row_base + get<0>(offsets_rc(r, c)), col_base + get<1>(offsets_rc(r, c)), bh);
        CUTE_UNROLL
        for (int e = 0; e < 8; ++e) {
          // e = 4·(row bit 3) + 2·(key bit 3) + key bit 0: fragment (r + e/4, c + e%4 reordered)
          const int rr = r + (e >> 2), cc = c + ((e >> 1) & 1) * 2 + (e & 1);
          if (!(bits >> e & 1u)) p_rc(rr, cc) = 0.f;
        }
      }
    }
  }
};

}  // namespace flashcute

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") and the dropout
// keep bits drawn from it (dropout.h has the bit layout). Plain C++: the kernels and the host
// test hook compile the same code.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace flashcute {

struct Philox4x32 {
  uint32_t x, y, z, w;
};

// Counter (c0..c3), key (k0, k1).
FLASHCUTE_HOST_DEVICE Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                               uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
#if defined(__CUDA_ARCH__)
    // High and low halves as two 32-bit products: ptxas fuses them into one IMAD.WIDE.U32; a
    // 64-bit product of widened operands left an add of the zero cross terms per multiply.
    const uint32_t hi0 = __umulhi(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = __umulhi(kMul1, c2), lo1 = kMul1 * c2;
#else
    const uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
#endif
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

// The dropout key: the threshold round(p · 65536) and the Philox key and counter word that the
// seed and offset give (key = (seed low, seed high ^ offset high), counter word 3 = offset low).
struct DropoutKey {
  uint32_t threshold;
  uint32_t key0, key1, offset_lo;

  static FLASHCUTE_HOST_DEVICE DropoutKey of(uint32_t threshold, uint64_t seed, uint64_t offset) {
    return DropoutKey{threshold, uint32_t(seed), uint32_t(seed >> 32) ^ uint32_t(offset >> 32), uint32_t(offset)};
  }

  // The random words of the group holding weight (row, key) of slice `bh` (b · nheads + h):
  // word w holds the values of bits 2w (low half) and 2w + 1 (high half) of keep_bits().
  FLASHCUTE_HOST_DEVICE Philox4x32 group_words(int row, int key, int bh) const {
    const uint32_t key_group = uint32_t(key >> 4) << 2 | (uint32_t(key) >> 1 & 3u);
    const uint32_t row_group = uint32_t(row >> 4) << 3 | (uint32_t(row) & 7u);
    return philox4x32_10(key_group, row_group, uint32_t(bh), offset_lo, key0, key1);
  }

  // Keep bits of the group holding weight (row, key) of slice `bh` (b · nheads + h): bit e =
  // 4·(row bit 3) + 2·(key bit 3) + (key bit 0); the other bits select the group.
  FLASHCUTE_HOST_DEVICE uint32_t keep_bits(int row, int key, int bh) const {
    const Philox4x32 r = group_words(row, key, bh);
    const uint32_t hi_threshold = threshold << 16;
    const uint32_t words[4] = {r.x, r.y, r.z, r.w};
    uint32_t bits = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int w = 0; w < 4; ++w) {
      bits |= uint32_t((words[w] & 0xFFFFu) >= threshold) << (2 * w);
      bits |= uint32_t(words[w] >= hi_threshold) << (2 * w + 1);
    }
    return bits;
  }
};

}  // namespace flashcute

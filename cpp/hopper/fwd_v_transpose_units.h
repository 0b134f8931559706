// Where the V transpose's units lie in shared memory (fwd_v_transpose.h). A unit is 16 keys x
// 32 columns of an 8-bit V stage (keys, hdv), read by one ldmatrix.x4.trans, and the same
// 32 columns x 16 keys of the transposed stage (hdv, keys), written by one stmatrix.x4.
//
// Both stages are swizzled K-major tiles: within a swizzle atom (8 rows of W bytes), a row's
// 16-byte chunks are permuted by XOR with the row's index. A unit starts at a multiple of 8
// rows, so it sees the same permutation as unit 0: a lane's address in unit u is its address in
// unit 0 with the unit's column bits inside the atom XORed in, plus the start of the unit's
// rows (and atom): per unit one XOR, and the rows are the load's immediate offset.
// tests/host_plans/fp8_transpose.cu checks this against CuTe's layouts for every lane and unit.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace flashcute::hopper {

template <class Traits>
struct TransposeUnits {
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kUnits = kBlockN / 16 * (kHeadDimV / 32);
  // Columns (V) and keys (transposed V) per swizzle atom row: the XORed bits lie below them.
  static constexpr int kAtomColsV = decltype(cute::size<1>(typename Traits::SmemAtomV{}))::value;
  static constexpr int kAtomKeysVt = decltype(cute::size<1>(typename Traits::SmemAtomVt{}))::value;
  static constexpr uint32_t kVStageBytes = kBlockN * kHeadDimV, kVtStageBytes = kBlockN * kHeadDimV;
  static_assert(sizeof(typename Traits::ElementV) == 1 && kBlockN % 16 == 0 && kHeadDimV % 32 == 0);
  static_assert(cute::cosize_v<typename Traits::SmemLayoutV> == Traits::kStages * kVStageBytes &&
                cute::cosize_v<typename Traits::SmemLayoutVtBuffer> == Traits::kStages * kVtStageBytes &&
                kVStageBytes % 1024 == 0, "stages of whole 1024-byte swizzle periods");

  // Unit u: keys key0(u).., columns col0(u)..
  CUTE_HOST_DEVICE static constexpr int key0(int unit) { return unit % (kBlockN / 16) * 16; }
  CUTE_HOST_DEVICE static constexpr int col0(int unit) { return unit / (kBlockN / 16) * 32; }

  // Lane l's row of its ldmatrix / stmatrix matrix m = l / 8, r = l % 8: matrices 0-3 are (keys
  // 0-7, cols 0-15), (keys 8-15, cols 0-15), (keys 0-7, cols 16-31), (keys 8-15, cols 16-31) of a
  // unit on the way in; on the way out, matrix m's row r is column 16 (m >> 1) + 2r + 1 when
  // (m & 1) differs from r >= 4, else the even one before it (fwd_v_transpose.h says why).
  CUTE_HOST_DEVICE static constexpr int load_key(int lane) { return 8 * (lane / 8 & 1) + lane % 8; }
  CUTE_HOST_DEVICE static constexpr int load_col(int lane) { return 16 * (lane / 16); }
  CUTE_HOST_DEVICE static constexpr int store_col(int lane) {
    return 16 * (lane / 16) + 2 * (lane % 8) + ((lane / 8 & 1) ^ (lane % 8 >> 2));
  }

  // Lane offsets in unit 0 of stage 0 (bytes), computed once.
  CUTE_HOST_DEVICE static int v_lane(int lane) {
    return typename Traits::SmemLayoutV{}(load_key(lane), load_col(lane), 0);
  }
  CUTE_HOST_DEVICE static int vt_lane(int lane) {
    return typename Traits::SmemLayoutVtBuffer{}(store_col(lane), 0, 0);
  }
  // Unit u's bits XORed into a lane's offset, and the start of its rows (compile-time where u is).
  CUTE_HOST_DEVICE static constexpr uint32_t v_xor(int unit) { return col0(unit) % kAtomColsV; }
  CUTE_HOST_DEVICE static uint32_t v_rows(int unit) {
    return typename Traits::SmemLayoutV{}(key0(unit), col0(unit) - col0(unit) % kAtomColsV, 0);
  }
  CUTE_HOST_DEVICE static constexpr uint32_t vt_xor(int unit) { return key0(unit) % kAtomKeysVt; }
  CUTE_HOST_DEVICE static uint32_t vt_rows(int unit) {
    return typename Traits::SmemLayoutVtBuffer{}(col0(unit), key0(unit) - key0(unit) % kAtomKeysVt, 0);
  }

  // Units b + j · kBaseUnits (j < kAtomsV) are unit b in V's next swizzle atoms (columns
  // kAtomColsV further): the same bits, their rows kVAtomStep and kVtAtomStep further.
  static constexpr int kAtomsV = kHeadDimV / kAtomColsV;
  static constexpr int kBaseUnits = kUnits / kAtomsV;
  static_assert(kHeadDimV % kAtomColsV == 0);
  CUTE_HOST_DEVICE static uint32_t v_atom_step() { return v_rows(kBaseUnits) - v_rows(0); }
  CUTE_HOST_DEVICE static uint32_t vt_atom_step() { return vt_rows(kBaseUnits) - vt_rows(0); }
};

}  // namespace flashcute::hopper

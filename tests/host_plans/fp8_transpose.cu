// Checks the FP8 V transpose's unit addresses (cpp/hopper/fwd_v_transpose_units.h) on the host:
// for every lane, unit and stage of each 8-bit tile shape, a lane's offset in unit 0 XOR the
// unit's bits plus its rows (plus the stage's bytes) is where CuTe's layouts put that lane's
// row of V and of transposed V, and so is the same unit reached from its base unit in V's
// first swizzle atom. Host code only; prints "ok" or the first failure.
#include <cstdio>

#include "hopper/fwd_traits.h"
#include "hopper/fwd_v_transpose_units.h"

using flashcute::hopper::FwdTraits;
using flashcute::hopper::TransposeUnits;

template <int kHeadDim, int kBlockN, int kStages, int kConsumers>
static bool check() {
  using Traits =
      FwdTraits<cutlass::float_e4m3_t, kHeadDim, kBlockN, kStages, kConsumers, kHeadDim, cutlass::bfloat16_t>;
  using Units = TransposeUnits<Traits>;
  typename Traits::SmemLayoutV v;
  typename Traits::SmemLayoutVtBuffer vt;
  for (int stage = 0; stage < kStages; ++stage) {
    for (int unit = 0; unit < Units::kUnits; ++unit) {
      for (int lane = 0; lane < 32; ++lane) {
        const int key0 = Units::key0(unit), col0 = Units::col0(unit);
        const uint32_t v_want = v(key0 + Units::load_key(lane), col0 + Units::load_col(lane), stage);
        const uint32_t v_got = ((Units::v_lane(lane) + stage * Units::kVStageBytes) ^ Units::v_xor(unit)) +
                               Units::v_rows(unit);
        const uint32_t vt_want = vt(col0 + Units::store_col(lane), key0, stage);
        const uint32_t vt_got = ((Units::vt_lane(lane) + stage * Units::kVtStageBytes) ^ Units::vt_xor(unit)) +
                                Units::vt_rows(unit);
        // The same unit through its base unit in V's first atom (the transposing warps' lean walk).
        const int base = unit % Units::kBaseUnits, atom = unit / Units::kBaseUnits;
        const uint32_t v_sib = ((Units::v_lane(lane) + stage * Units::kVStageBytes) ^ Units::v_xor(base)) +
                               Units::v_rows(base) + atom * Units::v_atom_step();
        const uint32_t vt_sib = ((Units::vt_lane(lane) + stage * Units::kVtStageBytes) ^ Units::vt_xor(base)) +
                                Units::vt_rows(base) + atom * Units::vt_atom_step();
        if (v_got != v_want || vt_got != vt_want || v_sib != v_want || vt_sib != vt_want) {
          std::printf("hd %d, keys %d: stage %d unit %d lane %d: V %u / %u (want %u), Vt %u / %u (want %u)\n", kHeadDim,
                      kBlockN, stage, unit, lane, v_got, v_sib, v_want, vt_got, vt_sib, vt_want);
          return false;
        }
      }
    }
  }
  return true;
}

int main() {
  const bool ok = check<64, 128, 2, 3>() && check<64, 64, 2, 3>() && check<128, 64, 2, 3>() &&
                  check<128, 128, 2, 2>() && check<256, 64, 2, 2>() && check<256, 128, 2, 2>();
  std::printf(ok ? "ok\n" : "");
  return ok ? 0 : 1;
}

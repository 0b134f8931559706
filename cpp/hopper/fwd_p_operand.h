// P, the softmax weights, as the register A operand of O += P·V.
//
// 16-bit: the S accumulator's registers are already the A operand's (fragment_views.h), so P
// is the accumulator converted in place, in its own layout.
//
// 8-bit: an m64k32 A fragment holds, per thread, keys 4t..4t+3 and 16+4t..16+4t+3 of each
// 32 (t = lane % 4), but the accumulator holds keys 2t, 2t+1, 8+2t, 9+2t (+16). Instead of
// moving bytes between threads, each thread puts its own accumulator values into the A slots in
// order, and the V transpose (fwd_v_transpose.h) stores V's keys in the matching order: A
// column 4t+j of a 16-key group holds key kFp8KeyOfColumn(4t+j) = 2t + (j & 1) + 8 (j >> 1).
#pragma once

#include <cute/tensor.hpp>

#include "fragment_views.h"

namespace flashcute::hopper {

CUTE_HOST_DEVICE constexpr int fp8_key_of_column(int column) {  // within a 16-key group
  return column / 4 * 2 + (column & 1) + (column & 2) * 4;
}

template <class Traits, bool kEightBit = sizeof(typename Traits::ElementP) == 1>
struct POperand;

template <class Traits>
struct POperand<Traits, false> {
  using ElementP = typename Traits::ElementP;
  using AccS = decltype(cute::partition_fragment_C(typename Traits::TiledMmaQK{}, typename Traits::TileS{}));
  using Regs = decltype(cute::make_tensor<ElementP>(cute::make_layout(cute::shape(AccS{}))));
  Regs regs;  // in the accumulator's layout (dropout addresses it so)

  CUTE_DEVICE auto a() { return cute::make_tensor(regs.data(), acc_to_a_operand_layout(regs.layout())); }
  template <class Acc>
  CUTE_DEVICE void set(Acc const& acc_s) { convert_fragment_into(acc_s, regs); }
};

template <class Traits>
struct POperand<Traits, true> {
  using ElementP = typename Traits::ElementP;
  // ((4 keys, 2 row halves, 2 key halves), 1, keys / 32)
  using Regs = decltype(cute::make_tensor<ElementP>(cute::partition_shape_A(
      typename Traits::TiledMmaPV{}, cute::Shape<cute::Int<Traits::kRowsPerConsumer>, cute::Int<Traits::kBlockN>>{})));
  Regs regs;

  CUTE_DEVICE Regs& a() { return regs; }
  // acc_s ((2 cols, 2 row halves, N/8), 1, 1): register (h, k2, kb) of the A fragment holds
  // values (0..3, h, k2, kb), which are accumulator values (0..1, h, 2 (2 kb + k2) + 0..1), as
  // fp8_key_of_column says: two pair conversions and one move per register.
  template <class Acc>
  CUTE_DEVICE void set(Acc const& acc_s) {
    using namespace cute;
    static_assert(sizeof(ElementP) == 1 && decltype(size<2>(Regs{}))::value * 4 == decltype(size<0, 2>(Acc{}))::value);
    Tensor words = recast<uint32_t>(regs);  // (h, k2, kb) in the fragment's order
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(regs); ++kb) {
      CUTE_UNROLL
      for (int k2 = 0; k2 < 2; ++k2) {
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int chunk = 2 * (2 * kb + k2);
          words(h + 2 * k2 + 4 * kb) =
              pack_e4m3x4(acc_s(make_coord(0, h, chunk), 0, 0), acc_s(make_coord(1, h, chunk), 0, 0),
                          acc_s(make_coord(0, h, chunk + 1), 0, 0), acc_s(make_coord(1, h, chunk + 1), 0, 0));
        }
      }
    }
  }

  // Four floats rounded to e4m3 (saturating), the first in the lowest byte.
  CUTE_DEVICE static uint32_t pack_e4m3x4(float a, float b, float c, float d) {
    uint32_t out;
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}"
        : "=r"(out)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return out;
  }
};

}  // namespace flashcute::hopper

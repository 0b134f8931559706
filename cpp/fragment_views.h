// Views of MMA register fragments used by the attention kernels: Ampere mma.sync m16n8
// accumulators ((2, 2), MMA_M, MMA_N) and Hopper WGMMA accumulators ((2, 2, N/8), MMA_M, MMA_N).
// Both put a thread's values at rows r, r+8 and column pairs of each 8-column group, so the
// same softmax, mask and P conversion code serves both paths.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace flashcute {

// Accumulator fragment ((2 cols, 2 rows), MMA_M, MMA_N) viewed as (rows, cols) so that softmax
// and masking can address a thread's values by row: rows = (2, MMA_M), cols = (2, MMA_N).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout const& acc) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3);
  if constexpr (rank<0>(Layout{}) == 3) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  } else {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<2>(acc)));
  }
}

template <class Tensor>
CUTE_HOST_DEVICE auto rowcol_view(Tensor&& t) {
  return cute::make_tensor(t.data(), rowcol_layout(t.layout()));
}

// The accumulator of S = Q·Kᵀ reinterpreted as the A operand of O += P·V: two adjacent n8
// accumulator tiles hold exactly the values of one k16 A tile, so P never leaves registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_to_a_operand_layout(Layout const& acc) {
  using namespace cute;
  if constexpr (rank<0>(Layout{}) == 3) {
    // WGMMA: ((2,2,N/8), M, N) -> ((2,2,2), M, N/16): the k16 A tile of the register-sourced
    // P·V GEMM.
    auto split = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(split), get<1>(split), get<2, 0>(split)), get<1>(acc),
                       coalesce(make_layout(get<2, 1>(split), get<2>(acc))));
  } else {
    auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
    return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split),
                       get<2, 1>(split));
  }
}

// Element-wise conversion of a register fragment into another of the same size (e.g. float
// accumulators to fp16/bf16), in packed 2-wide conversions.
template <class Src, class Dst>
CUTE_DEVICE void convert_fragment_into(Src const& t, Dst&& out) {
  using From = typename std::decay_t<Src>::value_type;
  using To = typename std::decay_t<Dst>::value_type;
  constexpr int N = decltype(cute::size(t))::value;
  static_assert(N % 2 == 0 && N == decltype(cute::size(out))::value);
  cutlass::NumericArrayConverter<To, From, 2> convert;
  CUTE_UNROLL
  for (int i = 0; i < N; i += 2) {
    cutlass::Array<From, 2> pair;
    pair[0] = t(i);
    pair[1] = t(i + 1);
    cutlass::Array<To, 2> converted = convert(pair);
    out(i) = converted[0];
    out(i + 1) = converted[1];
  }
}

template <class To, class Tensor>
CUTE_DEVICE auto convert_fragment(Tensor const& t) {
  auto out = cute::make_tensor<To>(cute::make_layout(t.shape()));  // compact, same coordinates
  convert_fragment_into(t, out);
  return out;
}

}  // namespace flashcute

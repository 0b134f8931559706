// Views of MMA register fragments used by the attention kernels (Ampere mma.sync m16n8 layouts).
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
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<2>(acc)));
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
  auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split),
                     get<2, 1>(split));
}

// Element-wise conversion of a register fragment (e.g. float accumulators to fp16/bf16).
template <class To, class Tensor>
CUTE_DEVICE auto convert_fragment(Tensor const& t) {
  using From = typename Tensor::value_type;
  constexpr int N = decltype(cute::size(t))::value;
  static_assert(N % 2 == 0);
  auto out = cute::make_tensor<To>(cute::make_layout(t.shape()));  // compact, same coordinates
  cutlass::NumericArrayConverter<To, From, 2> convert;  // packed 2-wide conversions
  CUTE_UNROLL
  for (int i = 0; i < N; i += 2) {
    cutlass::Array<From, 2> pair;
    pair[0] = t(i);
    pair[1] = t(i + 1);
    cutlass::Array<To, 2> converted = convert(pair);
    out(i) = converted[0];
    out(i + 1) = converted[1];
  }
  return out;
}

}  // namespace flashcute

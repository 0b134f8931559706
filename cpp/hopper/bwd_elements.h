// Element types of the Hopper-path backward's operands, for both designs' traits
// (bwd_traits.h, bwd_wide_traits.h). All are the call's dtype; each use names its operand, so
// that one can change without hunting for the others. A buffer, TMA type or MMA that serves
// two operands (Q's layout also dO's, K's also V's, one MMA for S = Q·Kᵀ and dP = dO·Vᵀ) needs
// their types equal, which the assertion below states.
#pragma once

#include <type_traits>

namespace flashcute::hopper {

template <class Element>
struct BwdElements {
  using ElementQK = Element;    // Q and K
  using ElementV = Element;     // V
  using ElementO = Element;     // the forward's O and its gradient dO
  using ElementGrad = Element;  // the dQ, dK and dV outputs
  using ElementP = Element;     // P and dS as GEMM operands (dV, dK, dQ)
  static_assert(std::is_same_v<ElementO, ElementQK> && std::is_same_v<ElementV, ElementQK>,
                "dO shares Q's buffers and V shares K's: their types must agree");
};

}  // namespace flashcute::hopper

// The score hook: what happens to a block's raw scores q·k between the GEMM and the mask, in
// the forward and (differentiated) in the backward, on both paths.
//
// Softcap: the scaled score s = softmax_scale·q·k becomes cap·tanh(s / cap). The kernels keep
// scores unscaled (the softmax folds the scale into exp2), so the hook maps a raw score x to
// softcap_out·tanh(softcap_in·x) with softcap_in = scale / cap and softcap_out = cap / scale,
// whose scaled value is exactly the capped score. Off (softcap_in == 0), it costs the forwards
// one uniform branch per block; the backwards, at their register limits, compile it in only
// where a template switch asks for it (hopper/bwd_kernel.h, ampere/bwd_kernel.h).
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

CUTE_DEVICE float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct ScoreHook {
  float softcap_in, softcap_out;

  template <class KernelParams>
  CUTE_HOST_DEVICE static ScoreHook of(KernelParams const& p) {
    return ScoreHook{p.softcap_in, p.softcap_out};
  }
  CUTE_HOST_DEVICE bool active() const { return softcap_in != 0.f; }

  CUTE_DEVICE float score(float raw) const { return softcap_out * fast_tanh(softcap_in * raw); }

  // Raw scores of a block, in place (any view of the thread's fragment).
  template <class Scores>
  CUTE_DEVICE void apply(Scores& scores) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) scores(i) = score(scores(i));
  }

  // The backward's chain factor d(hooked score)/d(raw score) = 1 - tanh², recovered from the
  // weight p = exp2(hooked · scale_log2 - lse_log2) it produced, so no second fragment stays
  // live across the dP GEMM. A weight of 0 (masked or underflowed) gives factor 0; its dS is
  // 0 whatever the factor.
  CUTE_DEVICE float grad_factor(float p, float lse_log2, float inv_scale_log2) const {
    const float t = (fast_log2(p) + lse_log2) * inv_scale_log2 * softcap_in;
    return fmaxf(1.f - t * t, 0.f);
  }
};

}  // namespace flashcute

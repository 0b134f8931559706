// The score hook: what happens to a block's raw scores q·k between the GEMM and the mask, in
// the forward and (differentiated) in the backward, on both paths. In the scaled units of the
// softmax (s = softmax_scale·q·k) the order is: softcap, then ALiBi's bias, then the mask.
//
// Softcap: s becomes cap·tanh(s / cap). The kernels keep scores unscaled (the softmax folds the
// scale into exp2), so the hook maps a raw score x to softcap_out·tanh(softcap_in·x) with
// softcap_in = scale / cap and softcap_out = cap / scale, whose scaled value is exactly the
// capped score.
// ALiBi: s gains -slope·|i + seqlen_k - seqlen_q - j| for query row i and key j, slope per
// (batch, head); in raw units that is alibi_slope()·|distance| with alibi_slope() =
// -slope / scale (alibi_scale = -1 / scale is folded on the host). The distance's offset is the
// mask's (MaskPolicy::offset()), so both follow the same sequence lengths.
//
// Off (softcap_in == 0, no slopes), the hook costs the forwards one uniform branch per block;
// the backwards, at their register limits, compile it in only where a template switch asks for
// it (hopper/bwd_kernel.h, ampere/bwd_kernel.h, ampere/bwd_dq_kernel.h). The slope is read
// where it is used (an L1 hit after the first block), so no register holds it where the hook
// is off.
#pragma once

#include <cstdint>

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
  const float* alibi_slopes;   // (batch, nheads) float32 with alibi_batch_stride, or null: no ALiBi
  int64_t alibi_batch_stride;  // 0: one row of slopes for every batch
  float alibi_scale;           // -1 / softmax_scale

  template <class KernelParams>
  CUTE_HOST_DEVICE static ScoreHook of(KernelParams const& p) {
    return ScoreHook{p.softcap_in, p.softcap_out, p.alibi_slopes, p.alibi_batch_stride, p.alibi_scale};
  }
  CUTE_HOST_DEVICE bool softcap() const { return softcap_in != 0.f; }
  CUTE_HOST_DEVICE bool alibi() const { return alibi_slopes != nullptr; }
  CUTE_HOST_DEVICE bool active() const { return softcap() || alibi(); }

  // ALiBi's bias per unit of distance for query head `head` of `batch`, in raw-score units
  // (-slope / softmax_scale); 0 without ALiBi.
  CUTE_DEVICE float alibi_slope(int batch, int head) const {
    if (!alibi()) return 0.f;
    return __ldg(alibi_slopes + batch * alibi_batch_stride + head) * alibi_scale;
  }

  // Softcap of one raw score, in place; returns its chain factor 1 - tanh².
  CUTE_DEVICE float cap(float& score) const {
    const float t = fast_tanh(softcap_in * score);
    score = softcap_out * t;
    return 1.f - t * t;
  }

  // scores_rc: a thread's raw scores in (row, col) view, with the coordinates of
  // MaskPolicy::apply (row_base + offsets_rc(r, c).row, col_base + offsets_rc(r, c).col);
  // offset = seqlen_k - seqlen_q (MaskPolicy::offset()), slope = alibi_slope(batch, head).
  template <class Scores, class Offsets>
  CUTE_DEVICE void apply(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base, int offset,
                         float slope) const {
    if (softcap()) apply_softcap(scores_rc);
    if (alibi()) add_alibi(scores_rc, offsets_rc, row_base, col_base, offset, slope);
  }

  // Softcap alone, in place (any view of the fragment).
  template <class Scores>
  CUTE_DEVICE void apply_softcap(Scores& scores) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) cap(scores(i));
  }

  // ALiBi's half of apply (the softcap done): the distances fold to one conversion per
  // block and immediates.
  template <class Scores, class Offsets>
  CUTE_DEVICE static void add_alibi(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base,
                                    int offset, float slope) {
    const float base = float(row_base + offset - col_base);
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c)
        scores_rc(r, c) = fmaf(slope, fabsf(base + distance(offsets_rc, r, c)), scores_rc(r, c));
    }
  }

  // The same on transposed scores (rows are keys, columns query rows; MaskPolicy::apply_transposed).
  template <class Scores, class Offsets>
  CUTE_DEVICE void apply_transposed(Scores& scores_rc, Offsets const& offsets_rc, int key_base, int row_base,
                                    int offset, float slope) const {
    if (softcap()) apply_softcap(scores_rc);
    if (alibi()) {
      const float base = float(row_base + offset - key_base);
      CUTE_UNROLL
      for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(scores_rc); ++c)
          scores_rc(r, c) = fmaf(slope, fabsf(base - distance(offsets_rc, r, c)), scores_rc(r, c));
      }
    }
  }

  // Score (r, c)'s ALiBi bias in raw units, with base = float(row_base + offset - col_base)
  // as in apply (transposed: float(row_base + offset - key_base) and -1 for `sign`).
  template <class Offsets>
  CUTE_DEVICE static float alibi_bias(float slope, float base, Offsets const& offsets_rc, int r, int c,
                                      float sign = 1.f) {
    return slope * fabsf(base + sign * distance(offsets_rc, r, c));
  }

  // The backward's chain factor d(hooked score)/d(raw score) = 1 - tanh², recovered from the
  // weight p = exp2(hooked · scale_log2 - lse_log2) it produced, so no second fragment stays
  // live across the dP GEMM; `bias` is the score's ALiBi bias in raw units (0 without ALiBi),
  // which the tanh lies under. A weight of 0 (masked or underflowed) gives factor 0; its dS is
  // 0 whatever the factor. Without softcap (softcap_in == 0) the factor is 1 where p > 0.
  CUTE_DEVICE float grad_factor(float p, float lse_log2, float inv_scale_log2, float bias) const {
    const float t = fmaf(fast_log2(p) + lse_log2, inv_scale_log2, -bias) * softcap_in;
    return fmaxf(1.f - t * t, 0.f);
  }
  // The same without ALiBi.
  CUTE_DEVICE float grad_factor(float p, float lse_log2, float inv_scale_log2) const {
    const float t = (fast_log2(p) + lse_log2) * inv_scale_log2 * softcap_in;
    return fmaxf(1.f - t * t, 0.f);
  }

 private:
  // Row offset minus column offset of score (r, c): a compile-time constant.
  template <class Offsets>
  CUTE_DEVICE static float distance(Offsets const& offsets_rc, int r, int c) {
    return float(cute::get<0>(offsets_rc(r, c)) - cute::get<1>(offsets_rc(r, c)));
  }
};

}  // namespace flashcute

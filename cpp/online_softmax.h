// Online softmax over key blocks (FlashAttention-2 style): a running row max and a running
// row sum per query row; the output accumulator is rescaled when the max grows, and divided
// by the row sum only once, after the last key block.
//
// Scores enter unscaled. exp2(s * scale_log2 - max * scale_log2) folds the softmax scale and
// the change of base into one FMA. Row values are spread over the 4 threads of an MMA quad,
// so row reductions finish with two butterfly shuffles.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float quad_allreduce_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTE_DEVICE float quad_allreduce_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// A row whose sum is 0 (or NaN) saw no key: its output is 0 and its LSE -inf.
CUTE_DEVICE bool row_has_no_key(float sum) { return sum == 0.f || sum != sum; }

// Natural-log LSE of a row from its max in log2 units (max · scale_log2) and its sum.
CUTE_DEVICE float row_lse(float max_log2, float sum) {
  constexpr float kLn2 = 0.6931471805599453f;
  return row_has_no_key(sum) ? -INFINITY : (max_log2 + log2f(sum)) * kLn2;
}

// kScaledP (8-bit P): a block's weights come out multiplied by a factor of its own, 2^p_log2
// (P_SCALE times the block's V-descale ratio, fwd_fp8_scales.h), folded into exp2's argument; the
// row sums take the weights divided by it again (p_inv), so they stay true sums.
template <int kRows, bool kScaledP = false>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // partial: this thread's columns only, until finalize()
  float scale_log2;
  float p_log2 = 0.f, p_inv = 1.f;  // kScaledP only

  CUTE_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;
  }

  // scores_rc (kRows, cols): raw scores of one key block, replaced by their exp2 weights.
  // correction[r]: the factor the output accumulator's row r must be scaled by for the new
  // row max (kept apart so a kernel can apply it after an in-flight P·V has finished).
  template <class Scores>
  CUTE_DEVICE void update_scores(Scores& scores_rc, float (&correction)[kRows]) {
    static_assert(decltype(cute::size<0>(scores_rc))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float block_max = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c) block_max = fmaxf(block_max, scores_rc(r, c));
      block_max = quad_allreduce_max(block_max);
      // A row fully masked so far keeps max -inf; subtract 0 then, so exp2 gives 0, not NaN.
      const float max_scaled = block_max == -INFINITY ? 0.f : block_max * scale_log2;
      // Before the first key block row_max is -inf and the correction is exp2(-inf) = 0.
      correction[r] = fast_exp2(row_max[r] * scale_log2 - max_scaled);
      row_sum[r] *= correction[r];
      row_max[r] = block_max;
      row_sum[r] += weights_to_sum(exp2_row(scores_rc, r, max_scaled - p_bias()));
    }
  }

  CUTE_DEVICE float p_bias() const { return kScaledP ? p_log2 : 0.f; }
  CUTE_DEVICE float weights_to_sum(float weights) const { return kScaledP ? weights * p_inv : weights; }

  // A block's weights against the running max as it stands, without searching the block
  // for a new one (16-bit P). Dividing by the row sum at the end makes exp2(s · scale_log2 - m)
  // exact for any m that keeps the weights finite in P's element type, so the max only has to
  // bound them: this skips the block max, its shuffles, the row-sum correction and the rescale
  // of the output. Returns whether this thread's weights of each row sum to at most
  // kKeptMaxSumLimit (each weight then fits fp16 and bf16 with room to spare) and its rows
  // have a max. Where it returns false for any thread, the caller discards the weights (the
  // row sums are untouched; block_sum holds this block's) and redoes the block with
  // update_scores on fresh scores.
  static constexpr float kKeptMaxSumLimit = 4096.f;
  template <class Scores>
  CUTE_DEVICE bool exp2_against_kept_max(Scores& scores_rc, float (&block_sum)[kRows]) const {
    static_assert(!kScaledP && decltype(cute::size<0>(scores_rc))::value == kRows);
    bool fits = true;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      block_sum[r] = exp2_row(scores_rc, r, row_max[r] * scale_log2);
      fits = fits && row_max[r] != -INFINITY && block_sum[r] <= kKeptMaxSumLimit;  // a NaN sum fails
    }
    return fits;
  }

  // 8-bit P's block step, without the warpgroup's agreement or S computed again: each row
  // keeps its max where the block's largest true score (raw · score_factor; score_factor > 0)
  // leaves every weight at most 2^kNearMaxLog2 (below e4m3's largest value, 448), and otherwise
  // takes the block's max as a full update does. A bound on the sum, as 16-bit P uses, is too
  // coarse here (P_SCALE puts a row's largest weight at 256), and a per-weight check after the
  // exp2 costs the same pass over the block as this search of the raw scores.
  // Returns whether any of this thread's rows took a new max (correction[] then applies).
  static constexpr float kNearMaxLog2 = 8.8f;
  // kTreeMax: the row's max over eight running maxima (row_max_of) rather than one chain.
  template <bool kTreeMax, class Scores>
  CUTE_DEVICE bool update_near_kept_max(Scores& scores_rc, float (&correction)[kRows], float score_factor) {
    static_assert(kScaledP && decltype(cute::size<0>(scores_rc))::value == kRows);
    const float score_scale = scale_log2 * score_factor;
    bool moved = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float block_max = -INFINITY;
      if constexpr (kTreeMax) {
        block_max = row_max_of(scores_rc, r);
      } else {
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(scores_rc); ++c) block_max = fmaxf(block_max, scores_rc(r, c));
      }
      const float true_max = quad_allreduce_max(block_max) * score_factor;
      correction[r] = 1.f;
      // Also where the row had no max yet (-inf); a block of -inf scores leaves it so.
      if (true_max * scale_log2 - row_max[r] * scale_log2 > kNearMaxLog2 - p_bias()) {
        correction[r] = fast_exp2((row_max[r] - true_max) * scale_log2);
        row_sum[r] *= correction[r];
        row_max[r] = true_max;
        moved = true;
      }
      const float max_scaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
      row_sum[r] += weights_to_sum(exp2_row(scores_rc, r, max_scaled - p_bias(), score_scale));
    }
    return moved;
  }

  // The largest of row r's scores, over eight running maxima: shorter than a chain of one
  // comparison per score, for eight more registers.
  template <class Scores>
  CUTE_DEVICE static float row_max_of(Scores const& scores_rc, int r) {
    constexpr int kCols = decltype(cute::size<1>(scores_rc))::value;
    static_assert(kCols % 8 == 0);
    float part[8];
    CUTE_UNROLL
    for (int i = 0; i < 8; ++i) part[i] = scores_rc(r, i);
    CUTE_UNROLL
    for (int c = 8; c < kCols; ++c) part[c % 8] = fmaxf(part[c % 8], scores_rc(r, c));
    return fmaxf(fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3])),
                 fmaxf(fmaxf(part[4], part[5]), fmaxf(part[6], part[7])));
  }

  CUTE_DEVICE void add_block_sums(const float (&block_sum)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_sum[r] += weights_to_sum(block_sum[r]);
  }

  // Row r's scores replaced by exp2(s · score_scale - max_scaled); returns their sum.
  template <class Scores>
  CUTE_DEVICE float exp2_row(Scores& scores_rc, int r, float max_scaled) const {
    return exp2_row(scores_rc, r, max_scaled, scale_log2);
  }
  template <class Scores>
  CUTE_DEVICE static float exp2_row(Scores& scores_rc, int r, float max_scaled, float score_scale) {
    float sum = 0.f;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
      const float p = fast_exp2(fmaf(scores_rc(r, c), score_scale, -max_scaled));
      scores_rc(r, c) = p;
      sum += p;
    }
    return sum;
  }

  template <class Acc>
  CUTE_DEVICE static void rescale(Acc& acc_rc, const float (&correction)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_rc); ++c) acc_rc(r, c) *= correction[r];
    }
  }

  // update_scores, then the accumulator rescaled at once (P·V not in flight).
  template <class Scores, class Acc>
  CUTE_DEVICE void update(Scores& scores_rc, Acc& acc_rc) {
    float correction[kRows];
    update_scores(scores_rc, correction);
    rescale(acc_rc, correction);
  }

  // Divides the accumulator by the row sums; returns natural-log LSE per row in lse[].
  // Rows that saw no key get 0 output and lse = -inf. o_scale: a factor on every output row
  // besides 1 / sum (dropout's 1 / (1 - p)).
  template <class Acc>
  CUTE_DEVICE void finalize(Acc& acc_rc, float (&lse)[kRows], float o_scale = 1.f) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce_sum(row_sum[r]);
      const float inv = row_has_no_key(sum) ? 0.f : o_scale / sum;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_rc); ++c) acc_rc(r, c) *= inv;
      lse[r] = row_lse(row_max[r] * scale_log2, sum);
    }
  }
};

}  // namespace flashcute

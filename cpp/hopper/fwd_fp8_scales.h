// FP8 descales of a consumer's tile (kernel_params.h): where each factor enters.
//
// - Q's descale is one number per consumer (its 64 rows lie in one 128-row block), and so is
//   K's per (batch, head): both fold into the softmax's scale, free per score.
// - K's block descales change with the key block (each block lies in one 128-key descale
//   block, fwd_config.h). An unmasked block takes a positive factor in exp2's multiplier (its
//   rows search the raw scores: OnlineSoftmax::update_near_kept_max); masked blocks, blocks
//   under the score hook (softcap, ALiBi, which need true scores) and other factors have the
//   scores multiplied, one FMUL per score.
// - V's descale: P is quantized as 256 · r_n · p, where r_n = v_descale(block n) / v_ref and
//   v_ref is the largest of the head's V descales (so r_n <= 1 and P stays below e4m3's 448);
//   the factor folds into exp2 and leaves the row sums (OnlineSoftmax<kRows, true>), and O is
//   multiplied by v_ref / 256 once, where it is normalized.
#pragma once

#include <cute/tensor.hpp>

#include "kernel_params.h"
#include "online_softmax.h"

namespace flashcute::hopper {

// log2 of the factor on P before it is rounded to e4m3: p in (0, 1] then uses e4m3's upper
// binades (reference_fp8.P_SCALE).
constexpr float kFp8PScaleLog2 = 8.f;
// Descale ratios below this are taken as this (a descale of 0 would make the row sums NaN).
constexpr float kFp8MinRatio = 1.0f / (1 << 24);

struct Fp8TileScales {
  float qk;          // folded into the softmax scale (Q's descale, and K's unless multiplied)
  bool multiplies;   // scores multiplied per block by block(n).s_factor
  float s_head;      // the per-head part of the multiplier
  const float* k_blocks;  // K's block descales of this (batch, K/V head); null: per head
  int64_t k_block_stride;
  const float* v_blocks;  // V's block descales of this (batch, K/V head); null: per head
  int64_t v_block_stride;
  float v_inv_ref;   // 1 / v_ref
  float o_factor;    // v_ref / 256

  // `hooked`: the score hook is on, so the scores must be true ones. With V block descales,
  // v_part returns this lane's part of v_ref (the largest of the head's V block descales, each
  // warp on its own): reduce_v_ref() finishes it once the first key block's GEMMs are issued,
  // so that the loads' latency passes under the tile's first waits. Until then v_inv_ref and
  // o_factor are unset.
  CUTE_DEVICE static Fp8TileScales of(FwdKernelParams const& a, int batch, int head, int consumer_row0, bool hooked,
                                      float& v_part) {
    const int kv_head = head / a.heads_per_kv;
    auto read = [](const float* p) { return p == nullptr ? 1.f : __ldg(p); };
    const float* q = a.q_descale == nullptr ? nullptr
                     : a.q_descale + batch * a.q_descale_batch_stride + (head / a.q_descale_head_div) * a.q_descale_head_stride +
                           (consumer_row0 > 0 ? consumer_row0 : 0) / kFp8Block * a.q_descale_block_stride;
    const float* k = a.k_descale == nullptr ? nullptr
                     : a.k_descale + batch * a.k_descale_batch_stride + kv_head * a.k_descale_head_stride;
    const float* v = a.v_descale == nullptr ? nullptr
                     : a.v_descale + batch * a.v_descale_batch_stride + kv_head * a.v_descale_head_stride;
    Fp8TileScales s;
    const bool k_blocks = k != nullptr && a.k_descale_block_stride != 0;
    const float qd = read(q), kd = k_blocks ? 1.f : read(k);
    s.multiplies = k_blocks || hooked;
    s.qk = hooked ? 1.f : qd * kd;
    s.s_head = hooked ? qd * kd : 1.f;
    s.k_blocks = k_blocks ? k : nullptr;
    s.k_block_stride = a.k_descale_block_stride;
    const bool v_blocks = v != nullptr && a.v_descale_block_stride != 0;
    s.v_blocks = v_blocks ? v : nullptr;
    s.v_block_stride = a.v_descale_block_stride;
    v_part = 0.f;
    if (v_blocks) {
      const int blocks = (a.seqlen_k + kFp8Block - 1) / kFp8Block;
      for (int i = threadIdx.x % 32; i < blocks; i += 32) v_part = fmaxf(v_part, __ldg(v + i * a.v_descale_block_stride));
    } else {
      s.set_v_ref(read(v));
    }
    return s;
  }

  // The warp's v_ref from its lanes' parts (all lanes of the warp call it).
  CUTE_DEVICE static float reduce_v_ref(float v_part) {
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) v_part = fmaxf(v_part, __shfl_xor_sync(0xffffffff, v_part, offset));
    return fmaxf(v_part, kFp8MinRatio);
  }
  CUTE_DEVICE void set_v_ref(float v_ref) {
    v_inv_ref = 1.f / v_ref;
    o_factor = v_ref * (1.f / 256.f);
  }

  // Key block n's factors: its scores' multiplier (when `multiplies`) and P's scale as
  // OnlineSoftmax<kRows, true> takes it. The block descales are loaded (raw) ahead of their
  // use and turned into factors once the block's GEMMs are issued, so that the loads' latency
  // passes under the pipeline waits and the GEMMs (fwd_consumer.h).
  struct Raw {
    float k, v;
  };
  struct Block {
    float s_factor, p_log2, p_inv;
  };
  CUTE_DEVICE Raw raw(int n, int block_n) const {
    // 32-bit products: the API refuses block strides that would take the last block past them.
    const int i = n * block_n / kFp8Block;
    Raw r{1.f, 1.f};
    if (k_blocks != nullptr) r.k = __ldg(k_blocks + i * int(k_block_stride));
    if (v_blocks != nullptr) r.v = __ldg(v_blocks + i * int(v_block_stride));
    return r;
  }
  CUTE_DEVICE Block block(Raw const& r) const {
    Block b{s_head, kFp8PScaleLog2, 1.f / 256.f};
    if (k_blocks != nullptr) b.s_factor *= r.k;
    if (v_blocks != nullptr) {
      const float ratio = fmaxf(r.v * v_inv_ref, kFp8MinRatio);
      b.p_log2 += __log2f(ratio);
      b.p_inv = fast_exp2(-b.p_log2);  // 1 / (256 · ratio) as P takes it, without a division
    }
    return b;
  }

  template <class Scores>
  CUTE_DEVICE static void multiply(Scores& scores_rc, float factor) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores_rc); ++i) scores_rc(i) *= factor;
  }
};

}  // namespace flashcute::hopper

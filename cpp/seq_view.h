// The sequence view: where one sequence of a batch lies in the tensors and how long it is, for
// fixed-length batches, packed variable-length batches (cu_seqlens) and batches whose sequences
// use only a prefix of their keys (seqused_k, plus the keys a KV-cache call appends). Producers,
// consumers, epilogues and schedulers of both paths read sequence offsets and lengths from here
// and nowhere else.
//
// Addresses: row r of sequence b in q is q + b·q_batch_stride + (q_start + r)·q_row_stride
// (+ head·q_head_stride); the host sets batch strides to 0 for a packed side. The LSE follows
// the same rule with lse_batch_stride and a row stride of 1.
//
// cu_seqlens and seqused_k are the caller's contract and are not checked on the host (that
// would cost a sync). Clamped here, no value makes a kernel touch rows outside [0, total) of
// the packed tensors or more than max_seqlen (the params' seqlen_q / seqlen_k) rows of a
// sequence, which also bounds the backward's workspace rows per sequence.
#pragma once

#include <cute/config.hpp>

#include "mask.h"

namespace flashcute {

struct SeqView {
  int q_start, k_start;    // first row of the sequence in the (packed or batched) q/out and k/v
  int seqlen_q, seqlen_k;  // its lengths, at most the params' seqlen_q / seqlen_k
  // Rows of its key range in k/v/dk/dv, seqused_k aside (>= seqlen_k): the backward writes
  // zero dK/dV to rows [seqlen_k, k_rows).
  int k_rows;

  template <class KernelParams>
  CUTE_HOST_DEVICE static bool fixed(KernelParams const& p) {
    return p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.seqused_k == nullptr;
  }

  template <class KernelParams>
  CUTE_DEVICE static SeqView of(KernelParams const& p, int batch) {
    SeqView v{0, 0, p.seqlen_q, p.seqlen_k, p.seqlen_k};
    if (fixed(p)) return v;
    if (p.cu_seqlens_q != nullptr) range(p.cu_seqlens_q, batch, p.total_q, p.seqlen_q, v.q_start, v.seqlen_q);
    if (p.cu_seqlens_k != nullptr) range(p.cu_seqlens_k, batch, p.total_k, p.seqlen_k, v.k_start, v.seqlen_k);
    v.k_rows = v.seqlen_k;
    if (p.seqused_k != nullptr) {  // used + add in 32 bits: only summed below seqlen_k - add
      const int used = p.seqused_k[batch];
      v.seqlen_k = used >= v.seqlen_k - p.seqused_k_add ? v.seqlen_k : cute::max(used + p.seqused_k_add, 0);
    }
    return v;
  }

  // Causal and window align to this sequence's lengths; the sides come clipped to the call's
  // longest sequence, which leaves them unbounded for every shorter one.
  template <class KernelParams>
  CUTE_HOST_DEVICE MaskPolicy mask(KernelParams const& p) const {
    return MaskPolicy{seqlen_q, seqlen_k, p.window_left, p.window_right};
  }

 private:
  // [cu[b], cu[b+1]) clamped into [0, total) and to at most max_len rows: start in [0, total],
  // start + len <= total, whatever the values.
  CUTE_DEVICE static void range(const int* cu, int batch, int total, int max_len, int& start, int& len) {
    const int lo = cute::min(cute::max(cu[batch], 0), total);
    const int hi = cute::min(cute::max(cu[batch + 1], lo), total);
    start = lo;
    len = cute::min(hi - lo, max_len);
  }
};

}  // namespace flashcute

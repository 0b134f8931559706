// Host and device: query heads packed into a tile's rows (grouped-query attention with few
// query rows, as in decoding).
//
// A query tile holds 64-row consumer blocks of one head. With G query heads per K/V head and
// seqlen_q far below a tile (one row when decoding), most rows are empty and every head of the
// group reads the same K/V again. Packed, tile row r of K/V head h is query row r / G of query
// head h·G + r % G: the group's heads share one tile, so K/V is read once per group and the
// rows fill G times faster. The kernel then sees a call of seqlen_q·G rows on nheads_kv heads
// with G = 1; only Q's load, O's store and LSE's index know the packing (fwd_producer.h,
// fwd_epilogue.h). A consumer block's 64 rows are 64 / G query rows of all G heads, one TMA
// box of (head dim, G heads, 64 / G rows), so G divides 64.
#pragma once

#include <climits>

#include "kernel_params.h"

namespace flashcute::hopper {

// A variable-length batch (SeqView::fixed false; this header stays plain C++ for the host API).
inline bool fwd_varlen(const FwdKernelParams& p) {
  return p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr || p.seqused_k != nullptr;
}

// The query heads packed per tile row block: G where packing holds, else 1. Packing needs
// whole 128-byte swizzle columns (kernel head dims that are multiples of 64, and calls that
// fill them: p.headdim and p.headdim_v, the call's, too), no causal or window band unless
// there is one query row and no left window side (the bottom-right causal diagonal, or a right
// side, then masks nothing), no ALiBi (its slope and distance follow the query head and row
// that packing merges), no dropout (its bits follow them too), fewer query tiles, and a
// fixed-length batch (a variable-length one's tiles are its sequences', seq_view.h).
// `headdim`, `headdim_v`: the kernel's (0: headdim).
inline int fwd_packed_heads(const FwdKernelParams& p, int headdim, int block_m, int headdim_v = 0) {
  if (fwd_varlen(p)) return 1;
  if (headdim_v == 0) headdim_v = headdim;
  const int group = p.heads_per_kv;
  if (group < 2 || 64 % group != 0 || headdim % 64 != 0 || headdim_v % 64 != 0 || p.headdim % 64 != 0 ||
      p.headdim_v % 64 != 0 || block_m <= 0 || p.seqlen_q <= 0)
    return 1;
  if (p.alibi_slopes != nullptr || p.dropout_threshold != 0) return 1;
  if (has_band(p) && (p.seqlen_q != 1 || p.window_left < p.seqlen_k)) return 1;
  if (static_cast<long long>(p.seqlen_q) * group > INT_MAX) return 1;  // the packed call's rows are an int
  const long long tiles = static_cast<long long>(group) * ((p.seqlen_q + block_m - 1) / block_m);
  const long long packed_tiles = (static_cast<long long>(p.seqlen_q) * group + block_m - 1) / block_m;
  return packed_tiles < tiles ? group : 1;
}

// The call as the kernel runs it with `packed` heads per row block (the same call for 1).
inline FwdKernelParams fwd_packed_view(const FwdKernelParams& p, int packed) {
  FwdKernelParams view = p;
  if (packed <= 1) return view;
  view.seqlen_q = p.seqlen_q * packed;
  view.nheads = p.nheads / packed;
  view.heads_per_kv = 1;
  view.causal = false;  // one query row: the bottom-right diagonal masks no key
  view.window_left = view.seqlen_k;
  view.window_right = view.seqlen_q;
  return view;
}

}  // namespace flashcute::hopper

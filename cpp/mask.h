// Which (query, key) pairs a score block may keep: keys past seqlen_k never, and with causal
// masking key j only for query i when j <= i + (seqlen_k - seqlen_q) (bottom-right aligned).
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

struct BlockMask {
  int seqlen_k;
  int diagonal_offset;  // seqlen_k - seqlen_q
  bool causal;

  // Column bound (exclusive) for query row `row`.
  CUTE_DEVICE int key_limit(int row) const {
    return causal ? cute::min(seqlen_k, row + diagonal_offset + 1) : seqlen_k;
  }

  // scores_rc: a thread's scores in (row, col) view. The thread's score (r, c) sits at row
  // row_base + offsets_rc(r, c).row and column col_base + offsets_rc(r, c).col, where
  // offsets_rc is the thread-independent (compile-time) part of the MMA layout: comparisons
  // then fold to one subtraction per row and immediates. Masked scores become -inf.
  template <class Scores, class Offsets>
  CUTE_DEVICE void apply(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base) const {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
      const int limit = key_limit(row_base + cute::get<0>(offsets_rc(r, 0))) - col_base;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
        if (cute::get<1>(offsets_rc(r, c)) >= limit) scores_rc(r, c) = -INFINITY;
      }
    }
  }
};

}  // namespace flashcute

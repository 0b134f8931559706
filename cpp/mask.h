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

  // scores_rc: a thread's scores in (row, col) view; coords_rc: the matching (row, col)
  // coordinates inside the block, which starts at (row0, col0). Masked scores become -inf.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores_rc, Coords const& coords_rc, int row0, int col0) const {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
      const int limit = key_limit(row0 + cute::get<0>(coords_rc(r, 0))) - col0;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
        if (cute::get<1>(coords_rc(r, c)) >= limit) scores_rc(r, c) = -INFINITY;
      }
    }
  }
};

}  // namespace flashcute

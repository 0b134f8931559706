// Which (query, key) pairs a score block may keep: keys past seqlen_k never, and with causal
// masking key j only for query i when j <= i + (seqlen_k - seqlen_q) (bottom-right aligned).
#pragma once

#include <climits>

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

// The same rule on transposed scores (rows are keys, columns are query rows), as the backward's
// key-major tiles hold them: keys past seqlen_k and keys after a row's diagonal become -inf.
template <class Scores, class Offsets>
CUTE_DEVICE void apply_mask_transposed(BlockMask const& mask, Scores& scores_rc, Offsets const& offsets_rc,
                                       int key_base, int row_base) {
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
    const int key = key_base + cute::get<0>(offsets_rc(r, 0));
    // Column c survives when row_base + col(c) reaches the first row that sees `key`.
    const int limit = key >= mask.seqlen_k ? INT_MAX : mask.causal ? key - mask.diagonal_offset - row_base : 0;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
      if (cute::get<1>(offsets_rc(r, c)) < limit) scores_rc(r, c) = -INFINITY;
    }
  }
}

// Key blocks of kBlockN keys that query rows [row0, row0 + rows) visit: blocks [0, n_end) hold a
// key one of the rows may see; blocks >= n_unmasked need the mask for at least one row.
struct KeyBlockRange {
  int n_end;
  int n_unmasked;
};

template <int kBlockN>
CUTE_HOST_DEVICE KeyBlockRange key_block_range(int row0, int rows, int seqlen_q, int seqlen_k,
                                               bool causal) {
  const int diagonal_offset = seqlen_k - seqlen_q;
  const int n_blocks_k = (seqlen_k + kBlockN - 1) / kBlockN;
  int n_end = n_blocks_k;
  int unmasked_keys = seqlen_k;
  if (causal) {
    const int key_bound = cute::min(row0 + rows, seqlen_q) + diagonal_offset;
    n_end = key_bound <= 0 ? 0 : cute::min(n_blocks_k, (key_bound + kBlockN - 1) / kBlockN);
    unmasked_keys = cute::max(0, cute::min(seqlen_k, row0 + diagonal_offset + 1));
  }
  return KeyBlockRange{n_end, unmasked_keys / kBlockN};
}

// Query blocks a key block meets: [begin, end); those below masked_end need the mask. They
// are visited from `start` on, wrapping around (at(i) is the i-th visit). Without causal the
// key blocks of one head would otherwise walk the same rows in lockstep, every one adding its
// dQ part into the same dq_accum rows at the same time; key block n starts (n mod 8) blocks
// in, which spreads those reductions eight ways while the rows in flight stay within eight
// blocks (Q, dO and dq_accum of a head stay in L2). Causal ranges start at their own
// diagonal, which differs between key blocks already, and are visited in order.
constexpr int kQueryBlockWindow = 8;

struct QueryBlockRange {
  int begin, masked_end, end, start;
  CUTE_HOST_DEVICE int count() const { return end - begin; }
  CUTE_HOST_DEVICE int at(int i) const {
    const int j = i + start;
    return begin + (j < count() ? j : j - count());
  }
};

template <int kBlockM, int kBlockN>
CUTE_HOST_DEVICE QueryBlockRange query_block_range(int n0, int seqlen_q, int seqlen_k, bool causal) {
  const int diagonal_offset = seqlen_k - seqlen_q;
  const int end = (seqlen_q + kBlockM - 1) / kBlockM;
  // Causal: row i sees key j iff j <= i + diagonal_offset.
  const int begin = causal ? cute::min(end, cute::max(0, n0 - diagonal_offset) / kBlockM) : 0;
  int masked_end = begin;
  if (n0 + kBlockN > seqlen_k) {
    masked_end = end;  // the seqlen_k tail: every block masks the missing keys
  } else if (causal) {
    // A block needs the mask while its first row misses the block's last key.
    const int first_unmasked_row = n0 + kBlockN - 1 - diagonal_offset;
    if (first_unmasked_row > 0)
      masked_end = cute::min(end, (first_unmasked_row + kBlockM - 1) / kBlockM);
    masked_end = cute::max(masked_end, begin);
  }
  const int window = end - begin < kQueryBlockWindow ? end - begin : kQueryBlockWindow;
  const int start = causal || window <= 1 ? 0 : (n0 / kBlockN) % window;
  return QueryBlockRange{begin, masked_end, end, start};
}

}  // namespace flashcute

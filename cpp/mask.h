// The mask policy: which (query, key) pairs a score block keeps, and the block ranges that
// follow from it. Query row i sees key j iff j < seqlen_k and
//   i + offset - left <= j <= i + offset + right,   offset = seqlen_k - seqlen_q,
// with the window's sides clipped to the call (kernel_params.h): left = seqlen_k and
// right = seqlen_q bound nothing, causal is right = 0 (bottom-right aligned). Producers and
// consumers of both paths ask this file for key-block and query-block ranges and never
// recompute the rule.
#pragma once

#include <climits>

#include <cute/tensor.hpp>

namespace flashcute {

struct MaskPolicy {
  int seqlen_q, seqlen_k;
  int left, right;

  template <class KernelParams>
  CUTE_HOST_DEVICE static MaskPolicy of(KernelParams const& p) {
    return MaskPolicy{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  }
  CUTE_HOST_DEVICE int offset() const { return seqlen_k - seqlen_q; }
  // Some row's first visible key lies past key 0 (a left window side inside the sequence).
  CUTE_HOST_DEVICE bool bounds_left() const { return left < seqlen_k; }
  // Keys are bounded by more than seqlen_k (causal diagonal or a window side).
  CUTE_HOST_DEVICE bool banded() const { return left < seqlen_k || right < seqlen_q; }
  // Row i's visible keys: [key_begin(i), key_end(i)), possibly empty.
  CUTE_HOST_DEVICE int key_begin(int row) const { return cute::max(0, row + offset() - left); }
  CUTE_HOST_DEVICE int key_end(int row) const { return cute::min(seqlen_k, row + offset() + right + 1); }

  // scores_rc: a thread's scores in (row, col) view. The thread's score (r, c) sits at row
  // row_base + offsets_rc(r, c).row and column col_base + offsets_rc(r, c).col, where
  // offsets_rc is the thread-independent (compile-time) part of the MMA layout: comparisons
  // then fold to one subtraction per row and immediates. Masked scores become -inf. The left
  // side costs a second comparison only where it bounds some row.
  template <class Scores, class Offsets>
  CUTE_DEVICE void apply(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base) const {
    if (bounds_left()) apply_rows<true>(scores_rc, offsets_rc, row_base, col_base);
    else apply_rows<false>(scores_rc, offsets_rc, row_base, col_base);
  }
  // The same for a kernel compiled for one case: kGeneral false where the mask is known to be
  // dense or causal (causal(): right == 0, else unbounded; no left side), in the form a kernel at
  // the register cap compiles without spills.
  template <bool kGeneral, class Scores, class Offsets>
  CUTE_DEVICE void apply_sides(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base) const {
    if constexpr (kGeneral) {
      apply_rows<true>(scores_rc, offsets_rc, row_base, col_base);
    } else {
      CUTE_UNROLL
      for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
        const int row = row_base + cute::get<0>(offsets_rc(r, 0));
        const int limit = (causal() ? cute::min(seqlen_k, row + offset() + 1) : seqlen_k) - col_base;
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(scores_rc); ++c)
          if (cute::get<1>(offsets_rc(r, c)) >= limit) scores_rc(r, c) = -INFINITY;
      }
    }
  }
  CUTE_HOST_DEVICE bool causal() const { return right == 0; }
  // Dense or causal: no left side, and the right side at the diagonal or unbounded.
  CUTE_HOST_DEVICE bool dense_or_causal() const { return !bounds_left() && (right == 0 || right >= seqlen_q); }

  // The same rule on transposed scores (rows are keys, columns query rows), as the backward's
  // key-major tiles hold them.
  template <class Scores, class Offsets>
  CUTE_DEVICE void apply_transposed(Scores& scores_rc, Offsets const& offsets_rc, int key_base, int row_base) const {
    if (bounds_left()) apply_keys<true>(scores_rc, offsets_rc, key_base, row_base);
    else apply_keys<false>(scores_rc, offsets_rc, key_base, row_base);
  }

 private:
  template <bool kLeft, class Scores, class Offsets>
  CUTE_DEVICE void apply_rows(Scores& scores_rc, Offsets const& offsets_rc, int row_base, int col_base) const {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
      const int row = row_base + cute::get<0>(offsets_rc(r, 0));
      const int limit = key_end(row) - col_base;
      const int first = row + offset() - left - col_base;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
        const int col = cute::get<1>(offsets_rc(r, c));
        if (col >= limit || (kLeft && col < first)) scores_rc(r, c) = -INFINITY;
      }
    }
  }

  template <bool kLeft, class Scores, class Offsets>
  CUTE_DEVICE void apply_keys(Scores& scores_rc, Offsets const& offsets_rc, int key_base, int row_base) const {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores_rc); ++r) {
      const int key = key_base + cute::get<0>(offsets_rc(r, 0));
      // Column c survives when row_base + col(c) lies in [first, last], the rows that see `key`.
      const int first = key >= seqlen_k ? INT_MAX : key - offset() - right - row_base;
      const int last = key - offset() + left - row_base;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores_rc); ++c) {
        const int col = cute::get<1>(offsets_rc(r, c));
        if (col < first || (kLeft && col > last)) scores_rc(r, c) = -INFINITY;
      }
    }
  }
};

CUTE_HOST_DEVICE constexpr int ceil_div_int(int a, int b) { return (a + b - 1) / b; }
CUTE_HOST_DEVICE constexpr int clamp_int(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

// Key blocks of kBlockN keys that query rows [row0, row0 + rows) visit, from the last to the
// first: [n_unmasked, n_end) need the mask (causal diagonal, window's right side, seqlen_k
// tail), [n_unmasked_begin, n_unmasked) need none, [n_begin, n_unmasked_begin) need it again
// (window's left side). Every block outside [n_begin, n_end) is invisible to all the rows.
struct KeyBlockRange {
  int n_begin;
  int n_unmasked_begin;
  int n_unmasked;
  int n_end;
  CUTE_HOST_DEVICE bool needs_mask(int n) const { return n >= n_unmasked || n < n_unmasked_begin; }
};

template <int kBlockN>
CUTE_HOST_DEVICE KeyBlockRange key_block_range(MaskPolicy const& mask, int row0, int rows) {
  const int first = row0 > 0 ? row0 : 0;
  const int last = cute::min(row0 + rows, mask.seqlen_q) - 1;
  if (last < first) return KeyBlockRange{0, 0, 0, 0};
  if (!mask.bounds_left()) {  // dense, causal, right side only: every row's keys start at 0
    const int key_end = mask.key_end(last);
    if (key_end <= 0) return KeyBlockRange{0, 0, 0, 0};
    const int n_end = ceil_div_int(key_end, kBlockN);
    return KeyBlockRange{0, 0, clamp_int(mask.key_end(first) / kBlockN, 0, n_end), n_end};
  }
  const int key_begin = mask.key_begin(first), key_end = mask.key_end(last);
  if (key_end <= key_begin) return KeyBlockRange{0, 0, 0, 0};
  const int n_begin = key_begin / kBlockN;
  const int n_end = ceil_div_int(key_end, kBlockN);
  // Every row sees keys [key_begin(last), key_end(first)): bounds grow with the row.
  const int unmasked_begin = clamp_int(ceil_div_int(mask.key_begin(last), kBlockN), n_begin, n_end);
  const int unmasked_end = clamp_int(mask.key_end(first) / kBlockN, unmasked_begin, n_end);
  return KeyBlockRange{n_begin, unmasked_begin, unmasked_end, n_end};
}

// Query blocks a key block meets: [begin, end); those below masked_end or from unmasked_end on
// need the mask. They are visited from `start` on, wrapping around (at(i) is the i-th visit).
// Without a band (mask.banded()) the key blocks of one head would otherwise walk the same rows
// in lockstep, every one adding its dQ part into the same dq_accum rows at the same time; key
// block n starts (n mod 8) blocks in, which spreads those reductions eight ways while the rows
// in flight stay within eight blocks (Q, dO and dq_accum of a head stay in L2). Banded ranges
// start at their own diagonal, which differs between key blocks already, and are visited in
// order.
constexpr int kQueryBlockWindow = 8;

struct QueryBlockRange {
  int begin, masked_end, unmasked_end, end, start;
  CUTE_HOST_DEVICE int count() const { return end - begin; }
  CUTE_HOST_DEVICE int at(int i) const {
    const int j = i + start;
    return begin + (j < count() ? j : j - count());
  }
  // left_side false: a mask known to have no left side (unmasked_end == end), one comparison.
  CUTE_HOST_DEVICE bool needs_mask(int m, bool left_side = true) const {
    return m < masked_end || (left_side && m >= unmasked_end);
  }
};

// kGeneral false: for a mask known to be dense or causal (mask.dense_or_causal()), the same
// ranges in a form whose bounds ptxas recomputes from the call's constants instead of keeping
// them live (a kernel at the register cap spilled with the general form).
template <int kBlockM, int kBlockN, bool kGeneral = true>
CUTE_HOST_DEVICE QueryBlockRange query_block_range(MaskPolicy const& mask, int n0) {
  const int offset = mask.offset();
  if constexpr (!kGeneral) {
    const bool right_side = mask.causal();
    const int end = ceil_div_int(mask.seqlen_q, kBlockM);
    const int begin = right_side ? cute::min(end, cute::max(0, n0 - offset) / kBlockM) : 0;
    int masked_end = begin;
    if (n0 + kBlockN > mask.seqlen_k) {
      masked_end = end;
    } else if (right_side) {
      const int full_first = n0 + kBlockN - 1 - offset;
      if (full_first > 0) masked_end = cute::min(end, ceil_div_int(full_first, kBlockM));
      masked_end = cute::max(masked_end, begin);
    }
    const int window = end - begin < kQueryBlockWindow ? end - begin : kQueryBlockWindow;
    const int start = right_side || window <= 1 ? 0 : (n0 / kBlockN) % window;
    return QueryBlockRange{begin, masked_end, end, end, start};
  } else {
    const int key_last = cute::min(n0 + kBlockN, mask.seqlen_k) - 1;
    // Rows that see key j: [j - offset - right, j - offset + left].
    const int row_first = cute::max(0, n0 - offset - mask.right);
    const int row_last = cute::min(mask.seqlen_q - 1, key_last - offset + mask.left);
    if (key_last < n0 || row_last < row_first) return QueryBlockRange{0, 0, 0, 0, 0};
    const int begin = row_first / kBlockM;
    const int end = row_last / kBlockM + 1;
    int masked_end = end, unmasked_end = end;  // the seqlen_k tail: every block masks the missing keys
    if (n0 + kBlockN <= mask.seqlen_k) {
      // Rows that see all of the block's keys: from the first that sees its last key to the
      // last that sees its first key.
      const int full_first = n0 + kBlockN - 1 - offset - mask.right;
      const int full_last = n0 - offset + mask.left;
      masked_end = clamp_int(full_first <= 0 ? begin : ceil_div_int(full_first, kBlockM), begin, end);
      unmasked_end = clamp_int(full_last >= mask.seqlen_q - 1 ? end : (full_last + 1) / kBlockM, masked_end, end);
    }
    const int window = end - begin < kQueryBlockWindow ? end - begin : kQueryBlockWindow;
    const int start = mask.banded() || window <= 1 ? 0 : (n0 / kBlockN) % window;
    return QueryBlockRange{begin, masked_end, unmasked_end, end, start};
  }
}

}  // namespace flashcute

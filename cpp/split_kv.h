// Split-KV (FlashDecoding): a query tile's key blocks are cut into num_splits contiguous
// ranges, each run by its own CTA, so that decoding (few query tiles, long caches) fills the
// GPU. A split leaves its normalized fp32 output and LSE (natural log) in the workspace;
// merge_states.h combines them into out and lse. The workspace holds, per split and query head,
// `rows` rows: batch · seqlen_q (row b·seqlen_q + i) or total_q (packed queries, row
// q_start + i), of headdim_v floats for the output and one float for the LSE.
#pragma once

#include <cstddef>
#include <cstdint>

#include "host_device.h"

namespace flashcute {

struct SplitKv {
  int splits;

  // Key blocks [n_begin, n_end) of a tile: split s's share, possibly empty (its rows then leave
  // zeros and -inf, which the merge ignores).
  FLASHCUTE_HOST_DEVICE void range(int split, int& n_begin, int& n_end) const {
    const int per = (n_end - n_begin + splits - 1) / splits;
    const int lo = n_begin + split * per;
    n_end = lo + per < n_end ? lo + per : n_end;
    n_begin = lo < n_end ? lo : n_end;
  }
};

struct SplitKvLayout {
  int64_t rows = 0, heads = 0, headdim_v = 0, splits = 1;
  size_t o_offset = 0, lse_offset = 0, bytes = 0;

  FLASHCUTE_HOST_DEVICE int64_t o_index(int split, int head, int64_t row) const {
    return ((int64_t(split) * heads + head) * rows + row) * headdim_v;
  }
  FLASHCUTE_HOST_DEVICE int64_t lse_index(int split, int head, int64_t row) const {
    return (int64_t(split) * heads + head) * rows + row;
  }
};

// The workspace of `splits` > 1 splits (none for 1), 256-byte aligned parts.
inline SplitKvLayout split_kv_layout(int64_t rows, int64_t heads, int64_t headdim_v, int64_t splits) {
  SplitKvLayout l;
  if (splits <= 1) return l;
  l.rows = rows, l.heads = heads, l.headdim_v = headdim_v, l.splits = splits;
  auto round_up = [](size_t x) { return (x + 255) / 256 * 256; };
  l.o_offset = 0;
  l.lse_offset = round_up(size_t(splits * heads * rows * headdim_v) * sizeof(float));
  l.bytes = l.lse_offset + round_up(size_t(splits * heads * rows) * sizeof(float));
  return l;
}

}  // namespace flashcute

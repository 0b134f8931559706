// Query heads packed into a tile's rows (grouped-query decoding, Ampere path). With G query
// heads per K/V head and one or a few query rows, a tile of one query head is mostly empty and
// every head of the group reads the same keys again. Packed, tile row r of K/V head h is query
// row r / G of query head h·G + r % G: the group shares one tile and reads K/V once. Only Q's
// load, O's and the LSE's stores and the split-KV partials know the packing; the rest of the
// kernel sees a call of seqlen_q·G rows on the K/V heads.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace flashcute {

struct PackedRows {
  int group;  // G (1: no packing)

  template <class KernelParams>
  CUTE_HOST_DEVICE static PackedRows of(KernelParams const& p) {
    return PackedRows{p.packed_heads > 1 ? p.packed_heads : 1};
  }
  CUTE_HOST_DEVICE bool packed() const { return group > 1; }
  // Query head and row of packed row r of K/V head `head` (its own head and row unpacked).
  CUTE_HOST_DEVICE int head_of(int head, int r) const { return head * group + r % group; }
  CUTE_HOST_DEVICE int row_of(int r) const { return r / group; }
  // Offset in elements of packed row r from K/V head `head`'s first query head, row 0.
  CUTE_HOST_DEVICE int64_t offset(int r, int64_t row_stride, int64_t head_stride) const {
    return int64_t(r / group) * row_stride + int64_t(r % group) * head_stride;
  }
};

}  // namespace flashcute

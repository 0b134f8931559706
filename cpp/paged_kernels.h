// Which forward kernels read paged KV caches. Plain C++: the kernels and the dispatch policy
// share it.
//
// Ampere path: kernels of head dims above 64. Below, the tiles' occupancy is bound by registers
// and the paged loads' registers would cost every call a CTA per SM (measured at hd 64: 167 ->
// 177 registers, 3 -> 2 CTAs per SM, 12% slower prefill). Paged calls of smaller head dims run
// on the next kernel up, which reads only their columns.
//
// Hopper path: TMA boxes of gcd(page_size, keys per block) rows, each inside one page and one
// key block, at least 16 rows (at most 8 boxes per block, whose pages the producer reads ahead
// in registers), and 64 columns wide (one 128-byte swizzle row): page sizes that are multiples
// of 16, on kernels whose head dims are multiples of 64. Long prefills copy pages read in boxes
// shorter than 64 rows into a contiguous workspace instead (kv_gather.h; dispatch_policy.h).
#pragma once

#include <cstdint>

namespace flashcute {

constexpr bool has_paged_loads(int kernel_headdim) { return kernel_headdim > 64; }

// page_size 0: a contiguous cache, which every Hopper-path kernel reads.
constexpr bool hopper_reads_pages(int kernel_headdim, int kernel_headdim_v, int64_t page_size) {
  return page_size == 0 || (page_size % 16 == 0 && kernel_headdim % 64 == 0 && kernel_headdim_v % 64 == 0);
}

}  // namespace flashcute

// Which Ampere-path forward kernels read paged KV caches: those of head dims above 64. Below, the
// tiles' occupancy is bound by registers and the paged loads' registers would cost every call a
// CTA per SM (measured at hd 64: 167 -> 177 registers, 3 -> 2 CTAs per SM, 12% slower prefill).
// Paged calls of smaller head dims run on the next kernel up, which reads only their columns.
// Plain C++: the kernels and the dispatch policy share it.
#pragma once

namespace flashcute {

constexpr bool has_paged_loads(int kernel_headdim) { return kernel_headdim > 64; }

}  // namespace flashcute

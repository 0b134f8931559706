// The backward's fp32 sums in global memory: a key block's dQ partial is added into the
// dq_accum buffer, 16 bytes per instruction where the GPU has vector reductions; the Hopper
// path then counts each finished CTA, and adds (and reads back) the dK, dV partials of split
// tiles (bwd_tail_split.h).
#pragma once

#include <cute/config.hpp>
#include <cute/tensor.hpp>

namespace flashcute {

// Adds four fp32 values to 16 aligned bytes of global memory. sm90 has one vector reduction
// for it; older GPUs take four scalar ones (their results unused, so they compile to RED).
CUTE_DEVICE void red_add_f32x4(float* gmem, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(gmem, a);
  atomicAdd(gmem + 1, b);
  atomicAdd(gmem + 2, c);
  atomicAdd(gmem + 3, d);
#endif
}

// A warpgroup's fp32 accumulator fragment added into global memory in register order: values
// e..e+3 of thread t at dst[e * 128 + t * 4] (dst already offset by t * 4), so that each
// instruction covers 2 KB contiguous over the warpgroup.
template <class Fragment>
CUTE_DEVICE void red_add_fragment(float* dst, Fragment const& acc) {
  static_assert(decltype(cute::size(acc))::value % 4 == 0);
  CUTE_UNROLL
  for (int e = 0; e < cute::size(acc); e += 4) red_add_f32x4(dst + e * 128, acc(e), acc(e + 1), acc(e + 2), acc(e + 3));
}

// The sums red_add_fragment made, read back from L2 into the fragment.
template <class Fragment>
CUTE_DEVICE void load_fragment_sums(Fragment& acc, const float* src) {
  CUTE_UNROLL
  for (int e = 0; e < cute::size(acc); e += 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src + e * 128));
    acc(e) = v.x, acc(e + 1) = v.y, acc(e + 2) = v.z, acc(e + 3) = v.w;
  }
}

// Adds one to a completion counter in global memory with release semantics at GPU scope:
// every memory operation that happens before it (the caller's, and through a barrier other
// threads') is visible to whoever reads the new count with acquire semantics.
CUTE_DEVICE void count_release(int* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
#endif
}

// Adds one to a counter in global memory, ordered after everything that happens before it and
// before everything after it, at GPU scope; returns the count before. The thread that reads
// the last count then sees every other counting thread's earlier memory operations.
CUTE_DEVICE int count_arrive(int* counter) {
  int before = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#endif
  return before;
}

}  // namespace flashcute

// The backward's dQ reduction: a key block's dQ partial is added into the fp32 dq_accum
// buffer in global memory, 16 bytes per instruction where the GPU has vector reductions; the
// Hopper path then counts each finished CTA.
#pragma once

#include <cute/config.hpp>

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

// Adds one to a completion counter in global memory with release semantics at GPU scope:
// every memory operation that happens before it (the caller's, and through a barrier other
// threads') is visible to whoever reads the new count with acquire semantics.
CUTE_DEVICE void count_release(int* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
#endif
}

}  // namespace flashcute

// The Hopper-path backward's dQ reduction: each key block's dQ partial is added into the fp32
// dq_accum buffer in global memory, 16 bytes per instruction.
#pragma once

#include <cute/config.hpp>

namespace flashcute::hopper {

// Adds four fp32 values to 16 aligned bytes of global memory (one vector reduction).
CUTE_DEVICE void red_add_f32x4(float* gmem, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

}  // namespace flashcute::hopper

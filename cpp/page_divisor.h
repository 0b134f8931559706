// Division by a KV cache's page size without a hardware division (the paged loads divide every
// key row): q = umulhi(n, multiplier) >> shift, exact for 0 <= n < 2^31, with l = ceil(log2 d),
// multiplier = ceil(2^(31 + l) / d) < 2^32 and shift = l - 1, built once on the host.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace flashcute {

struct PageDivisor {
  uint32_t multiplier = 0;
  int shift = 0;
  int divisor = 1;

  static PageDivisor of(int d) {
    PageDivisor p;
    p.divisor = d < 1 ? 1 : d;
    int l = 0;
    while ((1ll << l) < p.divisor) ++l;
    p.multiplier = p.divisor == 1 ? 0u : static_cast<uint32_t>(((1ull << (31 + l)) + p.divisor - 1) / p.divisor);
    p.shift = l > 0 ? l - 1 : 0;
    return p;
  }
  FLASHCUTE_HOST_DEVICE int quotient(int n) const {
    if (divisor == 1) return n;
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(static_cast<uint32_t>(n), multiplier);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t(uint32_t(n)) * multiplier) >> 32);
#endif
    return static_cast<int>(high >> shift);
  }
};

}  // namespace flashcute

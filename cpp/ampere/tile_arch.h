// Which tile table the current compilation pass of an Ampere-path kernel uses: sm80 code
// (A100, sm86, sm89) or sm90 code (H100/H200). The host pass reports 90; launchers pick the
// table of the loaded image from its PTX version instead.
#pragma once

#include "ampere_sm80_only.h"  // generated

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FLASHCUTE_AMPERE_TILE_ARCH 80
#else
#define FLASHCUTE_AMPERE_TILE_ARCH 90
#endif

namespace flashcute::ampere {

// Whether this build holds the kernels of kHeadDim as code of tile table kArch: head dims left
// out of FLASHCUTE_AMPERE_SM90_HEAD_DIMS compile empty sm90 bodies (an sm90 GPU runs them on a
// larger kernel, dispatch_policy.h), which saves the build their front-end time.
template <int kHeadDim, int kArch>
constexpr bool compiled_for() {
  constexpr int sm80_only[] = {FLASHCUTE_AMPERE_SM80_ONLY_HEAD_DIMS 0};
  if (kArch < 90) return true;
  for (int d : sm80_only)
    if (d == kHeadDim) return false;
  return true;
}

}  // namespace flashcute::ampere

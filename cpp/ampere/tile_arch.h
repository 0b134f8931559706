// Which tile table the current compilation pass of an Ampere-path kernel uses: sm80 code
// (A100, sm86, sm89) or sm90 code (H100/H200). The host pass reports 90; launchers pick the
// table of the loaded image from its PTX version instead.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FLASHCUTE_AMPERE_TILE_ARCH 80
#else
#define FLASHCUTE_AMPERE_TILE_ARCH 90
#endif

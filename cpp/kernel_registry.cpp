// The compiled kernels: their catalogue for the dispatch policy and their launchers, from the
// instance lists that CMake writes into build_config.h.
#include "kernel_registry.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace flashcute {

namespace {

template <class T>
void add_once(std::vector<T>& values, T value) {
  if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
}

KernelCatalogue make_catalogue() {
  KernelCatalogue c;
  // Every dtype of a path is compiled for the same head dims (FLASHCUTE_DTYPES).
#define FLASHCUTE_LIST_AMPERE_FWD(name, dtype_enum, hd) \
  add_once(c.ampere.head_dims, hd), add_once(c.ampere.dtypes, DType::dtype_enum);
  FLASHCUTE_FOR_EACH_AMPERE_FWD(FLASHCUTE_LIST_AMPERE_FWD)
#undef FLASHCUTE_LIST_AMPERE_FWD
#define FLASHCUTE_LIST_AMPERE_BWD(name, dtype_enum, hd) add_once(c.ampere.backward_head_dims, hd);
  FLASHCUTE_FOR_EACH_AMPERE_BWD(FLASHCUTE_LIST_AMPERE_BWD)
#undef FLASHCUTE_LIST_AMPERE_BWD
#define FLASHCUTE_LIST_HOPPER_FWD(name, dtype_enum, hd) \
  add_once(c.hopper.head_dims, hd), add_once(c.hopper.dtypes, DType::dtype_enum);
  FLASHCUTE_FOR_EACH_HOPPER_FWD(FLASHCUTE_LIST_HOPPER_FWD)
#undef FLASHCUTE_LIST_HOPPER_FWD
#define FLASHCUTE_LIST_HOPPER_BWD(name, dtype_enum, hd) add_once(c.hopper.backward_head_dims, hd);
  FLASHCUTE_FOR_EACH_HOPPER_BWD(FLASHCUTE_LIST_HOPPER_BWD)
#undef FLASHCUTE_LIST_HOPPER_BWD
#define FLASHCUTE_LIST_HOPPER_FWD_FP8(name, dtype_enum, hd) add_once(c.hopper.fp8_head_dims, hd);
  FLASHCUTE_FOR_EACH_HOPPER_FWD_FP8(FLASHCUTE_LIST_HOPPER_FWD_FP8)
#undef FLASHCUTE_LIST_HOPPER_FWD_FP8
#define FLASHCUTE_LIST_HOPPER_FWD_DV(name, dtype_enum, hd, hdv) add_once(c.hopper.pairs, std::pair<int, int>(hd, hdv));
  FLASHCUTE_FOR_EACH_HOPPER_FWD_DV(FLASHCUTE_LIST_HOPPER_FWD_DV)
#undef FLASHCUTE_LIST_HOPPER_FWD_DV
  for (const char* d = FLASHCUTE_AMPERE_SM80_ONLY; *d != '\0';) {  // "32;96;192"
    char* end = nullptr;
    const long value = std::strtol(d, &end, 10);
    if (end == d) break;
    c.ampere_sm80_only.push_back(static_cast<int>(value));
    d = *end == ';' ? end + 1 : end;
  }
  for (KernelFamily* f : {&c.ampere, &c.hopper}) {
    std::sort(f->head_dims.begin(), f->head_dims.end());
    std::sort(f->backward_head_dims.begin(), f->backward_head_dims.end());
    std::sort(f->pairs.begin(), f->pairs.end());
    std::sort(f->fp8_head_dims.begin(), f->fp8_head_dims.end());
  }
  return c;
}

}  // namespace

const KernelCatalogue& compiled_kernels() {
  static const KernelCatalogue catalogue = make_catalogue();
  return catalogue;
}

const KernelCatalogue& compiled_kernels(int capability) {
  static const KernelCatalogue on_sm90 = loadable_on(compiled_kernels(), 90);
  static const KernelCatalogue elsewhere = loadable_on(compiled_kernels(), 0);
  return capability == 90 ? on_sm90 : elsewhere;
}

FwdLauncher find_fwd_launcher(Backend backend, DType dtype, int kernel_headdim, int kernel_headdim_v) {
  if (kernel_headdim_v != kernel_headdim) {
#define FLASHCUTE_MATCH_HOPPER_FWD_DV(name, dtype_enum, hd, hdv)                                   \
  if (backend == Backend::kHopper && dtype == DType::dtype_enum && kernel_headdim == hd && \
      kernel_headdim_v == hdv)                                                                      \
    return &hopper::fwd_##name##_hd##hd##_dv##hdv;
    FLASHCUTE_FOR_EACH_HOPPER_FWD_DV(FLASHCUTE_MATCH_HOPPER_FWD_DV)
#undef FLASHCUTE_MATCH_HOPPER_FWD_DV
    return nullptr;
  }
  if (backend == Backend::kAmpere) {
#define FLASHCUTE_MATCH_AMPERE_FWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && kernel_headdim == hd) return &ampere::fwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_AMPERE_FWD(FLASHCUTE_MATCH_AMPERE_FWD)
#undef FLASHCUTE_MATCH_AMPERE_FWD
  }
  if (backend == Backend::kHopper) {
#define FLASHCUTE_MATCH_HOPPER_FWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && kernel_headdim == hd) return &hopper::fwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_HOPPER_FWD(FLASHCUTE_MATCH_HOPPER_FWD)
    FLASHCUTE_FOR_EACH_HOPPER_FWD_FP8(FLASHCUTE_MATCH_HOPPER_FWD)
#undef FLASHCUTE_MATCH_HOPPER_FWD
  }
  return nullptr;
}

FwdTileQuery find_ampere_fwd_tile(DType dtype, int kernel_headdim) {
#define FLASHCUTE_MATCH_AMPERE_FWD_TILE(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && kernel_headdim == hd) return &ampere::fwd_tile_##name##_hd##hd;
  FLASHCUTE_FOR_EACH_AMPERE_FWD(FLASHCUTE_MATCH_AMPERE_FWD_TILE)
#undef FLASHCUTE_MATCH_AMPERE_FWD_TILE
  return nullptr;
}

BwdLauncher find_bwd_launcher(Backend backend, DType dtype, int kernel_headdim) {
  if (backend == Backend::kAmpere) {
#define FLASHCUTE_MATCH_AMPERE_BWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && kernel_headdim == hd) return &ampere::bwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_AMPERE_BWD(FLASHCUTE_MATCH_AMPERE_BWD)
#undef FLASHCUTE_MATCH_AMPERE_BWD
  }
  if (backend == Backend::kHopper) {
#define FLASHCUTE_MATCH_HOPPER_BWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && kernel_headdim == hd) return &hopper::bwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_HOPPER_BWD(FLASHCUTE_MATCH_HOPPER_BWD)
#undef FLASHCUTE_MATCH_HOPPER_BWD
  }
  return nullptr;
}

}  // namespace flashcute

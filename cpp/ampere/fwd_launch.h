// Host-side launch of the Ampere-path forward for one (dtype, head dim) instantiation.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "ampere/fwd_config.h"
#include "ampere/fwd_kernel.h"
#include "kernel_registry.h"
#include "launch_status.h"

namespace flashcute::ampere {

// Checks the tile's shared memory against the device and raises the kernel's limit once.
template <class Traits, class Kernel>
Status prepare_fwd(Kernel kernel, int device) {
  constexpr int kSmem = Traits::kSmemBytes;
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (kSmem > smem_optin) {
    return make_status(StatusCode::kNotSupported,
                       "ampere path, headdim %d: needs %d bytes of shared memory per block, the "
                       "device allows %d",
                       Traits::kHeadDim, kSmem, smem_optin);
  }
  if (kSmem > 48 * 1024)
    return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                       "cudaFuncSetAttribute");
  return Status{};
}

template <class Traits, class Kernel>
Status launch_fwd(Kernel kernel, const FwdKernelParams& params, cudaStream_t stream) {
  const int splits = params.num_splits > 1 ? params.num_splits : 1;  // split-KV: z is (batch, split)
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch * splits);
  // The row table of paged loads only where the call is paged: the tiles alone leave the dense
  // calls their shared-memory carveout.
  const int smem = params.page_table != nullptr ? Traits::kSmemBytes : Traits::kTileBytes;
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(params);
  return cuda_status(cudaGetLastError(), "ampere forward launch");
}

// The tile table the loaded image of this kernel was built with (90 or 80: its PTX version),
// resolved per device on first use and cached, after prepare_fwd succeeded for its kernels.
template <class Element, int kHeadDim>
Status resolve_fwd_arch(int* arch_out) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  using NarrowTraits = typename FwdNarrowTraitsFor<Element, kHeadDim>::type;
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> tile_arch{};  // 0: not resolved yet
  int arch = device < kCachedDevices ? tile_arch[device].load(std::memory_order_acquire) : 0;
  if (arch == 0) {
    cudaFuncAttributes attributes{};
    if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess)
      return cuda_status(err, "cudaFuncGetAttributes (no kernel image for this GPU?)");
    arch = attributes.ptxVersion >= 90 ? 90 : 80;
    Status prepared = arch == 90 ? prepare_fwd<Traits90>(kernel, device) : prepare_fwd<Traits80>(kernel, device);
    if constexpr (!std::is_void_v<NarrowTraits>) {
      if (prepared.ok() && arch == 90) prepared = prepare_fwd<NarrowTraits>(&fwd_narrow_kernel<Element, kHeadDim>, device);
    }
    if (!prepared.ok()) return prepared;
    if (device < kCachedDevices) tile_arch[device].store(arch, std::memory_order_release);
  }
  if (arch == 90 && !compiled_for<kHeadDim, 90>())  // the dispatch policy runs a larger kernel instead
    return make_status(StatusCode::kNotSupported,
                       "ampere path, headdim %d: this build has no sm90 code for it (FLASHCUTE_AMPERE_SM90_HEAD_DIMS)",
                       kHeadDim);
  *arch_out = arch;
  return Status{};
}

// The narrow tile's rows where the loaded image has one (sm90 code), else 0.
template <class Element, int kHeadDim>
constexpr int narrow_block_m(int arch) {
  using NarrowTraits = typename FwdNarrowTraitsFor<Element, kHeadDim>::type;
  if constexpr (std::is_void_v<NarrowTraits>) return 0;
  else return arch == 90 ? NarrowTraits::kBlockM : 0;
}

template <class Element, int kHeadDim>
Status run_fwd(const FwdKernelParams& params, cudaStream_t stream) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  int arch = 0;
  if (Status s = resolve_fwd_arch<Element, kHeadDim>(&arch); !s.ok()) return s;
  using NarrowTraits = typename FwdNarrowTraitsFor<Element, kHeadDim>::type;
  if constexpr (!std::is_void_v<NarrowTraits>) {
    if (runs_narrow_tile(params.seqlen_q, params.num_splits, narrow_block_m<Element, kHeadDim>(arch)))
      return launch_fwd<NarrowTraits>(&fwd_narrow_kernel<Element, kHeadDim>, params, stream);
  }
  return arch == 90 ? launch_fwd<Traits90>(kernel, params, stream)
                    : launch_fwd<Traits80>(kernel, params, stream);
}

// A tile's shape and how many of its CTAs an SM holds, dense and paged.
template <class Traits, class Kernel>
Status tile_of(Kernel kernel, FwdTile* tile) {
  tile->block_m = Traits::kBlockM;
  tile->block_n = Traits::kBlockN;
  for (const auto& [smem, ctas_out] : {std::pair{int(Traits::kTileBytes), &tile->ctas_per_sm},
                                       std::pair{int(Traits::kSmemBytes), &tile->ctas_per_sm_paged}}) {
    int ctas = 0;
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Traits::kNThreads, smem);
        err != cudaSuccess)
      return cuda_status(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    *ctas_out = ctas > 0 ? ctas : 1;
  }
  return Status{};
}

// The tiles the current device runs (split-KV plans), computed once per device: the occupancy
// queries are host time on every KV-cache call otherwise.
template <class Element, int kHeadDim>
Status fwd_tile_info(FwdTileInfo* info) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  using NarrowTraits = typename FwdNarrowTraitsFor<Element, kHeadDim>::type;
  int arch = 0;
  if (Status s = resolve_fwd_arch<Element, kHeadDim>(&arch); !s.ok()) return s;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  constexpr int kCachedDevices = 64;
  static std::mutex cache_mutex;
  static std::array<std::optional<FwdTileInfo>, kCachedDevices> cache;
  if (device < kCachedDevices) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache[device]) {
      *info = *cache[device];
      return Status{};
    }
  }
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  Status s = arch == 90 ? tile_of<Traits90>(kernel, &info->wide) : tile_of<Traits80>(kernel, &info->wide);
  info->narrow = FwdTile{};
  if constexpr (!std::is_void_v<NarrowTraits>) {
    if (s.ok() && narrow_block_m<Element, kHeadDim>(arch) > 0)
      s = tile_of<NarrowTraits>(&fwd_narrow_kernel<Element, kHeadDim>, &info->narrow);
  }
  if (s.ok() && device < kCachedDevices) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache[device] = *info;
  }
  return s;
}

}  // namespace flashcute::ampere

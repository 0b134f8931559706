// Host-side launch of the Ampere-path forward for one (dtype, head dim) instantiation.
#pragma once

#include <array>
#include <atomic>
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
// resolved per device on first use and cached, after prepare_fwd succeeded.
template <class Element, int kHeadDim>
Status resolve_fwd_arch(int* arch_out) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
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
    const Status prepared = arch == 90 ? prepare_fwd<Traits90>(kernel, device)
                                       : prepare_fwd<Traits80>(kernel, device);
    if (!prepared.ok()) return prepared;
    if (device < kCachedDevices) tile_arch[device].store(arch, std::memory_order_release);
  }
  *arch_out = arch;
  return Status{};
}

template <class Element, int kHeadDim>
Status run_fwd(const FwdKernelParams& params, cudaStream_t stream) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  int arch = 0;
  if (Status s = resolve_fwd_arch<Element, kHeadDim>(&arch); !s.ok()) return s;
  return arch == 90 ? launch_fwd<Traits90>(kernel, params, stream)
                    : launch_fwd<Traits80>(kernel, params, stream);
}

// The tile the current device runs and how many of its CTAs an SM holds (split-KV plans).
template <class Element, int kHeadDim>
Status fwd_tile_info(FwdTileInfo* info) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  int arch = 0;
  if (Status s = resolve_fwd_arch<Element, kHeadDim>(&arch); !s.ok()) return s;
  const int threads = arch == 90 ? Traits90::kNThreads : Traits80::kNThreads;
  const int smem_paged = arch == 90 ? Traits90::kSmemBytes : Traits80::kSmemBytes;
  const int smem_dense = arch == 90 ? Traits90::kTileBytes : Traits80::kTileBytes;
  info->block_m = arch == 90 ? Traits90::kBlockM : Traits80::kBlockM;
  info->block_n = arch == 90 ? Traits90::kBlockN : Traits80::kBlockN;
  for (const auto& [smem, ctas_out] : {std::pair{smem_dense, &info->ctas_per_sm}, std::pair{smem_paged, &info->ctas_per_sm_paged}}) {
    int ctas = 0;
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, &fwd_kernel<Element, kHeadDim>, threads, smem);
        err != cudaSuccess)
      return cuda_status(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    *ctas_out = ctas > 0 ? ctas : 1;
  }
  return Status{};
}

}  // namespace flashcute::ampere

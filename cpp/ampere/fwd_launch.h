// Host-side launch of the Ampere-path forward for one (dtype, head dim) instantiation.
#pragma once

#include <array>
#include <atomic>

#include <cuda_runtime_api.h>

#include "ampere/fwd_config.h"
#include "ampere/fwd_kernel.h"
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
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  return cuda_status(cudaGetLastError(), "ampere forward launch");
}

template <class Element, int kHeadDim>
Status run_fwd(const FwdKernelParams& params, cudaStream_t stream) {
  using Traits90 = typename FwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename FwdTraitsFor<Element, kHeadDim, 80>::type;
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");

  // Per device, resolved on the first launch and cached: the tile table the loaded image was
  // built with (its PTX version), after prepare_fwd succeeded. 0: not resolved yet.
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> tile_arch{};
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
  return arch == 90 ? launch_fwd<Traits90>(kernel, params, stream)
                    : launch_fwd<Traits80>(kernel, params, stream);
}

}  // namespace flashcute::ampere

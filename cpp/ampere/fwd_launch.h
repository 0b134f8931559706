// Host-side launch of the Ampere-path forward for one (dtype, head dim) instantiation.
#pragma once

#include <cuda_runtime_api.h>

#include "ampere/fwd_config.h"
#include "ampere/fwd_kernel.h"
#include "launch_status.h"

namespace flashcute::ampere {

template <class Traits, class Kernel>
Status launch_fwd(Kernel kernel, const FwdKernelParams& params, cudaStream_t stream, int device) {
  constexpr int kSmem = Traits::kSmemBytes;
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (kSmem > smem_optin) {
    return make_status(StatusCode::kNotSupported,
                       "ampere path, headdim %d: needs %d bytes of shared memory per block, the "
                       "device allows %d",
                       Traits::kHeadDim, kSmem, smem_optin);
  }
  if (kSmem > 48 * 1024) {
    if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        err != cudaSuccess)
      return cuda_status(err, "cudaFuncSetAttribute");
  }
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  return cuda_status(cudaGetLastError(), "ampere forward launch");
}

template <class Element, int kHeadDim>
Status run_fwd(const FwdKernelParams& params, cudaStream_t stream) {
  auto kernel = &fwd_kernel<Element, kHeadDim>;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  // The loaded binary's PTX version tells which tile table its device code was built with.
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess)
    return cuda_status(err, "cudaFuncGetAttributes (no kernel image for this GPU?)");
  if (attributes.ptxVersion >= 90)
    return launch_fwd<typename FwdTraitsFor<Element, kHeadDim, 90>::type>(kernel, params, stream, device);
  return launch_fwd<typename FwdTraitsFor<Element, kHeadDim, 80>::type>(kernel, params, stream, device);
}

}  // namespace flashcute::ampere

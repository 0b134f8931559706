// Host-side launch of the Ampere-path forward for one (dtype, head dim) instantiation.
#pragma once

#include <cuda_runtime_api.h>

#include "ampere/fwd_config.h"
#include "ampere/fwd_kernel.h"
#include "launch_status.h"

namespace flashcute::ampere {

template <class Element, int kHeadDim>
Status run_fwd(const FwdKernelParams& params, cudaStream_t stream) {
  using Traits = typename FwdTraitsFor<Element, kHeadDim>::type;
  auto kernel = &fwd_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;

  int device = 0, smem_optin = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (kSmem > smem_optin) {
    return make_status(StatusCode::kNotSupported,
                       "ampere path, headdim %d: needs %d bytes of shared memory per block, the "
                       "device allows %d",
                       kHeadDim, kSmem, smem_optin);
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

}  // namespace flashcute::ampere

// Host-side encoding of the forward's hand-made TMA maps (packed query heads, paged KV caches):
// tiled, 128-byte swizzled as CuTe's whole-block maps are, so their boxes land in the same
// shared-memory layout.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cuda_host_adapter.hpp>

#include "launch_status.h"

namespace flashcute::hopper {

// A map of `extents` (dim 0 contiguous) with element strides `strides` for dims 1.., and boxes
// of `box`. `what` names the map in the error.
template <class Element, int kRank>
Status encode_swizzled_map(cute::TmaDescriptor* map, const void* ptr, const int64_t (&extents)[kRank],
                           const int64_t (&strides)[kRank - 1], const uint32_t (&box)[kRank], const char* what) {
  cuuint64_t dims[kRank];
  cuuint64_t byte_strides[kRank - 1];
  cuuint32_t boxes[kRank];
  cuuint32_t element_strides[kRank];
  for (int i = 0; i < kRank; ++i) {
    dims[i] = cuuint64_t(extents[i]);
    boxes[i] = box[i];
    element_strides[i] = 1;
  }
  // A dimension of extent 1 is never stepped, so any 16-byte multiple stands in for its stride.
  for (int i = 0; i + 1 < kRank; ++i)
    byte_strides[i] = extents[i + 1] > 1 ? cuuint64_t(strides[i] * int64_t(sizeof(Element))) : 16;
  const CUresult result = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, cute::TMA::to_CUtensorMapDataType<Element>(), kRank, const_cast<void*>(ptr), dims, byte_strides, boxes,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    return make_status(StatusCode::kCudaError, "cuTensorMapEncodeTiled (%s) failed: %d", what,
                       static_cast<int>(result));
  return Status{};
}

}  // namespace flashcute::hopper

// Host entry of the page copy (kv_gather.cu), for the plain C++ API.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcute/flashcute.h"
#include "kv_gather.h"

namespace flashcute {

// Bytes of the contiguous copy of `batch` sequences of `capacity` keys (K, then V at a 16-byte
// aligned offset).
struct KvGatherLayout {
  size_t v_offset = 0, bytes = 0;
};
KvGatherLayout kv_gather_layout(int64_t batch, int64_t capacity, int64_t heads_kv, int64_t headdim, int64_t headdim_v,
                                int elem_bytes);

Status launch_kv_gather(const KvGatherParams& p, cudaStream_t stream);

}  // namespace flashcute

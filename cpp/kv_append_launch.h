// Host entry of the append kernel (kv_append.cu), for the plain C++ API.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcute/flashcute.h"
#include "kv_append.h"

namespace flashcute {

Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream);

}  // namespace flashcute

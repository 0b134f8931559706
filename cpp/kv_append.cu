// The append kernel (kv_append.h): one thread per 16-byte chunk of a new key or value row.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kv_append.h"
#include "kv_append_launch.h"
#include "launch_status.h"

namespace flashcute {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) kv_append_kernel(const KvAppendParams p) {
  const int k_chunks = p.headdim * p.elem_bytes / 16, v_chunks = p.headdim_v * p.elem_bytes / 16;
  const int64_t per_row = int64_t(p.heads_kv) * (k_chunks + v_chunks);
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (item >= int64_t(p.batch) * p.seqlen_new * per_row) return;
  const int64_t row_item = item / per_row;
  const int i = int(row_item % p.seqlen_new), batch = int(row_item / p.seqlen_new);
  int rest = int(item % per_row);
  const bool is_k = rest < p.heads_kv * k_chunks;
  if (!is_k) rest -= p.heads_kv * k_chunks;
  const int chunks = is_k ? k_chunks : v_chunks;
  const int head = rest / chunks, chunk = rest % chunks;

  const int64_t pos = int64_t(p.cache_seqlens[batch]) + i;
  if (pos < 0 || pos >= p.capacity) return;
  int64_t slot_offset;
  const int64_t batch_stride = is_k ? p.k_batch_stride : p.v_batch_stride;
  const int64_t row_stride = is_k ? p.k_row_stride : p.v_row_stride;
  if (p.page_table != nullptr) {
    const int page = p.page_table[batch * p.page_table_batch_stride + pos / p.page_size];
    if (page < 0 || page >= p.num_pages) return;
    slot_offset = int64_t(page) * batch_stride + (pos % p.page_size) * row_stride;
  } else {
    slot_offset = batch * batch_stride + pos * row_stride;
  }
  const char* src = static_cast<const char*>(is_k ? p.k_new : p.v_new) +
                    (batch * (is_k ? p.k_new_batch_stride : p.v_new_batch_stride) +
                     int64_t(i) * (is_k ? p.k_new_row_stride : p.v_new_row_stride) +
                     head * (is_k ? p.k_new_head_stride : p.v_new_head_stride)) * p.elem_bytes;
  char* dst = static_cast<char*>(is_k ? p.k_cache : p.v_cache) +
              (slot_offset + head * (is_k ? p.k_head_stride : p.v_head_stride)) * p.elem_bytes;
  reinterpret_cast<uint4*>(dst)[chunk] = reinterpret_cast<const uint4*>(src)[chunk];
}

}  // namespace

Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream) {
  const int64_t per_row = int64_t(p.heads_kv) * (p.headdim + p.headdim_v) * p.elem_bytes / 16;
  const int64_t items = int64_t(p.batch) * p.seqlen_new * per_row;
  if (items == 0) return Status{};
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return make_status(StatusCode::kNotSupported, "k_new: too many rows to append");
  kv_append_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "kv append launch");
}

}  // namespace flashcute

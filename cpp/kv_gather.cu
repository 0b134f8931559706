// The page copy (kv_gather.h): each thread moves 16-byte chunks of K and V rows, four loads in
// flight before their stores, over a grid-stride loop of the sequence's used rows. The Hopper
// forward after it runs as its programmatic dependent (kernel_params.h, after_kv_copy).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "kv_gather.h"
#include "kv_gather_launch.h"
#include "kv_rows.h"
#include "launch_status.h"

namespace flashcute {

namespace {

constexpr int kThreads = 256;
constexpr int kChunksPerThread = 4;

struct ChunkCopy {
  const uint4* src;
  uint4* dst;
};

__device__ ChunkCopy chunk_of(const KvGatherParams& p, const int* table, int batch, uint32_t item, int per_row,
                              int k_chunks, int v_chunks) {
  const int row = int(item / uint32_t(per_row));
  int rest = int(item - uint32_t(row) * uint32_t(per_row));
  const bool is_k = rest < p.heads_kv * k_chunks;
  if (!is_k) rest -= p.heads_kv * k_chunks;
  const int chunks = is_k ? k_chunks : v_chunks;
  const int head = rest / chunks, chunk = rest - head * chunks;
  const int page = KvRows::page_in_range(table[p.page_size.quotient(row)], p.num_pages);
  const int in_page = row - p.page_size.quotient(row) * p.page_size.divisor;
  const uint64_t src_offset =
      KvRows::offset(page, in_page, is_k ? p.k_page_stride : p.v_page_stride, is_k ? p.k_row_stride : p.v_row_stride) +
      uint64_t(head) * uint64_t(is_k ? p.k_head_stride : p.v_head_stride);
  const int headdim = is_k ? p.headdim : p.headdim_v;
  const uint64_t dst_offset = (uint64_t(batch) * uint64_t(p.capacity) + uint64_t(row)) * uint64_t(p.heads_kv) * headdim +
                              uint64_t(head) * headdim;
  const char* src = static_cast<const char*>(is_k ? p.k_cache : p.v_cache) + src_offset * p.elem_bytes;
  char* dst = static_cast<char*>(is_k ? p.k_out : p.v_out) + dst_offset * p.elem_bytes;
  return ChunkCopy{reinterpret_cast<const uint4*>(src) + chunk, reinterpret_cast<uint4*>(dst) + chunk};
}

__global__ void __launch_bounds__(kThreads) kv_gather_kernel(const KvGatherParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The Hopper forward that reads the copy may start its CTAs now; it waits for the copy's end.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int k_chunks = p.headdim * p.elem_bytes / 16, v_chunks = p.headdim_v * p.elem_bytes / 16;
  const int per_row = p.heads_kv * (k_chunks + v_chunks);
  for (int batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
    // The used keys as the forward counts them (seq_view.h), clamped to the capacity.
    const int used = p.cache_seqlens[batch];
    const int rows = used >= p.capacity - p.seqlen_new ? p.capacity : max(used + p.seqlen_new, 0);
    const uint32_t items = uint32_t(rows) * uint32_t(per_row);  // the host keeps this below 2^31
    const int* table = p.page_table + batch * p.page_table_batch_stride;
    const uint32_t stride = gridDim.x * kThreads * kChunksPerThread;
    for (uint32_t base = blockIdx.x * kThreads * kChunksPerThread + threadIdx.x; base < items; base += stride) {
      uint4 values[kChunksPerThread];
      ChunkCopy copies[kChunksPerThread];
#pragma unroll
      for (int i = 0; i < kChunksPerThread; ++i) {
        const uint32_t item = base + i * kThreads;
        if (item < items) {
          copies[i] = chunk_of(p, table, batch, item, per_row, k_chunks, v_chunks);
          values[i] = *copies[i].src;
        }
      }
#pragma unroll
      for (int i = 0; i < kChunksPerThread; ++i)
        if (base + i * kThreads < items) *copies[i].dst = values[i];
    }
  }
}

}  // namespace

KvGatherLayout kv_gather_layout(int64_t batch, int64_t capacity, int64_t heads_kv, int64_t headdim, int64_t headdim_v,
                                int elem_bytes) {
  // Saturating products: a size past 2^62 bytes reads as 2^62, which no bound on the copy admits.
  constexpr uint64_t kHuge = uint64_t(1) << 62;
  auto times = [&](uint64_t a, int64_t b) {
    const uint64_t f = uint64_t(std::max<int64_t>(b, 0));
    return f != 0 && a > kHuge / f ? kHuge : a * f;
  };
  const uint64_t rows = times(times(times(1, batch), capacity), heads_kv);
  const uint64_t k_bytes = times(times(rows, headdim), elem_bytes);
  const uint64_t v_bytes = times(times(rows, headdim_v), elem_bytes);
  KvGatherLayout l;
  l.v_offset = size_t(std::min(kHuge, (k_bytes + 255) / 256 * 256));
  l.bytes = size_t(std::min(kHuge, uint64_t(l.v_offset) + v_bytes));
  return l;
}

Status launch_kv_gather(const KvGatherParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.capacity <= 0) return Status{};
  const int64_t per_row = int64_t(p.heads_kv) * (p.headdim + p.headdim_v) * p.elem_bytes / 16;
  const int64_t items = int64_t(p.capacity) * per_row;
  if (items >= (int64_t(1) << 31) - int64_t(kThreads) * kChunksPerThread)
    return make_status(StatusCode::kNotSupported, "k_cache: a sequence's copy must stay below 2^31 chunks");
  const int64_t per_block = int64_t(kThreads) * kChunksPerThread;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((items + per_block - 1) / per_block,
                                                                std::max(1, 8192 / p.batch)));
  const dim3 grid(unsigned(blocks), unsigned(std::min(p.batch, 65535)));
  kv_gather_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "kv gather launch");
}

}  // namespace flashcute

// The merge kernels (merge_states.h). merge_states_kernel: a warp per (batch, row, head); lanes
// split the states for the LSE and the head dim for the output; instantiated per (input,
// output) element type and columns per lane (merge_attention_states' two sources).
// merge_parts_kernel: split-KV's fp32 parts, small enough to sit beside the split kernel's CTAs.
// After split-KV the merge is launched as the split kernel's programmatic dependent (sm90): its
// CTAs start before the split grid ends and wait for it in the kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "launch_status.h"
#include "merge_states.h"
#include "merge_states_launch.h"

namespace flashcute {

namespace {

template <class T> __device__ __forceinline__ float to_float(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_float(float x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

constexpr int kWarpsPerBlock = 4;

// A (batch, row, head) item per warp, four a CTA: lane l holds state l's LSE (per chunk of 32
// states) and columns l, l + 32, ... of the output. kCols: columns per lane (head dims to
// 32·kCols); the warp loads kBatch states' outputs before it sums any (64 values per lane), so
// that a chunk's states cost one memory latency.
template <class In, class Out, int kCols, int kBatch = (64 / kCols < 32 ? 64 / kCols : 32)>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) merge_states_kernel(const MergeStatesParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (after_producer), the producer's writes are complete
  // from here on; after a plain launch this returns at once.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= int64_t(p.batch) * p.seqlen * p.heads) return;
  const int head = int(item % p.heads);
  const int row = int(item / p.heads % p.seqlen);
  const int batch = int(item / p.heads / p.seqlen);

  // A state's LSE, -inf for an empty state (NaN included) and for indices past the last state.
  auto lse_at = [&](int s) {
    if (s >= p.states) return -INFINITY;
    const StateView& v = p.source[p.sources == 1 ? 0 : s];
    const int64_t state = p.sources == 1 ? s * p.lse_state_stride : 0;
    const float x = v.lse[state + batch * v.lse_batch_stride + head * v.lse_head_stride + row * v.lse_row_stride];
    return x > -INFINITY ? x : -INFINITY;
  };
  auto o_at = [&](int s) {
    const StateView& v = p.source[p.sources == 1 ? 0 : s];
    const int64_t state = p.sources == 1 ? s * p.o_state_stride : 0;
    return static_cast<const In*>(v.o) + state + batch * v.o_batch_stride + row * v.o_row_stride +
           head * v.o_head_stride;
  };

  // Lane l holds state l's LSE (split-KV has up to 32 states in the common case); more states
  // are read again per 32.
  const float lse_first = lse_at(lane);
  float max_lse = lse_first;
  for (int s = 32 + lane; s < p.states; s += 32) max_lse = fmaxf(max_lse, lse_at(s));
  for (int d = 16; d > 0; d /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, d));
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    sum = lse_first > -INFINITY ? expf(lse_first - max_lse) : 0.f;
    for (int s = 32 + lane; s < p.states; s += 32) {
      const float x = lse_at(s);
      if (x > -INFINITY) sum += expf(x - max_lse);
    }
  }
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);

  float acc[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) acc[j] = 0.f;
  if (lse != -INFINITY) {  // uniform per warp
    for (int s0 = 0; s0 < p.states; s0 += 32) {
      const float state_lse = s0 == 0 ? lse_first : lse_at(s0 + lane);
      // 0 for an empty state: its O is not read, so garbage there cannot poison the sum.
      const float lane_weight = state_lse > -INFINITY ? expf(state_lse - lse) : 0.f;
      const int in_chunk = min(32, p.states - s0);
      for (int j0 = 0; j0 < in_chunk; j0 += kBatch) {
        float weight[kBatch], value[kBatch][kCols];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int j = j0 + u;  // 0 weight past the chunk's last state
          weight[u] = __shfl_sync(0xffffffffu, lane_weight, j % 32);
          const In* o = j < in_chunk && weight[u] != 0.f ? o_at(s0 + j) : nullptr;
          if (o == nullptr) weight[u] = 0.f;
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const int col = lane + 32 * c;
            value[u][c] = o != nullptr && col < p.headdim ? to_float(o[col]) : 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[c] += weight[u] * value[u][c];
      }
    }
  }

  Out* out = static_cast<Out*>(p.out.o) + batch * p.out.o_batch_stride + row * p.out.o_row_stride +
             head * p.out.o_head_stride;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int col = lane + 32 * c;
    if (col < p.headdim) out[col] = from_float<Out>(acc[c]);
  }
  if (lane == 0 && p.out.lse != nullptr)
    p.out.lse[batch * p.out.lse_batch_stride + head * p.out.lse_head_stride + row * p.out.lse_row_stride] = lse;
}

// Split-KV's merge (one source of fp32 parts): a CTA per (batch, row, head) and 32 columns, its
// 128 threads 32 parts x 4 groups of 8 columns, so that every part's columns are loaded at once
// and a thread needs at most 32 registers. Two CTAs of the narrow split kernel leave an SM 4096
// registers: a merge CTA that fits there is resident, waiting on griddepcontrol.wait, before the
// split grid ends, where a larger one could only start as split CTAs leave.
constexpr int kPartsPerPass = 32, kColsPerGroup = 8, kPartCols = 4 * kColsPerGroup;

template <class Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 16) merge_parts_kernel(const MergeStatesParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int col_chunks = (p.headdim + kPartCols - 1) / kPartCols;
  const int64_t item = blockIdx.x / col_chunks;
  const int col = int(blockIdx.x % col_chunks) * kPartCols + int(threadIdx.x % 4) * kColsPerGroup;
  const int part = int(threadIdx.x) / 4, lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int head = int(item % p.heads);
  const int row = int(item / p.heads % p.seqlen);
  const int batch = int(item / p.heads / p.seqlen);
  const StateView& v = p.source[0];
  const float* lse_row = v.lse + batch * v.lse_batch_stride + head * v.lse_head_stride + row * v.lse_row_stride;
  auto lse_at = [&](int s) {  // -inf for an empty part (NaN included) and past the last
    const float x = s < p.states ? lse_row[s * p.lse_state_stride] : -INFINITY;
    return x > -INFINITY ? x : -INFINITY;
  };

  // The thread's first part: its LSE, and its columns loaded before the reductions below need
  // them (an empty part's are not read).
  const float* o_row = static_cast<const float*>(v.o) + batch * v.o_batch_stride + row * v.o_row_stride +
                       head * v.o_head_stride + col;
  const bool has_cols = col < p.headdim;
  const float first = lse_at(part);
  float4 first_a = make_float4(0.f, 0.f, 0.f, 0.f), first_b = first_a;
  if (first > -INFINITY && has_cols) {
    const float4* o = reinterpret_cast<const float4*>(o_row + part * p.o_state_stride);
    first_a = o[0], first_b = o[1];
  }

  // The merged LSE: the max over all threads (each part appears in 4), the sum over one thread
  // per part.
  __shared__ float s_max[kWarpsPerBlock], s_sum[kWarpsPerBlock], s_cols[kWarpsPerBlock][kPartCols];
  float max_lse = first;
  for (int s = part + kPartsPerPass; s < p.states; s += kPartsPerPass) max_lse = fmaxf(max_lse, lse_at(s));
  for (int d = 16; d > 0; d /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, d));
  if (lane == 0) s_max[warp] = max_lse;
  __syncthreads();
  max_lse = fmaxf(fmaxf(s_max[0], s_max[1]), fmaxf(s_max[2], s_max[3]));
  float sum = 0.f;
  if (max_lse != -INFINITY && threadIdx.x % 4 == 0) {
    if (first > -INFINITY) sum = expf(first - max_lse);
    for (int s = part + kPartsPerPass; s < p.states; s += kPartsPerPass) {
      const float x = lse_at(s);
      if (x > -INFINITY) sum += expf(x - max_lse);
    }
  }
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  if (lane == 0) s_sum[warp] = sum;
  __syncthreads();
  sum = s_sum[0] + s_sum[1] + s_sum[2] + s_sum[3];
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);

  // This thread's 8 columns summed over its parts, then over the CTA's parts.
  float acc[kColsPerGroup] = {};
  auto add = [&](float w, const float4& a, const float4& b) {
    acc[0] += w * a.x, acc[1] += w * a.y, acc[2] += w * a.z, acc[3] += w * a.w;
    acc[4] += w * b.x, acc[5] += w * b.y, acc[6] += w * b.z, acc[7] += w * b.w;
  };
  if (lse != -INFINITY && has_cols) {
    if (first > -INFINITY) add(expf(first - lse), first_a, first_b);
    for (int s = part + kPartsPerPass; s < p.states; s += kPartsPerPass) {
      const float x = lse_at(s);
      if (!(x > -INFINITY)) continue;
      const float4* o = reinterpret_cast<const float4*>(o_row + s * p.o_state_stride);
      add(expf(x - lse), o[0], o[1]);
    }
  }
#pragma unroll
  for (int c = 0; c < kColsPerGroup; ++c)
#pragma unroll
    for (int d = 4; d < 32; d *= 2) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], d);
  if (lane < 4) {
#pragma unroll
    for (int c = 0; c < kColsPerGroup; ++c) s_cols[warp][lane * kColsPerGroup + c] = acc[c];
  }
  __syncthreads();
  if (warp > 0) return;
  const int out_col = int(blockIdx.x % col_chunks) * kPartCols + lane;
  if (out_col < p.headdim) {
    Out* out = static_cast<Out*>(p.out.o) + batch * p.out.o_batch_stride + row * p.out.o_row_stride +
               head * p.out.o_head_stride;
    out[out_col] = from_float<Out>(s_cols[0][lane] + s_cols[1][lane] + s_cols[2][lane] + s_cols[3][lane]);
  }
  if (lane == 0 && blockIdx.x % col_chunks == 0 && p.out.lse != nullptr)
    p.out.lse[batch * p.out.lse_batch_stride + head * p.out.lse_head_stride + row * p.out.lse_row_stride] = lse;
}

// Whether the image of the merge kernel that this device runs has griddepcontrol.wait: compiled
// from sm90 code. A device that JIT-compiles the sm80 image (no wait) gets a plain launch.
template <class In, class Out>
bool image_waits_for_producer() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> cached{};  // 0: not asked yet, 1: no, 2: yes
  int known = device < kCachedDevices ? cached[device].load(std::memory_order_acquire) : 0;
  if (known == 0) {
    cudaFuncAttributes attributes{};
    const bool waits = cudaFuncGetAttributes(&attributes, merge_states_kernel<In, Out, 8>) == cudaSuccess &&
                       attributes.ptxVersion >= 90;
    if (!waits) cudaGetLastError();  // a failed query leaves no sticky error behind
    known = waits ? 2 : 1;
    if (device < kCachedDevices) cached[device].store(known, std::memory_order_release);
  }
  return known == 2;
}

template <class In, class Out>
Status launch(const MergeStatesParams& p, bool after_producer, cudaStream_t stream) {
  const int64_t items = int64_t(p.batch) * p.seqlen * p.heads;
  if (items == 0) return Status{};
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return make_status(StatusCode::kNotSupported, "merge: too many rows (%lld)", (long long)items);
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = after_producer && image_waits_for_producer<In, Out>() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kWarpsPerBlock * 32);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  if constexpr (std::is_same_v<In, float>) {
    if (p.sources == 1 && after_producer) {  // split-KV's parts
      const int64_t part_blocks = items * ((p.headdim + kPartCols - 1) / kPartCols);
      if (part_blocks > 0x7fffffff) return make_status(StatusCode::kNotSupported, "merge: too many rows (%lld)", (long long)items);
      config.gridDim = dim3(unsigned(part_blocks));
      return cuda_status(cudaLaunchKernelEx(&config, merge_parts_kernel<Out>, p), "merge_states launch");
    }
  }
  const cudaError_t err = p.headdim <= 64    ? cudaLaunchKernelEx(&config, merge_states_kernel<In, Out, 2>, p)
                          : p.headdim <= 128 ? cudaLaunchKernelEx(&config, merge_states_kernel<In, Out, 4>, p)
                                             : cudaLaunchKernelEx(&config, merge_states_kernel<In, Out, 8>, p);
  return cuda_status(err, "merge_states launch");
}

}  // namespace

Status launch_merge_states(const MergeStatesParams& p, MergeElement in, MergeElement out, bool after_producer,
                          cudaStream_t stream) {
  if (p.headdim > 256 || p.headdim < 0) return make_status(StatusCode::kNotSupported, "merge: head dim %d above 256", p.headdim);
  using E = MergeElement;
  if (in == E::kFloat32 && out == E::kFloat16) return launch<float, __half>(p, after_producer, stream);
  if (in == E::kFloat32 && out == E::kBFloat16) return launch<float, __nv_bfloat16>(p, after_producer, stream);
  if (in == E::kFloat32 && out == E::kFloat32) return launch<float, float>(p, after_producer, stream);
  if (in == E::kFloat16 && out == E::kFloat16) return launch<__half, __half>(p, after_producer, stream);
  if (in == E::kBFloat16 && out == E::kBFloat16) return launch<__nv_bfloat16, __nv_bfloat16>(p, after_producer, stream);
  return make_status(StatusCode::kNotSupported, "merge: no kernel for these element types");
}

}  // namespace flashcute

// The merge kernel (merge_states.h): one warp per (batch, row, head); lanes split the states for
// the LSE and the head dim for the output. Instantiated per (input, output) element type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>

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

template <class In, class Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) merge_states_kernel(const MergeStatesParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= int64_t(p.batch) * p.seqlen * p.heads) return;
  const int head = int(item % p.heads);
  const int row = int(item / p.heads % p.seqlen);
  const int batch = int(item / p.heads / p.seqlen);

  auto lse_at = [&](int s) {
    const StateView& v = p.source[p.sources == 1 ? 0 : s];
    const int64_t state = p.sources == 1 ? s * p.lse_state_stride : 0;
    return v.lse[state + batch * v.lse_batch_stride + head * v.lse_head_stride + row * v.lse_row_stride];
  };
  auto o_at = [&](int s) {
    const StateView& v = p.source[p.sources == 1 ? 0 : s];
    const int64_t state = p.sources == 1 ? s * p.o_state_stride : 0;
    return static_cast<const In*>(v.o) + state + batch * v.o_batch_stride + row * v.o_row_stride +
           head * v.o_head_stride;
  };

  float max_lse = -INFINITY;
  for (int s = lane; s < p.states; s += 32) max_lse = fmaxf(max_lse, lse_at(s));
  for (int d = 16; d > 0; d /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, d));
  float sum = 0.f;
  if (max_lse != -INFINITY)
    for (int s = lane; s < p.states; s += 32) {
      const float state_lse = lse_at(s);
      if (state_lse > -INFINITY) sum += expf(state_lse - max_lse);  // NaN: no state, as -inf
    }
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);

  Out* out = static_cast<Out*>(p.out.o) + batch * p.out.o_batch_stride + row * p.out.o_row_stride +
             head * p.out.o_head_stride;
  // Up to 8 columns per lane in registers (head dims to 256), states visited once.
  constexpr int kCols = 8;
  float acc[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) acc[j] = 0.f;
  if (lse != -INFINITY) {
    for (int s = 0; s < p.states; ++s) {
      const float weight_log = lse_at(s) - lse;
      if (!(weight_log > -INFINITY)) continue;  // an empty state (or NaN lse): nothing to add
      const float weight = expf(weight_log);
      const In* o = o_at(s);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int col = lane + 32 * j;
        if (col < p.headdim) acc[j] += weight * to_float(o[col]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int col = lane + 32 * j;
    if (col < p.headdim) out[col] = from_float<Out>(acc[j]);
  }
  if (lane == 0 && p.out.lse != nullptr)
    p.out.lse[batch * p.out.lse_batch_stride + head * p.out.lse_head_stride + row * p.out.lse_row_stride] = lse;
}

template <class In, class Out>
Status launch(const MergeStatesParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.batch) * p.seqlen * p.heads;
  if (items == 0) return Status{};
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return make_status(StatusCode::kNotSupported, "merge: too many rows (%lld)", (long long)items);
  merge_states_kernel<In, Out><<<unsigned(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "merge_states launch");
}

}  // namespace

Status launch_merge_states(const MergeStatesParams& p, MergeElement in, MergeElement out, cudaStream_t stream) {
  if (p.headdim > 256 || p.headdim < 0) return make_status(StatusCode::kNotSupported, "merge: head dim %d above 256", p.headdim);
  using E = MergeElement;
  if (in == E::kFloat32 && out == E::kFloat16) return launch<float, __half>(p, stream);
  if (in == E::kFloat32 && out == E::kBFloat16) return launch<float, __nv_bfloat16>(p, stream);
  if (in == E::kFloat32 && out == E::kFloat32) return launch<float, float>(p, stream);
  if (in == E::kFloat16 && out == E::kFloat16) return launch<__half, __half>(p, stream);
  if (in == E::kBFloat16 && out == E::kBFloat16) return launch<__nv_bfloat16, __nv_bfloat16>(p, stream);
  return make_status(StatusCode::kNotSupported, "merge: no kernel for these element types");
}

}  // namespace flashcute

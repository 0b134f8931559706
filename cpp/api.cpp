// Public entry points: argument checks, device selection and dispatch to a compiled kernel.
#include <cmath>
#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "build_config.h"
#include "flashcute/flashcute.h"
#include "kernel_params.h"
#include "kernel_registry.h"
#include "launch_status.h"

namespace flashcute {

FwdLauncher find_fwd_launcher(Backend backend, DType dtype, int headdim) {
  if (backend == Backend::kAmpere) {
#define FLASHCUTE_MATCH_AMPERE_FWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && headdim == hd) return &ampere::fwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_AMPERE_FWD(FLASHCUTE_MATCH_AMPERE_FWD)
#undef FLASHCUTE_MATCH_AMPERE_FWD
  }
  if (backend == Backend::kHopper) {
#define FLASHCUTE_MATCH_HOPPER_FWD(name, dtype_enum, hd) \
  if (dtype == DType::dtype_enum && headdim == hd) return &hopper::fwd_##name##_hd##hd;
    FLASHCUTE_FOR_EACH_HOPPER_FWD(FLASHCUTE_MATCH_HOPPER_FWD)
#undef FLASHCUTE_MATCH_HOPPER_FWD
  }
  return nullptr;
}

namespace {

const char* dtype_name(DType dtype) { return dtype == DType::kBFloat16 ? "bfloat16" : "float16"; }
const char* backend_name(Backend backend) { return backend == Backend::kHopper ? "hopper" : "ampere"; }

// 16-byte vector loads and stores need every row start 16-byte aligned.
bool aligned16(const void* ptr, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  constexpr int64_t kElems = 8;  // 16 bytes of fp16/bf16
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && row_stride % kElems == 0 &&
         head_stride % kElems == 0 && batch_stride % kElems == 0;
}

Status check_forward(const AttentionForwardParams& p) {
  auto invalid = [](const char* msg) { return make_status(StatusCode::kInvalidArgument, "%s", msg); };
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.nheads < 0 || p.nheads_kv < 0 || p.headdim <= 0)
    return invalid("sizes must be non-negative and headdim positive");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return invalid("dtype: expected float16 or bfloat16");
  if (p.nheads_kv == 0 ? p.nheads != 0 : p.nheads % p.nheads_kv != 0)
    return make_status(StatusCode::kInvalidArgument,
                       "nheads (%lld) must be a multiple of nheads_kv (%lld)",
                       static_cast<long long>(p.nheads), static_cast<long long>(p.nheads_kv));
  if (!(p.softmax_scale > 0.f) || !std::isfinite(p.softmax_scale))
    return invalid("softmax_scale: expected a finite positive number");
  constexpr int64_t kMaxGrid = 65535;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (p.batch > kMaxGrid || p.nheads > kMaxGrid)
    return make_status(StatusCode::kNotSupported, "batch and nheads must be at most %lld", kMaxGrid);
  if (p.seqlen_q > kMaxInt - 256 || p.seqlen_k > kMaxInt - 256)
    return invalid("seqlen_q and seqlen_k must fit in 32 bits");
  const bool empty = p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0;
  if (empty) return Status{};
  if (p.q == nullptr || p.out == nullptr || (p.seqlen_k > 0 && (p.k == nullptr || p.v == nullptr)))
    return invalid("q, k, v and out must not be null");
  if (!aligned16(p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride) ||
      !aligned16(p.out, p.out_row_stride, p.out_head_stride, p.out_batch_stride) ||
      (p.seqlen_k > 0 && (!aligned16(p.k, p.k_row_stride, p.k_head_stride, p.k_batch_stride) ||
                          !aligned16(p.v, p.v_row_stride, p.v_head_stride, p.v_batch_stride))))
    return invalid("q, k, v, out: data pointers must be 16-byte aligned and batch/row/head "
                   "strides multiples of 8 elements");
  return Status{};
}

FwdKernelParams kernel_params(const AttentionForwardParams& p) {
  FwdKernelParams k{};
  k.q = p.q, k.k = p.k, k.v = p.v, k.out = p.out, k.lse = p.lse;
  k.q_batch_stride = p.q_batch_stride, k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_batch_stride = p.k_batch_stride, k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_batch_stride = p.v_batch_stride, k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.out_batch_stride = p.out_batch_stride, k.out_row_stride = p.out_row_stride;
  k.out_head_stride = p.out_head_stride;
  k.lse_batch_stride = p.lse_batch_stride, k.lse_head_stride = p.lse_head_stride;
  k.batch = static_cast<int>(p.batch);
  k.seqlen_q = static_cast<int>(p.seqlen_q);
  k.seqlen_k = static_cast<int>(p.seqlen_k);
  k.nheads = static_cast<int>(p.nheads);
  k.heads_per_kv = static_cast<int>(p.nheads / p.nheads_kv);
  k.softmax_scale = p.softmax_scale;
  k.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  k.causal = p.causal;
  return k;
}

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0 || cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) return;
    status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice");
    switched_ = status_.ok();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_{};
};

}  // namespace

Status device_capability(int device, int* capability) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return make_status(StatusCode::kNoDevice, "no usable CUDA driver or GPU: %s (%s)",
                       cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  if (device >= count)
    return make_status(StatusCode::kNoDevice, "CUDA device %d does not exist (%d visible)", device, count);
  int major = 0, minor = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); err != cudaSuccess)
    return cuda_status(err, "cudaDeviceGetAttribute");
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  *capability = major * 10 + minor;
  return Status{};
}

Status synchronize_stream(int device, cudaStream_t stream) {
  DeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

Backend default_backend(int capability) {
  const bool hopper_built = sizeof(FLASHCUTE_HOPPER_HEAD_DIMS) > 1;
  return capability == 90 && hopper_built ? Backend::kHopper : Backend::kAmpere;
}

Status attention_forward(const AttentionForwardParams& params, Backend backend) {
  if (Status s = check_forward(params); !s.ok()) return s;
  if (params.batch == 0 || params.seqlen_q == 0 || params.nheads == 0) return Status{};

  int capability = 0;
  if (Status s = device_capability(params.device, &capability); !s.ok()) return s;
  if (backend == Backend::kAuto) {
    backend = default_backend(capability);
    // Head dims / dtypes the Hopper path does not build run on the Ampere path.
    if (backend == Backend::kHopper &&
        find_fwd_launcher(backend, params.dtype, static_cast<int>(params.headdim)) == nullptr)
      backend = Backend::kAmpere;
  }
  if (backend == Backend::kAmpere && capability < 80)
    return make_status(StatusCode::kNotSupported,
                       "the ampere path needs compute capability 8.0 or newer, the device has %d.%d",
                       capability / 10, capability % 10);
  if (backend == Backend::kHopper && capability != 90)
    return make_status(StatusCode::kNotSupported,
                       "the hopper path needs an sm90 GPU (H100/H200), the device has %d.%d",
                       capability / 10, capability % 10);

  const FwdLauncher launch = find_fwd_launcher(backend, params.dtype, static_cast<int>(params.headdim));
  if (launch == nullptr) {
    const char* built = backend == Backend::kHopper ? FLASHCUTE_HOPPER_HEAD_DIMS : FLASHCUTE_AMPERE_HEAD_DIMS;
    return make_status(StatusCode::kNotSupported,
                       "%s path: no kernel for headdim %lld and %s in this build (head dims built: "
                       "[%s])",
                       backend_name(backend), static_cast<long long>(params.headdim),
                       dtype_name(params.dtype), built);
  }
  DeviceGuard guard(params.device);
  if (!guard.status().ok()) return guard.status();
  return launch(kernel_params(params), params.stream);
}

BuildInfo build_info() {
  return BuildInfo{FLASHCUTE_VERSION,          FLASHCUTE_CUDA_ARCHS,       FLASHCUTE_AMPERE_HEAD_DIMS,
                   FLASHCUTE_AMPERE_DTYPES,    FLASHCUTE_HOPPER_HEAD_DIMS, FLASHCUTE_HOPPER_DTYPES,
                   CUDART_VERSION};
}

}  // namespace flashcute

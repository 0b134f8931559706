// quantize_fp8: argument checks, the walk and grid of the persistent kernel (quantize_fp8.h)
// and its launch on the caller's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "device_guard.h"
#include "flashcute/flashcute.h"
#include "launch_status.h"
#include "operand_checks.h"
#include "quantize_fp8.h"

namespace flashcute {

namespace {


// CTAs of `kernel` with `slots` ring slots of `slot_bytes` that are resident at once on the
// current device; 0 where the slots do not fit in shared memory. Asked once per (device,
// kernel, slots) and remembered: the queries cost more host time than a launch. The kernel's
// dynamic shared memory limit is raised to the largest ring asked about, so that any of the
// rings asked about launches.
Status resident_ctas(const void* kernel, int threads, int slots, int slot_bytes, int64_t* ctas) {
  struct Key {
    int device;
    const void* kernel;
    bool operator==(const Key& o) const { return device == o.device && kernel == o.kernel; }
  };
  static std::mutex mutex;
  static std::vector<std::pair<Key, int>> limits;                    // the dynamic shared memory allowed
  static std::vector<std::pair<std::pair<Key, int>, int64_t>> known;  // (key, slots) -> resident CTAs
  Key key{0, kernel};
  if (cudaError_t err = cudaGetDevice(&key.device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& k : known) {
    if (k.first.first == key && k.first.second == slots) {
      *ctas = k.second;
      return Status{};
    }
  }
  int sms = 0, optin = 0, per_sm = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, key.device); err != cudaSuccess)
    return cuda_status(err, "cudaDeviceGetAttribute");
  if (cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, key.device);
      err != cudaSuccess)
    return cuda_status(err, "cudaDeviceGetAttribute");
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess)
    return cuda_status(err, "cudaFuncGetAttributes");
  const int smem = slots * slot_bytes;
  if (int64_t(smem) + int64_t(attributes.sharedSizeBytes) <= optin) {
    auto limit = std::find_if(limits.begin(), limits.end(), [&](const auto& l) { return l.first == key; });
    if (limit == limits.end() || limit->second < smem) {
      if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
          err != cudaSuccess)
        return cuda_status(err, "cudaFuncSetAttribute");
      if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 int(cudaSharedmemCarveoutMaxShared));
          err != cudaSuccess)
        return cuda_status(err, "cudaFuncSetAttribute");
      if (limit == limits.end()) {
        limits.push_back({key, smem});
      } else {
        limit->second = smem;
      }
    }
    if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        err != cudaSuccess)
      return cuda_status(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  }
  *ctas = int64_t(per_sm) * sms;
  known.push_back({{key, slots}, *ctas});
  return Status{};
}

// The streaming walks' ring: as many resident CTAs as any ring of at least `min_slots` allows,
// then as many slots (up to 3) as fit beside them; 0 slots: loads straight into registers.
// Sets a->slots and *ctas.
Status stream_slots(const void* kernel, int threads, int slot_bytes, int min_slots, QuantizeFp8Args* a,
                    int64_t* ctas) {
  *ctas = 0;
  for (int slots = 3; slots >= min_slots; --slots) {
    int64_t resident = 0;
    if (Status s = resident_ctas(kernel, threads, slots, slot_bytes, &resident); !s.ok()) return s;
    if (resident > *ctas) *ctas = resident, a->slots = slots;
  }
  if (*ctas == 0) return make_status(StatusCode::kNotSupported, "quantize_fp8: the kernel does not fit on an SM of this device");
  return Status{};
}

template <class T, int kD, bool kHadamard>
Status launch(const QuantizeFp8Params& p, QuantizeFp8Args a) {
  constexpr int kThreads = 4 * kD;
  constexpr int kSlot = quantize_fp8_detail::Tile<T, kD, kHadamard>::kSlotBytes;
  const int64_t heads = a.batch * int64_t(a.nheads);
  int64_t resident = 0;
  if (p.block) {  // independent tiles: a plain launch of at most one wave
    const void* kernel = reinterpret_cast<const void*>(&quantize_fp8_kernel<T, kD, kHadamard, Fp8Walk::kBlock>);
    // With the transform the block walk reads tiles from a slot (HadamardMma on sm90).
    if (Status s = stream_slots(kernel, kThreads, kSlot, kHadamard ? 1 : 0, &a, &resident); !s.ok()) return s;
    a.work = heads * a.tiles;
    const int64_t grid = std::min(a.work, resident);
    quantize_fp8_kernel<T, kD, kHadamard, Fp8Walk::kBlock><<<unsigned(grid), kThreads, a.slots * kSlot, p.stream>>>(a);
    return cuda_status(cudaGetLastError(), "quantize_fp8 launch");
  }
  // Per-head scales: teams of `chunks` CTAs, one per chunk of a head's rows, meet at spin
  // barriers, so every CTA must be resident (cooperative launch). kHeld where a chunk fits the
  // ring beside a tile in flight, else kReread. The most slots that fit (up to 6), chunks of
  // slots - 2 tiles (two in flight) from 5 slots on: long chunks mean fewer CTAs per head, so
  // more heads at once, whose neighbouring bytes make DRAM reads denser
  // (benchmarks/results/h100-quantize-fp8.txt).
  const void* kernel = reinterpret_cast<const void*>(&quantize_fp8_kernel<T, kD, kHadamard, Fp8Walk::kHeld>);
  bool held = false;
  for (int slots = 6; slots >= 2 && !held; --slots) {
    if (Status s = resident_ctas(kernel, kThreads, slots, kSlot, &resident); !s.ok()) return s;
    if (resident == 0) continue;
    const int needed = int((a.tiles + std::min<int64_t>(resident, a.tiles) - 1) / std::min<int64_t>(resident, a.tiles));
    const int target = std::min(slots >= 5 ? slots - 2 : slots - 1, a.tiles);
    if (needed > slots - 1) continue;
    held = true, a.slots = slots, a.chunk_tiles = std::max(needed, target);
  }
  if (!held) {
    kernel = reinterpret_cast<const void*>(&quantize_fp8_kernel<T, kD, kHadamard, Fp8Walk::kReread>);
    if (Status s = stream_slots(kernel, kThreads, kSlot, 0, &a, &resident); !s.ok()) return s;
    a.chunk_tiles = int((a.tiles + resident - 1) / resident);
    // Between its two readings a tile waits in L2 behind about a head (a chunk per CTA) and
    // what the rings read ahead: fewer slots (still at least one) where that passes 3/4 of L2.
    int device = 0, l2 = 0;
    if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
    if (cudaError_t err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device); err != cudaSuccess)
      return cuda_status(err, "cudaDeviceGetAttribute");
    while (a.slots > 1 && resident * (a.chunk_tiles + a.slots) * kSlot > int64_t(l2) * 3 / 4) --a.slots;
  }
  a.chunks = (a.tiles + a.chunk_tiles - 1) / a.chunk_tiles;
  a.teams = int(std::min(resident / a.chunks, heads));
  const int64_t grid = int64_t(a.teams) * a.chunks;
  void* args[] = {&a};
  return cuda_status(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(grid)), dim3(kThreads), args,
                                                 size_t(a.slots) * kSlot, p.stream),
                     "quantize_fp8 cooperative launch");
}

template <class T>
Status launch_dtype(const QuantizeFp8Params& p, const QuantizeFp8Args& a) {
  if (p.hadamard) {
    if (p.headdim == 64) return launch<T, 64, true>(p, a);
    if (p.headdim == 128) return launch<T, 128, true>(p, a);
    return launch<T, 256, true>(p, a);
  }
  if (p.headdim <= 32) return launch<T, 32, false>(p, a);
  if (p.headdim <= 64) return launch<T, 64, false>(p, a);
  if (p.headdim <= 128) return launch<T, 128, false>(p, a);
  return launch<T, 256, false>(p, a);
}

}  // namespace

size_t quantize_fp8_workspace_size(int64_t batch, int64_t nheads, bool block) {
  if (block || batch <= 0 || nheads <= 0) return 0;
  return size_t(batch) * size_t(nheads) * 2 * sizeof(uint32_t);
}

Status quantize_fp8(const QuantizeFp8Params& p) {
  if (p.batch < 0 || p.seqlen < 0 || p.nheads < 0)
    return make_status(StatusCode::kInvalidArgument, "batch, seqlen, nheads: expected sizes >= 0, got %lld, %lld, %lld",
                       (long long)p.batch, (long long)p.seqlen, (long long)p.nheads);
  if (p.headdim < 8 || p.headdim > 256 || p.headdim % 8 != 0)
    return make_status(StatusCode::kInvalidArgument, "headdim: expected a multiple of 8 from 8 to 256, got %lld",
                       (long long)p.headdim);
  if (p.hadamard && p.headdim != 64 && p.headdim != 128 && p.headdim != 256)
    return make_status(StatusCode::kInvalidArgument,
                       "headdim: the Hadamard transform takes head dims 64, 128 and 256, got %lld", (long long)p.headdim);
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return make_status(StatusCode::kInvalidArgument, "dtype: expected float16 or bfloat16");
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  if (p.batch > kMax32 || p.seqlen > kMax32 - kFp8Block || p.nheads > kMax32)
    return make_status(StatusCode::kInvalidArgument, "batch, seqlen, nheads: expected 32-bit sizes");
  if (p.batch == 0 || p.seqlen == 0 || p.nheads == 0) return Status{};
  const int64_t tiles = (p.seqlen + kFp8Block - 1) / kFp8Block;
  if (p.batch * p.nheads * tiles > kMax32)  // the kernel counts work items in 32 bits
    return make_status(StatusCode::kNotSupported, "batch, seqlen, nheads: more than 2^31 tiles of %d rows",
                       kFp8Block);

  const size_t workspace = quantize_fp8_workspace_size(p.batch, p.nheads, p.block);
  const struct { const char* name; const void* ptr; } pointers[] = {
      {"x", p.x}, {"out", p.out}, {"descale", p.descale}, {"workspace", workspace ? p.workspace : &p}};
  for (const auto& t : pointers)
    if (t.ptr == nullptr) return make_status(StatusCode::kInvalidArgument, "%s: must not be null", t.name);
  if (p.workspace_bytes < workspace)
    return make_status(StatusCode::kInvalidArgument,
                       "workspace: expected at least %zu bytes (quantize_fp8_workspace_size), got %zu", workspace,
                       p.workspace_bytes);
  if (p.x_batch_stride < 0 || p.x_row_stride < 0 || p.x_head_stride < 0)
    return make_status(StatusCode::kInvalidArgument, "x: expected non-negative strides, got (%lld, %lld, %lld)",
                       (long long)p.x_batch_stride, (long long)p.x_row_stride, (long long)p.x_head_stride);
  // The stride of a dimension of size 1 is never stepped: 0 for the checks and the kernel.
  const int64_t batch_stride = p.batch > 1 ? p.x_batch_stride : 0, row_stride = p.seqlen > 1 ? p.x_row_stride : 0,
                head_stride = p.nheads > 1 ? p.x_head_stride : 0;
  const int elem = 2;
  const Operand x =
      tensor4("x", p.x, p.batch, p.seqlen, p.nheads, p.headdim, batch_stride, row_stride, head_stride, elem);
  if (Status s = check_aligned16(x); !s.ok()) return s;
  if (reinterpret_cast<uintptr_t>(p.out) % 16 != 0)
    return make_status(StatusCode::kInvalidArgument, "out: needs a 16-byte aligned data pointer");
  if (reinterpret_cast<uintptr_t>(p.descale) % 4 != 0)
    return make_status(StatusCode::kInvalidArgument, "descale: needs a 4-byte aligned data pointer");
  if (workspace && reinterpret_cast<uintptr_t>(p.workspace) % 4 != 0)
    return make_status(StatusCode::kInvalidArgument, "workspace: needs a 4-byte aligned data pointer");
  const int64_t scales = p.batch * p.nheads * (p.block ? tiles : 1);
  const Operand inputs[] = {x};
  const Operand outputs[] = {
      tensor4("out", p.out, p.batch, p.seqlen, p.nheads, p.headdim, p.seqlen * p.nheads * p.headdim,
              p.nheads * p.headdim, p.headdim, 1),
      bytes_buffer("descale", p.descale, size_t(scales) * sizeof(float)),
      bytes_buffer("workspace", p.workspace, workspace),
  };
  if (Status s = check_no_overlap(outputs, inputs); !s.ok()) return s;

  QuantizeFp8Args a{};
  a.x = p.x;
  a.out = static_cast<uint8_t*>(p.out);
  a.descale = p.descale;
  a.amax = static_cast<uint32_t*>(p.workspace);
  a.arrived = workspace ? a.amax + p.batch * p.nheads : nullptr;
  a.x_batch_stride = batch_stride, a.x_row_stride = row_stride, a.x_head_stride = head_stride;
  a.batch = int(p.batch), a.seqlen = int(p.seqlen), a.nheads = int(p.nheads), a.headdim = int(p.headdim);
  a.tiles = int(tiles);
  a.by_heads = Fp8Divmod(uint32_t(p.nheads));
  a.by_tiles = Fp8Divmod(uint32_t(tiles));
  a.seed = p.seed;
  DeviceGuard guard(p.device);
  if (!guard.status().ok()) return guard.status();
  switch (p.dtype) {
    case DType::kFloat16: return launch_dtype<__half>(p, a);
    default: return launch_dtype<__nv_bfloat16>(p, a);
  }
}

}  // namespace flashcute

// Host-side checks of the tensors a call reads and writes: 16-byte alignment, outputs whose
// elements overlap each other, and outputs that share memory with another operand. Each
// failure names the tensor, so a caller with several views of one buffer knows which to fix.
#pragma once

#include <algorithm>
#include <cstdint>

#include "launch_status.h"

namespace flashcute {

// A strided tensor of up to 4 dimensions (sizes and strides in elements).
struct Operand {
  const char* name;
  const void* ptr;
  int ndim;
  int64_t size[4];
  int64_t stride[4];
  int elem_bytes;
  bool present;  // false: not passed or not read by this call (e.g. k when seqlen_k == 0)

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= size[i];
    return n;
  }
  // Bytes [lo, hi) between the first and one past the last element (strides are positive).
  uintptr_t lo() const { return reinterpret_cast<uintptr_t>(ptr); }
  uintptr_t hi() const {
    int64_t last = 0;
    for (int i = 0; i < ndim; ++i) last += (size[i] - 1) * stride[i];
    return lo() + static_cast<uintptr_t>((last + 1) * elem_bytes);
  }
  // Sorted by stride, each dimension steps over the whole extent of the smaller ones: no two
  // elements share an address. Sufficient, and true of every layout the frameworks produce.
  bool non_overlapping() const {
    int order[4] = {0, 1, 2, 3};
    std::sort(order, order + ndim, [&](int a, int b) { return stride[a] < stride[b]; });
    int64_t extent = 1;
    for (int j = 0; j < ndim; ++j) {
      const int i = order[j];
      if (size[i] <= 1) continue;
      if (stride[i] < extent) return false;
      extent = stride[i] * size[i];
    }
    return true;
  }
  // The elements fill [lo, hi) exactly: a view whose span meets another's certainly shares
  // memory with it.
  bool dense() const { return non_overlapping() && int64_t(hi() - lo()) == numel() * elem_bytes; }
  bool same_view(const Operand& o) const {
    if (ptr != o.ptr || ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (size[i] != o.size[i] || (size[i] > 1 && stride[i] != o.stride[i])) return false;
    return true;
  }
};

inline Operand tensor4(const char* name, const void* ptr, int64_t b, int64_t s, int64_t h, int64_t d,
                       int64_t batch_stride, int64_t row_stride, int64_t head_stride, int elem_bytes,
                       bool present = true) {
  return Operand{name, ptr, 4, {b, s, h, d}, {batch_stride, row_stride, head_stride, 1}, elem_bytes,
                 present && ptr != nullptr && b > 0 && s > 0 && h > 0 && d > 0};
}

inline Operand lse_tensor(const char* name, const float* ptr, int64_t b, int64_t h, int64_t s, int64_t batch_stride,
                          int64_t head_stride, bool present = true) {
  return Operand{name, ptr, 3, {b, h, s, 1}, {batch_stride, head_stride, 1, 1}, 4,
                 present && ptr != nullptr && b > 0 && h > 0 && s > 0};
}

inline Operand bytes_buffer(const char* name, const void* ptr, size_t bytes) {
  return Operand{name, ptr, 1, {static_cast<int64_t>(bytes), 1, 1, 1}, {1, 1, 1, 1}, 1,
                 ptr != nullptr && bytes > 0};
}

// 16-byte vector loads and stores need the data pointer and every row, head and batch start
// 16-byte aligned; TMA descriptors take every stride, also those of size-1 dimensions.
inline Status check_aligned16(const Operand& o) {
  if (!o.present) return Status{};
  const int64_t elems = 16 / o.elem_bytes;
  bool ok = o.lo() % 16 == 0;
  for (int i = 0; i < o.ndim - 1; ++i) ok = ok && o.stride[i] % elems == 0;
  if (ok) return Status{};
  return make_status(StatusCode::kInvalidArgument,
                     "%s: needs a 16-byte aligned data pointer and batch/row/head strides that are "
                     "multiples of %lld elements; got pointer %% 16 = %llu, strides (%lld, %lld, %lld)",
                     o.name, static_cast<long long>(elems), static_cast<unsigned long long>(o.lo() % 16),
                     static_cast<long long>(o.stride[0]), static_cast<long long>(o.stride[1]),
                     static_cast<long long>(o.stride[2]));
}

// Outputs must not overlap themselves, each other, or any input: the kernels read inputs while
// other CTAs write outputs. Pairs whose spans meet but that are neither the same view nor both
// dense (interleaved views of one buffer) cannot be told apart cheaply and are let through.
template <int kOutputs, int kInputs>
Status check_no_overlap(const Operand (&outputs)[kOutputs], const Operand (&inputs)[kInputs]) {
  auto clash = [](const Operand& a, const Operand& b) {
    if (!a.present || !b.present || a.hi() <= b.lo() || b.hi() <= a.lo()) return false;
    return a.same_view(b) || (a.dense() && b.dense());
  };
  for (int i = 0; i < kOutputs; ++i) {
    const Operand& out = outputs[i];
    if (out.present && !out.non_overlapping())
      return make_status(StatusCode::kInvalidArgument,
                         "%s: its elements overlap each other in memory (strides (%lld, %lld, %lld)); "
                         "pass a tensor with distinct elements",
                         out.name, static_cast<long long>(out.stride[0]), static_cast<long long>(out.stride[1]),
                         static_cast<long long>(out.stride[2]));
    for (int j = 0; j < kInputs; ++j)
      if (clash(out, inputs[j]))
        return make_status(StatusCode::kInvalidArgument,
                           "%s: shares memory with %s, which the kernel reads while writing %s; pass a "
                           "separate tensor",
                           out.name, inputs[j].name, out.name);
    for (int j = 0; j < i; ++j)
      if (clash(out, outputs[j]))
        return make_status(StatusCode::kInvalidArgument, "%s: shares memory with %s; pass separate tensors",
                           out.name, outputs[j].name);
  }
  return Status{};
}

}  // namespace flashcute

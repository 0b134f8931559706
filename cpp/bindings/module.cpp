// Python extension flashcute._C: DLPack tensors in, the public C++ API underneath.
// Validation with argument names lives in python/flashcute; this layer only translates
// tensors into params and a Status into a Python exception.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "flashcute/flashcute.h"

namespace nb = nanobind;

namespace {

using Tensor = nb::ndarray<nb::ro>;
using MutableTensor = nb::ndarray<>;

std::string dtype_name(nb::dlpack::dtype dt) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  std::string base;
  switch (code) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: base = "unknown"; break;
  }
  std::string name = base + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

// (device_type, device_id, dtype, shape, strides in elements) of any DLPack tensor.
std::tuple<int, int, std::string, std::vector<int64_t>, std::vector<int64_t>> inspect(Tensor t) {
  std::vector<int64_t> shape(t.ndim()), strides(t.ndim());
  for (size_t i = 0; i < t.ndim(); ++i) {
    shape[i] = t.shape(i);
    strides[i] = t.stride(i);
  }
  return {t.device_type(), t.device_id(), dtype_name(t.dtype()), shape, strides};
}

void raise_on_error(const flashcute::Status& status) {
  switch (status.code) {
    case flashcute::StatusCode::kOk: return;
    case flashcute::StatusCode::kInvalidArgument:
    case flashcute::StatusCode::kNotSupported: throw nb::value_error(status.message);
    default: throw std::runtime_error(status.message);
  }
}

flashcute::DType to_dtype(nb::dlpack::dtype dt) {
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 &&
      dt.lanes == 1)
    return flashcute::DType::kBFloat16;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16 &&
      dt.lanes == 1)
    return flashcute::DType::kFloat16;
  throw nb::type_error(("q: expected float16 or bfloat16, got " + dtype_name(dt)).c_str());
}

// Tensors are (batch, seqlen, heads, headdim); lse is (batch, heads, seqlen).
void forward(Tensor q, Tensor k, Tensor v, MutableTensor out, std::optional<MutableTensor> lse,
             float softmax_scale, bool causal, int backend, uintptr_t stream) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || out.ndim() != 4)
    throw nb::value_error("q, k, v, out: expected 4-d tensors (batch, seqlen, heads, headdim)");
  flashcute::AttentionForwardParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.batch = q.shape(0);
  p.seqlen_q = q.shape(1);
  p.nheads = q.shape(2);
  p.headdim = q.shape(3);
  p.seqlen_k = k.shape(1);
  p.nheads_kv = k.shape(2);
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.out_batch_stride = out.stride(0), p.out_row_stride = out.stride(1),
  p.out_head_stride = out.stride(2);
  if (lse) {
    if (lse->ndim() != 3 || lse->dtype() != nb::dtype<float>() || lse->stride(2) != 1)
      throw nb::value_error("lse: expected a float32 (batch, heads, seqlen_q) tensor");
    p.lse = static_cast<float*>(lse->data());
    p.lse_batch_stride = lse->stride(0);
    p.lse_head_stride = lse->stride(1);
  }
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.dtype = to_dtype(q.dtype());
  p.device = q.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);

  const bool dims_match = k.shape(0) == p.batch && v.shape(0) == p.batch &&
                          v.shape(1) == p.seqlen_k && v.shape(2) == p.nheads_kv &&
                          k.shape(3) == p.headdim && v.shape(3) == p.headdim &&
                          out.shape(0) == p.batch && out.shape(1) == p.seqlen_q &&
                          out.shape(2) == p.nheads && out.shape(3) == p.headdim;
  if (!dims_match) throw nb::value_error("q, k, v, out: shapes do not match");
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || out.dtype() != q.dtype())
    throw nb::type_error("q, k, v, out: expected one dtype for all four");
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1 || out.stride(3) != 1)
    throw nb::value_error("q, k, v, out: expected unit stride in the headdim dimension");

  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_forward(p, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

int device_capability(int device) {
  int capability = 0;
  raise_on_error(flashcute::device_capability(device, &capability));
  return capability;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashcute kernels behind DLPack; use the flashcute package, not this module.";
  m.def("inspect", &inspect, nb::arg("tensor"),
        "(device_type, device_id, dtype, shape, strides) of a DLPack tensor; strides in elements.");
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("backend"),
        nb::arg("stream"), "Attention forward into out (and lse when given).");
  m.def("device_capability", &device_capability, nb::arg("device"),
        "Compute capability of a CUDA device as major*10+minor.");
  m.def(
      "synchronize",
      [](uintptr_t stream, int device) {
        flashcute::Status status;
        {
          nb::gil_scoped_release release;
          status = flashcute::synchronize_stream(device, reinterpret_cast<cudaStream_t>(stream));
        }
        raise_on_error(status);
      },
      nb::arg("stream"), nb::arg("device") = -1, "Wait for the work queued on a CUDA stream.");
  m.def("default_backend", [](int capability) {
    return flashcute::default_backend(capability) == flashcute::Backend::kHopper ? "hopper"
                                                                                   : "ampere";
  });
  m.def("build_info", []() {
    const flashcute::BuildInfo info = flashcute::build_info();
    nb::dict d;
    d["version"] = info.version;
    d["cuda_archs"] = info.cuda_archs;
    d["ampere_head_dims"] = info.ampere_head_dims;
    d["ampere_dtypes"] = info.ampere_dtypes;
    d["hopper_head_dims"] = info.hopper_head_dims;
    d["hopper_dtypes"] = info.hopper_dtypes;
    d["cuda_runtime_version"] = info.cuda_runtime_version;
    return d;
  });
  m.attr("BACKEND_AUTO") = static_cast<int>(flashcute::Backend::kAuto);
  m.attr("BACKEND_AMPERE") = static_cast<int>(flashcute::Backend::kAmpere);
  m.attr("BACKEND_HOPPER") = static_cast<int>(flashcute::Backend::kHopper);
}

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
#include "fwd_tail_split.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_packed_heads.h"

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

// ALiBi's slopes into params (batch and nheads already set): (nheads,) or (batch, nheads)
// float32 on q's device with unit stride over heads. The Python layer checks the same with the
// same names; this repeats them for callers of the extension.
template <class Params>
void set_alibi_slopes(Params& p, const std::optional<Tensor>& slopes, const Tensor& q) {
  if (!slopes) return;
  const Tensor& s = *slopes;
  if (s.dtype() != nb::dtype<float>())
    throw nb::type_error(("alibi_slopes: expected float32, got " + dtype_name(s.dtype())).c_str());
  const size_t ndim = s.ndim();
  const bool per_batch = ndim == 2;
  if ((ndim != 1 && !per_batch) || static_cast<int64_t>(s.shape(ndim - 1)) != p.nheads ||
      (per_batch && static_cast<int64_t>(s.shape(0)) != p.batch))
    throw nb::value_error("alibi_slopes: expected shape (nheads,) or (batch, nheads)");
  if (s.shape(ndim - 1) > 1 && s.stride(ndim - 1) != 1)
    throw nb::value_error("alibi_slopes: expected unit stride over heads");
  if (s.device_type() != q.device_type() || s.device_id() != q.device_id())
    throw nb::value_error("alibi_slopes: expected a tensor on q's device");
  p.alibi_slopes = static_cast<const float*>(s.data());
  p.alibi_slopes_batch_stride = per_batch && s.shape(0) > 1 ? s.stride(0) : 0;
}

// Tensors are (batch, seqlen, heads, headdim); lse is (batch, heads, seqlen).
void forward(Tensor q, Tensor k, Tensor v, MutableTensor out, std::optional<MutableTensor> lse,
             float softmax_scale, bool causal, int backend, uintptr_t stream,
             std::optional<MutableTensor> workspace, int64_t window_left, int64_t window_right, float softcap,
             std::optional<Tensor> alibi_slopes) {
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
  if (workspace) {
    p.workspace = workspace->data();
    p.workspace_bytes = workspace->nbytes();
  }
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softcap = softcap;
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
  set_alibi_slopes(p, alibi_slopes, q);

  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_forward(p, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

// Shapes of the backward's tensors: every gradient matches its input.
void check_backward_shapes(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                           MutableTensor dq, MutableTensor dk, MutableTensor dv) {
  const Tensor* all[] = {&dout, &q, &k, &v, &out};
  for (const Tensor* t : all)
    if (t->ndim() != 4) throw nb::value_error("dout, q, k, v, out: expected 4-d tensors");
  if (dq.ndim() != 4 || dk.ndim() != 4 || dv.ndim() != 4)
    throw nb::value_error("dq, dk, dv: expected 4-d tensors");
  auto same_shape = [](auto& a, auto& b) {
    for (size_t i = 0; i < 4; ++i)
      if (a.shape(i) != b.shape(i)) return false;
    return true;
  };
  if (!same_shape(dout, q) || !same_shape(out, q) || !same_shape(dq, q) || !same_shape(v, k) ||
      !same_shape(dk, k) || !same_shape(dv, k) || k.shape(0) != q.shape(0) ||
      k.shape(3) != q.shape(3))
    throw nb::value_error("dout, q, k, v, out, dq, dk, dv: shapes do not match");
  const auto dt = q.dtype();
  if (dout.dtype() != dt || k.dtype() != dt || v.dtype() != dt || out.dtype() != dt ||
      dq.dtype() != dt || dk.dtype() != dt || dv.dtype() != dt)
    throw nb::type_error("dout, q, k, v, out, dq, dk, dv: expected one dtype for all");
  if (dout.stride(3) != 1 || q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1 ||
      out.stride(3) != 1 || dq.stride(3) != 1 || dk.stride(3) != 1 || dv.stride(3) != 1)
    throw nb::value_error("dout, q, k, v, out, dq, dk, dv: expected unit headdim stride");
}

void backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, MutableTensor dq,
              MutableTensor dk, MutableTensor dv, MutableTensor workspace, float softmax_scale,
              bool causal, bool deterministic, int backend, uintptr_t stream, int64_t window_left,
              int64_t window_right, float softcap, std::optional<Tensor> alibi_slopes) {
  check_backward_shapes(dout, q, k, v, out, dq, dk, dv);
  if (lse.ndim() != 3 || lse.dtype() != nb::dtype<float>() || lse.stride(2) != 1 ||
      lse.shape(0) != q.shape(0) || lse.shape(1) != q.shape(2) || lse.shape(2) != q.shape(1))
    throw nb::value_error("lse: expected a float32 (batch, heads, seqlen_q) tensor");
  flashcute::AttentionBackwardParams p;
  p.dout = dout.data(), p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
  p.lse = static_cast<const float*>(lse.data());
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.nbytes();
  p.batch = q.shape(0), p.seqlen_q = q.shape(1), p.nheads = q.shape(2), p.headdim = q.shape(3);
  p.seqlen_k = k.shape(1), p.nheads_kv = k.shape(2);
  p.dout_batch_stride = dout.stride(0), p.dout_row_stride = dout.stride(1), p.dout_head_stride = dout.stride(2);
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.out_batch_stride = out.stride(0), p.out_row_stride = out.stride(1), p.out_head_stride = out.stride(2);
  p.dq_batch_stride = dq.stride(0), p.dq_row_stride = dq.stride(1), p.dq_head_stride = dq.stride(2);
  p.dk_batch_stride = dk.stride(0), p.dk_row_stride = dk.stride(1), p.dk_head_stride = dk.stride(2);
  p.dv_batch_stride = dv.stride(0), p.dv_row_stride = dv.stride(1), p.dv_head_stride = dv.stride(2);
  p.lse_batch_stride = lse.stride(0), p.lse_head_stride = lse.stride(1);
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softcap = softcap;
  p.deterministic = deterministic;
  set_alibi_slopes(p, alibi_slopes, q);
  p.dtype = to_dtype(q.dtype());
  p.device = q.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_backward(p, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

// Params of a workspace-size query: sizes, dtype and mask (pointers are not read).
template <class Params>
Params size_query(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv,
                  int64_t headdim, const std::string& dtype, bool causal, int64_t window_left,
                  int64_t window_right) {
  Params p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.nheads = nheads, p.nheads_kv = nheads_kv, p.headdim = headdim;
  if (dtype != "float16" && dtype != "bfloat16")
    throw nb::value_error("dtype: expected 'float16' or 'bfloat16'");
  p.dtype = dtype == "bfloat16" ? flashcute::DType::kBFloat16 : flashcute::DType::kFloat16;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softmax_scale = 1.f;
  return p;
}

// A non-null pointer that says "ALiBi on" to the size queries, which read no pointers.
const float kAlibiFlag = 0.f;

size_t forward_workspace_size(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads,
                              int64_t nheads_kv, int64_t headdim, const std::string& dtype, bool causal,
                              int backend, int device, int64_t window_left, int64_t window_right, bool alibi) {
  auto p = size_query<flashcute::AttentionForwardParams>(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                                         dtype, causal, window_left, window_right);
  p.device = device;
  if (alibi) p.alibi_slopes = &kAlibiFlag;
  size_t bytes = 0;
  raise_on_error(flashcute::attention_forward_workspace_size(p, &bytes, static_cast<flashcute::Backend>(backend)));
  return bytes;
}

// The forward's last-wave split (fwd_tail_split.h) for `units` tiles of `key_blocks` key blocks
// on `sms` SMs (some tiles partial or not), for tests: (whole_units, tiles, ctas, range starts
// of CTAs 0..ctas, and per split tile its CTAs' slots in CTA order).
std::tuple<int, int, int, std::vector<int>, std::vector<std::vector<int>>> forward_split_plan(
    int units, int key_blocks, int sms, bool partial_tiles, bool few_rows) {
  const flashcute::FwdTailSplit split =
      flashcute::plan_fwd_tail_split(units, key_blocks, sms, partial_tiles, few_rows);
  std::vector<int> begins;
  std::vector<std::vector<int>> slots;
  if (split.tiles > 0) {
    for (int cta = 0; cta <= split.ctas; ++cta) begins.push_back(split.begin(cta));
    for (int tile = 0; tile < split.tiles; ++tile) {
      std::vector<int> tile_slots;
      for (int cta = split.first_cta(tile); cta <= split.last_cta(tile); ++cta)
        tile_slots.push_back(split.slot(cta, tile));
      if (static_cast<int>(tile_slots.size()) != split.parts(tile)) throw std::logic_error("parts mismatch");
      slots.push_back(tile_slots);
    }
  }
  return {split.whole_units, split.tiles, split.ctas, begins, slots};
}

// The Hopper forward's tile for a call, for tests: (keys per block, consumer warpgroups).
std::tuple<int, int> forward_tile(int headdim, int seqlen_q, int seqlen_k, bool causal) {
  namespace hopper = flashcute::hopper;
  const hopper::FwdTileSize tile =
      hopper::fwd_tile_size(headdim, hopper::fwd_second_tile(headdim, seqlen_q, seqlen_k, causal));
  return {tile.block_n, tile.consumers};
}

// Query heads the Hopper forward packs per row block (1: none) for a call.
int forward_packed_heads(int nheads, int nheads_kv, int seqlen_q, int seqlen_k, int headdim, bool causal,
                         bool alibi) {
  namespace hopper = flashcute::hopper;
  flashcute::FwdKernelParams p{};
  p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.nheads = nheads, p.causal = causal;
  if (alibi) p.alibi_slopes = &kAlibiFlag;
  p.window_left = seqlen_k, p.window_right = causal ? 0 : seqlen_q;  // no window
  p.heads_per_kv = nheads_kv > 0 ? nheads / nheads_kv : 1;
  const hopper::FwdTileSize tile =
      hopper::fwd_tile_size(headdim, hopper::fwd_second_tile(headdim, seqlen_q, seqlen_k, causal));
  return hopper::fwd_packed_heads(p, headdim, 64 * tile.consumers);
}

size_t backward_workspace_size(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads,
                               int64_t nheads_kv, int64_t headdim, const std::string& dtype,
                               bool deterministic, int backend, bool causal, int64_t window_left,
                               int64_t window_right) {
  auto p = size_query<flashcute::AttentionBackwardParams>(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                                          dtype, causal, window_left, window_right);
  p.deterministic = deterministic;
  size_t bytes = 0;
  raise_on_error(flashcute::attention_backward_workspace_size(p, &bytes,
                                                              static_cast<flashcute::Backend>(backend)));
  return bytes;
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
        nb::arg("stream"), nb::arg("workspace").none() = nb::none(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        "Attention forward into out (and lse when given).");
  m.def("forward_workspace_size", &forward_workspace_size, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("seqlen_k"), nb::arg("nheads"), nb::arg("nheads_kv"), nb::arg("headdim"),
        nb::arg("dtype"), nb::arg("causal"), nb::arg("backend"), nb::arg("device"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("alibi") = false,
        "Bytes of the optional device workspace the forward can use (0: none).");
  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("workspace"), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("deterministic"),
        nb::arg("backend"), nb::arg("stream"), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        "Attention backward into dq, dk, dv.");
  m.def("backward_workspace_size", &backward_workspace_size, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("seqlen_k"), nb::arg("nheads"), nb::arg("nheads_kv"), nb::arg("headdim"),
        nb::arg("dtype"), nb::arg("deterministic"), nb::arg("backend"), nb::arg("causal") = false,
        nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        "Bytes of device workspace the backward needs.");
  m.def("_forward_split_plan", &forward_split_plan, nb::arg("units"), nb::arg("key_blocks"), nb::arg("sms"),
        nb::arg("partial_tiles") = false, nb::arg("few_rows") = false,
        "Test hook: the Hopper forward's last-wave split plan.");
  m.def("_forward_tile", &forward_tile, nb::arg("headdim"), nb::arg("seqlen_q"), nb::arg("seqlen_k"),
        nb::arg("causal"), "Test hook: the Hopper forward's (keys per block, consumers) for a call.");
  m.def("_forward_packed_heads", &forward_packed_heads, nb::arg("nheads"), nb::arg("nheads_kv"),
        nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("headdim"), nb::arg("causal"), nb::arg("alibi") = false,
        "Test hook: query heads the Hopper forward packs into a tile's rows (1: none).");
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
    d["hopper_backward_head_dims"] = info.hopper_backward_head_dims;
    d["cuda_runtime_version"] = info.cuda_runtime_version;
    return d;
  });
  m.attr("BACKEND_AUTO") = static_cast<int>(flashcute::Backend::kAuto);
  m.attr("BACKEND_AMPERE") = static_cast<int>(flashcute::Backend::kAmpere);
  m.attr("BACKEND_HOPPER") = static_cast<int>(flashcute::Backend::kHopper);
}

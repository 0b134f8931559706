"""Defects a new user hits first, exercised on the CPU: torch.compile as the first call of a
process, fake implementations that agree with the real calls, scalar and aliasing checks that
name their argument."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashcute._C")

import flashcute  # noqa: E402
from flashcute import _C, _torch_ops  # noqa: E402,F401  (registers the custom ops)
from torch.utils.dlpack import to_dlpack  # noqa: E402

DEVICE_ERROR = "q: expected a CUDA tensor, got a CPU tensor"


def _fresh_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "backend, fullgraph, with_out",
    [("eager", True, False), ("aot_eager", True, False), ("inductor", True, False),
     ("eager", False, False), ("eager", True, True), ("aot_eager", True, True),
     ("inductor", False, True)],
)
def test_compile_as_first_call_reports_the_device_error(backend, fullgraph, with_out):
    """A compiled call is the first thing the process does: it must fail with flashcute's own
    device error, not with a dynamo guard or import error."""
    result = _fresh_process(f"""
        import torch, flashcute
        q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
        def fn(q, k, v):
            if {with_out}:
                o = torch.empty_like(q)
                flashcute.attention(q, k, v, causal=True, out=o)
                return o
            return flashcute.attention(q, k, v, causal=True)
        try:
            torch.compile(fn, fullgraph={fullgraph}, backend={backend!r})(q, q, q)
        except Exception as exc:
            print("RAISED", type(exc).__name__, str(exc).splitlines()[0])
    """)
    assert f"RAISED ValueError {DEVICE_ERROR}" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_with_window_and_softcap_as_first_call_reports_the_device_error(backend):
    """A compiled training step with a window and softcap, first thing in a process, traces
    the front door's checks and both custom ops' fakes and fails only on the device."""
    result = _fresh_process(f"""
        import torch, flashcute
        q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, requires_grad=True)
        def fn(q, k, v):
            return flashcute.attention(q, k, v, causal=True, window=(3, 0), softcap=20.0).sum()
        try:
            torch.compile(fn, fullgraph=True, backend={backend!r})(q, q, q).backward()
        except Exception as exc:
            print("RAISED", type(exc).__name__, str(exc).splitlines()[0])
    """)
    assert f"RAISED ValueError {DEVICE_ERROR}" in result.stdout, result.stdout + result.stderr


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


def _bf16(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


_BAD_FORWARDS = {
    "float32": lambda: [_bf16(1, 8, 2, 64, dtype=torch.float32)] * 3,
    "heads": lambda: [_bf16(1, 8, 3, 64), _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64)],
    "headdim": lambda: [_bf16(1, 8, 2, 100)] * 3,
    "kv_shapes": lambda: [_bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64), _bf16(1, 9, 2, 64)],
    "rank": lambda: [_bf16(8, 2, 64)] * 3,
}


@pytest.mark.parametrize("case", sorted(_BAD_FORWARDS))
def test_forward_fake_agrees_with_the_real_call(case):
    """The fake implementation raises what the real call raises, so torch.compile users see
    a bad dtype, head count or head dim while tracing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _BAD_FORWARDS[case]()
    real = _error(lambda: torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None))
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in (q, k, v))
        fake = _error(lambda: torch.ops.flashcute.attention_forward(fq, fk, fv, False, 0.125, None))
    assert fake == real
    assert real[0] is not ValueError or DEVICE_ERROR not in real[1]


def test_forward_fake_error_surfaces_at_trace_time():
    q = _bf16(1, 8, 2, 100)
    compiled = torch.compile(lambda q: flashcute.attention(q, q, q), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match=r"q: head dim 100 is not supported"):
        compiled(q)


def test_backward_fake_agrees_with_the_real_call():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _bf16(1, 8, 4, 64), _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64)
    lse = torch.zeros(1, 4, 8)
    bad_dout = q.float()
    args = (bad_dout, q, k, v, q, lse, False, 0.125, False, None)
    real = _error(lambda: torch.ops.flashcute.attention_backward(*args))
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args]
        fake = _error(lambda: torch.ops.flashcute.attention_backward(*fake_args))
    assert fake == real and real[1].startswith("dout: dtype float32")


def test_meta_tensors_get_shapes():
    q = torch.empty(2, 9, 4, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 5, 2, 64, dtype=torch.bfloat16, device="meta")
    out, lse, _ = torch.ops.flashcute.attention_forward(q, k, k, True, 0.125, None)
    assert out.shape == q.shape and lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a meta tensor"):
        flashcute.attention(q, k, k)


def _qkv():
    return _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64)


@pytest.mark.parametrize("scale", [10**400, 1e300, 1e-300, 3e38, 1e-39])
def test_softmax_scale_out_of_float32_range(scale):
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite positive float"):
        flashcute.attention(*_qkv(), softmax_scale=scale)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite positive float"):
        flashcute.attention_backward(q, q, k, v, q, torch.zeros(1, 2, 8), softmax_scale=scale)


def test_softmax_scale_float32_limits_pass_python():
    from flashcute._validate import SOFTMAX_SCALE_MAX, SOFTMAX_SCALE_MIN, check_scalars

    for scale in (SOFTMAX_SCALE_MIN, SOFTMAX_SCALE_MAX, 1e-30, 1e30):
        check_scalars(False, scale, None)
    assert torch.isfinite(torch.tensor(SOFTMAX_SCALE_MAX, dtype=torch.float32)
                          * torch.tensor(1.4426950408889634, dtype=torch.float32))


def test_hopper_deterministic_refused_before_any_device_query():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^backend='hopper': .*deterministic=True"):
        flashcute.attention_backward(q, q, k, v, q, torch.zeros(1, 2, 8), deterministic=True,
                                     backend="hopper")


def test_deterministic_flag_type_checked():
    with pytest.raises(TypeError, match=r"^deterministic: expected a bool"):
        flashcute.attention(*_qkv(), deterministic=1)


# The C++ layer's checks run before it looks for a device, so CPU tensors reach them through
# the extension directly.


def _forward(q, k, v, out, lse=None):
    _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out),
               to_dlpack(lse) if lse is not None else None, 0.125, False, 0, 0, None)


def _backward(dout, q, k, v, out, lse, dq, dk, dv):
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    _C.backward(*(to_dlpack(x) for x in (dout, q, k, v, out, lse, dq, dk, dv, ws)),
                0.125, False, False, 0, 0)


def _no_device(fn):
    """``fn`` passes the host-side checks: without a GPU it then fails on the device query.
    (With one, CPU pointers would reach a kernel: the public API refuses CPU tensors first.)"""
    from conftest import gpu_capability

    if gpu_capability() is not None:
        return
    with pytest.raises(RuntimeError, match="no usable CUDA driver or GPU|CUDA"):
        fn()


def test_out_aliasing_q_is_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^out: shares memory with q"):
        _forward(q, k, v, q)
    with pytest.raises(ValueError, match=r"^out: shares memory with v"):
        _forward(q, k, v, v)
    _no_device(lambda: _forward(q, k, v, torch.empty_like(q)))


def test_partially_overlapping_out_is_refused():
    n = 8 * 2 * 64
    flat = _bf16(n + 64)
    q = flat[:n].view(1, 8, 2, 64)
    out = flat.as_strided((1, 8, 2, 64), q.stride(), storage_offset=64)
    k, v = _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64)
    with pytest.raises(ValueError, match=r"^out: shares memory with q"):
        _forward(q, k, v, out)


def test_out_overlapping_itself_is_refused():
    q, k, v = _qkv()
    out = torch.empty(8 * 64 + 64, dtype=torch.bfloat16).as_strided((1, 8, 2, 64), (512, 64, 64, 1))
    with pytest.raises(ValueError, match=r"^out: its elements overlap each other"):
        _forward(q, k, v, out)


def test_lse_sharing_out_memory_is_refused():
    q, k, v = _qkv()
    out = torch.empty_like(q)
    lse = out.view(-1).view(torch.float32)[:16].view(1, 2, 8)
    with pytest.raises(ValueError, match=r"^lse: shares memory with out"):
        _forward(q, k, v, out, lse)


def test_interleaved_views_of_one_buffer_are_accepted():
    """q, k, v as interleaved views of one packed (batch, seqlen, 3, heads, dim) buffer: reads
    may share a buffer."""
    qkv = _bf16(1, 8, 3, 2, 64)
    _no_device(lambda: _forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], torch.empty(1, 8, 2, 64, dtype=torch.bfloat16)))


def test_backward_gradient_aliasing_is_refused():
    q, k, v = _qkv()
    out, dout, lse = torch.empty_like(q), torch.empty_like(q), torch.zeros(1, 2, 8)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    with pytest.raises(ValueError, match=r"^dq: shares memory with q"):
        _backward(dout, q, k, v, out, lse, q, dk, dv)
    with pytest.raises(ValueError, match=r"^dv: shares memory with dk"):
        _backward(dout, q, k, v, out, lse, torch.empty_like(q), dk, dk)
    _no_device(lambda: _backward(dout, q, k, v, out, lse, torch.empty_like(q), dk, dv))


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_misalignment_names_the_tensor(name):
    tensors = dict(zip(("q", "k", "v"), _qkv()))
    tensors["out"] = torch.empty_like(tensors["q"])
    n = tensors[name].numel()
    tensors[name] = _bf16(n + 8)[1 : n + 1].view(tensors[name].shape)
    with pytest.raises(ValueError, match=rf"^{name}: needs a 16-byte aligned data pointer"):
        _forward(tensors["q"], tensors["k"], tensors["v"], tensors["out"])


def test_backward_fake_takes_autograd_gradients_of_any_layout():
    """Under torch.compile the backward op sees autograd's gradient as it is (expanded by a
    sum: stride 0); the real op copies such a gradient to a layout the kernel takes, and the
    fake must accept it too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _bf16(1, 8, 4, 64), _bf16(1, 8, 2, 64), _bf16(1, 8, 2, 64)
    dout = torch.ones(()).to(torch.bfloat16).expand(q.shape)
    with FakeTensorMode() as mode:
        fq, fk, fv, fd = (mode.from_tensor(x) for x in (q, k, v, dout))
        dq, dk, dv = torch.ops.flashcute.attention_backward(
            fd, fq, fk, fv, fq, mode.from_tensor(torch.zeros(1, 4, 8)), False, 0.125, False, None
        )
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_compiled_training_step_traces_to_the_device_error():
    """A compiled forward plus backward through a reduction traces (fakes of both ops) and
    then fails only where the real kernels would run: on the CPU tensors' device."""
    q = _bf16(1, 8, 2, 64).requires_grad_()
    compiled = torch.compile(lambda q: flashcute.attention(q, q, q, causal=True).sum(),
                             fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        compiled(q).backward()


@pytest.mark.parametrize("headdim", [0])
def test_compiled_call_names_a_bad_head_dim(headdim):
    q = torch.empty(1, 8, 2, headdim, dtype=torch.bfloat16)
    compiled = torch.compile(lambda q: flashcute.attention(q, q, q), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match=r"q: head dim 0 is not supported"):
        compiled(q)


def test_out_that_requires_grad_is_refused():
    q, k, v = _qkv()
    out = torch.empty_like(q).requires_grad_()
    with pytest.raises(NotImplementedError, match=r"out require grad"):
        flashcute.attention(q, k, v, out=out)

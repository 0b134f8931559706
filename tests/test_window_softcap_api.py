"""``window=`` and ``softcap=`` on the CPU: the argument checks on every route, and that every
route hands the extension the same window and softcap, forward and backward.

The plumbing tests swap the compiled extension for ``RecordingExtension``, which has the
binding's signatures and records each call, and let CPU tensors past the device check: the
kernels never run, and the tests need no GPU and no build. The numbers the kernels compute
for windows and softcap are checked on a GPU (tests/test_gpu_masks.py).
"""

from __future__ import annotations

import inspect
import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import _build_info, _frameworks, _torch_direct, _torch_ops  # noqa: E402
from flashcute import _validate, _validate_backward  # noqa: E402
from flashcute._validate import WINDOW_SIDE_MAX, check_softcap_scale  # noqa: E402

BAD_WINDOWS = [
    ((-2, 0), ValueError), ((0, -5), ValueError), ((1.0, 0), TypeError), ((0, 2.5), TypeError),
    ((True, 0), TypeError), ((0, False), TypeError), ((1,), TypeError), ((1, 2, 3), TypeError),
    (None, TypeError), (3, TypeError), ("ab", TypeError),
]
BAD_SOFTCAPS = [
    (-1.0, ValueError), (-1e-30, ValueError), (math.nan, ValueError), (math.inf, ValueError),
    (-math.inf, ValueError), (10**400, ValueError), ("1", TypeError), (None, TypeError),
    (True, TypeError), (False, TypeError), (1j, TypeError),
]


def _qkv(seqlen_q=8, seqlen_k=8, nheads=4, nheads_kv=2, headdim=64, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, seqlen_q, nheads, headdim)] + [(2, seqlen_k, nheads_kv, headdim)] * 2
    return [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_(requires_grad)
            for s in shapes]


def _bwd_args(**sizes):
    q, k, v = _qkv(**sizes)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    return torch.randn_like(q), q, k, v, torch.randn_like(q), lse


# ---------------------------------------------------------------------------------------------
# Signatures


@pytest.mark.parametrize("fn", [flashcute.attention, flashcute.attention_backward])
def test_window_and_softcap_are_keyword_only_with_defaults(fn):
    params = inspect.signature(fn).parameters
    for name, default in (("window", (-1, -1)), ("softcap", 0.0)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_custom_op_schemas_take_window_and_softcap_with_defaults():
    for op in ("attention_forward", "attention_forward_out", "attention_backward"):
        schema = str(getattr(torch.ops.flashcute, op).default._schema)
        assert "window_left=-1" in schema and "window_right=-1" in schema, schema
        assert "float softcap=0." in schema, schema


# ---------------------------------------------------------------------------------------------
# Bad values, on every route: the error names the argument before anything else is looked at.


@pytest.mark.parametrize("window,error", BAD_WINDOWS)
def test_bad_window_is_named(window, error):
    q, k, v = _qkv()
    match = r"^window: "
    with pytest.raises(error, match=match):
        flashcute.attention(q, k, v, window=window)
    with pytest.raises(error, match=match):  # the DLPack route (numpy: not an allocating framework)
        x = np.zeros((1, 4, 2, 64), dtype=np.float16)
        flashcute.attention(x, x, x, out=x.copy(), window=window)
    with pytest.raises(error, match=match):
        flashcute.attention_backward(*_bwd_args(), window=window)
    with pytest.raises(error, match=match):
        flashcute.attention(*_qkv(requires_grad=True), window=window)
    with pytest.raises(error, match=match):
        _validate.validate_forward(q, k, v, window=window)
    with pytest.raises(error, match=match):
        _validate_backward.validate_backward(*_bwd_args(), window=window)
    with pytest.raises(error, match=match):
        flashcute.reference.attention(q, k, v, window=window)


@pytest.mark.parametrize("softcap,error", BAD_SOFTCAPS)
def test_bad_softcap_is_named(softcap, error):
    q, k, v = _qkv()
    match = r"^softcap: "
    with pytest.raises(error, match=match):
        flashcute.attention(q, k, v, softcap=softcap)
    with pytest.raises(error, match=match):
        x = np.zeros((1, 4, 2, 64), dtype=np.float16)
        flashcute.attention(x, x, x, out=x.copy(), softcap=softcap)
    with pytest.raises(error, match=match):
        flashcute.attention_backward(*_bwd_args(), softcap=softcap)
    with pytest.raises(error, match=match):
        flashcute.attention(*_qkv(requires_grad=True), softcap=softcap)
    with pytest.raises(error, match=match):
        _validate.validate_forward(q, k, v, softcap=softcap)
    with pytest.raises(error, match=match):
        flashcute.flash_attn_func(q, k, v, softcap=softcap)
    if softcap is not False:  # the reference's softcap 0 is off, as flashcute's
        with pytest.raises(error, match=match):
            flashcute.reference.attention(q, k, v, softcap=softcap)


def _float32_oracle(softcap: float, scale: float) -> bool:
    """Whether the C++ layer takes this softcap with this scale: numpy's float32 arithmetic
    on the values the binding receives (both rounded to float32)."""
    with np.errstate(over="ignore", divide="ignore", under="ignore"):
        cap, s = np.float32(softcap), np.float32(scale)
        return bool(cap > 0 and np.isfinite(cap) and np.isfinite(cap / s)
                    and s / cap >= np.finfo(np.float32).tiny)


SOFTCAP_SCALE_CASES = [
    (1.0, 1.0), (50.0, 0.088), (2.0**126, 1.0), (2.0**126 * (1 + 2**-20), 1.0),
    (2.0**126 * (1 + 2**-30), 1.0),  # rounds to 2^126 in float32: taken, as by the C++ layer
    (1e-50, 1.0), (1e-45, 1.0), (1e39, 1.0), (3.4e38, 1.0), (1e10, 1e-30), (1e8, 1e-30),
    (1e-10, 1e30), (1e-30, 1e10), (1e-38, 1.2e-38), (1.0, 1.1754943508222875e-38),
    (1.0, 2.3e38), (3e38, 1.2e-38), (1e-5, 2.0),
]


@pytest.mark.parametrize("softcap,scale", SOFTCAP_SCALE_CASES)
def test_softcap_against_scale_matches_float32(softcap, scale):
    if _float32_oracle(softcap, scale):
        check_softcap_scale(softcap, scale)
    else:
        with pytest.raises(ValueError, match=r"^softcap: .*softmax_scale"):
            check_softcap_scale(softcap, scale)


def test_softcap_against_scale_has_both_outcomes():
    outcomes = {_float32_oracle(c, s) for c, s in SOFTCAP_SCALE_CASES}
    assert outcomes == {True, False}


@pytest.mark.parametrize("softcap,scale", [(1e-50, None), (1e39, None), (2.0**127, 1.0),
                                           (1e10, 1e-30)])
def test_softcap_too_small_or_large_for_the_scale_is_named(ext, softcap, scale):
    """The check against the default scale (1/sqrt(headdim)) as well as a given one, on the
    torch and DLPack routes, forward and backward; nothing reaches the extension."""
    from flashcute.attention import attention_dlpack
    from flashcute.backward import attention_backward_dlpack

    q, k, v = _qkv()
    match = r"^softcap: .*softmax_scale"
    for call in (
        lambda: flashcute.attention(q, k, v, softcap=softcap, softmax_scale=scale),
        lambda: flashcute.attention(*_qkv(requires_grad=True), softcap=softcap,
                                    softmax_scale=scale),
        lambda: attention_dlpack(q, k, v, softcap=softcap, softmax_scale=scale),
        lambda: flashcute.attention_backward(*_bwd_args(), softcap=softcap, softmax_scale=scale),
        lambda: attention_backward_dlpack(*_bwd_args(), softcap=softcap, softmax_scale=scale),
    ):
        with pytest.raises(ValueError, match=match):
            call()
    assert ext.calls == []


def test_good_values_reach_the_device_check():
    pytest.importorskip("flashcute._C")
    q, k, v = _qkv()
    for kwargs in (dict(window=(0, 0)), dict(window=[3, -1], causal=True), dict(softcap=30.0),
                   dict(window=(np.int64(2), np.int32(5)), softcap=np.float32(0.5)),
                   dict(window=(2**80, 2**70)), dict(softcap=1e-30, softmax_scale=1e-30)):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            flashcute.attention(q, k, v, **kwargs)
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            flashcute.attention_backward(*_bwd_args(), **kwargs)


def test_window_sides_are_clipped_to_int32():
    assert _validate.kernel_window((2**80, 7)) == (WINDOW_SIDE_MAX, 7)
    assert _validate.kernel_window([np.int64(-1), np.uint8(3)]) == (-1, 3)
    assert _validate.check_window((2**80, 0)) == (2**80, 0)  # the check itself keeps values
    assert all(type(side) is int for side in _validate.kernel_window((np.int16(1), 2)))


# The C++ layer checks window and softcap again (for C++ callers); it takes what Python takes.


def _binding_with_mask_arguments():
    ext = pytest.importorskip("flashcute._C")
    if "window_left" not in (ext.forward.__doc__ or ""):
        pytest.skip("this build of flashcute._C predates window and softcap")
    return ext


def _binding_forward(ext, *, softcap=0.0, scale=0.125, window=(-1, -1)):
    from torch.utils.dlpack import to_dlpack

    q, k, v = _qkv()
    out = torch.empty_like(q)
    ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), None, scale, False,
                ext.BACKEND_AMPERE, 0, None, window[0], window[1], softcap)


@pytest.mark.parametrize("softcap,scale", SOFTCAP_SCALE_CASES)
def test_binding_takes_the_softcaps_python_takes(softcap, scale):
    ext = _binding_with_mask_arguments()
    try:
        check_softcap_scale(softcap, scale)
    except ValueError:
        # A positive cap below float32's range reaches the binding as 0, which switches the
        # cap off: Python refuses it, as the caller asked for a cap.
        with np.errstate(over="ignore"):
            reaches_as_zero = np.float32(softcap) == 0
        if not reaches_as_zero:
            with pytest.raises(ValueError, match=r"^softcap: "):
                _binding_forward(ext, softcap=softcap, scale=scale)
            return
    from conftest import gpu_capability

    if gpu_capability() is None:  # with a GPU, CPU pointers would reach a kernel
        with pytest.raises(RuntimeError, match="no usable CUDA driver or GPU|CUDA"):
            _binding_forward(ext, softcap=softcap, scale=scale)


@pytest.mark.parametrize("window,name", [((-2, -1), "window_left"), ((0, -3), "window_right")])
def test_binding_refuses_window_sides_below_minus_one(window, name):
    ext = _binding_with_mask_arguments()
    with pytest.raises(ValueError, match=rf"^{name}: "):
        _binding_forward(ext, window=window)


# ---------------------------------------------------------------------------------------------
# Plumbing: what reaches the extension on each route.


def _received(x):
    """A tensor the extension received (a DLPack capsule or a DLPack object) as a torch
    tensor over the same memory, or None."""
    from torch.utils.dlpack import from_dlpack

    return None if x is None else from_dlpack(x)


class RecordingExtension:
    """Stands in for ``flashcute._C``: the binding's signatures, a full build on an sm90
    device, and a record of every call."""

    BACKEND_AMPERE, BACKEND_HOPPER, BACKEND_AUTO = 0, 1, 2

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def build_info(self):
        dims = "32;64;96;128;192;256"
        return {"version": "0", "cuda_archs": "80;90a", "cuda_runtime_version": 13000,
                "ampere_head_dims": dims, "ampere_dtypes": "float16;bfloat16",
                "hopper_head_dims": dims, "hopper_backward_head_dims": "64;128;256",
                "hopper_dtypes": "float16;bfloat16"}

    def device_capability(self, device):
        return 90

    def default_backend(self, capability):
        return "hopper" if capability == 90 else "ampere"

    def choose_kernel(self, backend, capability, headdim, headdim_v=0, dtype="", backward=False,
                      deterministic=False):
        """The library's dispatch policy on this stand-in's build (its own backend codes)."""
        from flashcute import _C

        info = self.build_info()
        build = {path: {"head_dims": [int(d) for d in info[f"{path}_head_dims"].split(";")],
                        "backward_head_dims": [int(d) for d in info.get(
                            f"{path}_backward_head_dims", info[f"{path}_head_dims"]).split(";")],
                        "dtypes": info[f"{path}_dtypes"].split(";")}
                 for path in ("ampere", "hopper")}
        ours = (self.BACKEND_AUTO, self.BACKEND_AMPERE, self.BACKEND_HOPPER)
        real = (_C.BACKEND_AUTO, _C.BACKEND_AMPERE, _C.BACKEND_HOPPER)
        code, d, dv = _C._choose_kernel_in(build, real[ours.index(backend)], capability, headdim,
                                           headdim_v, dtype, backward, deterministic)
        return ours[real.index(code)], d, dv

    def forward(self, q, k, v, out, lse, softmax_scale, causal, backend, stream, workspace=None,
                window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
        self.calls.append(("forward", dict(softmax_scale=softmax_scale, causal=causal,
                                           window=(window_left, window_right), softcap=softcap,
                                           alibi_slopes=_received(alibi_slopes))))

    def forward_workspace_size(self, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                               dtype, causal, backend, device, window_left=-1, window_right=-1,
                               alibi=False):
        self.calls.append(("forward_workspace_size",
                           dict(causal=causal, window=(window_left, window_right), alibi=alibi)))
        return 0

    def backward(self, dout, q, k, v, out, lse, dq, dk, dv, workspace, softmax_scale, causal,
                 deterministic, backend, stream, window_left=-1, window_right=-1, softcap=0.0,
                 alibi_slopes=None):
        self.calls.append(("backward", dict(softmax_scale=softmax_scale, causal=causal,
                                            window=(window_left, window_right), softcap=softcap,
                                            deterministic=deterministic,
                                            alibi_slopes=_received(alibi_slopes))))

    def backward_workspace_size(self, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                dtype, deterministic, backend, causal=False, window_left=-1,
                                window_right=-1):
        self.calls.append(("backward_workspace_size",
                           dict(causal=causal, window=(window_left, window_right))))
        return 16

    def of(self, name: str) -> list[dict]:
        return [args for called, args in self.calls if called == name]


@pytest.fixture
def ext(monkeypatch):
    """A RecordingExtension in place of flashcute._C, with CPU tensors passing the device
    check and stream 0 as the current stream."""
    fake = RecordingExtension()
    monkeypatch.setattr(_build_info, "_extension", fake)
    _build_info._cached_build_info.cache_clear()
    no_check = lambda first, others: None  # noqa: E731
    for module in (_validate, _validate_backward, _torch_ops):
        monkeypatch.setattr(module, "_check_devices", no_check)
    monkeypatch.setattr(_torch_direct, "_stream", lambda device: 0)
    monkeypatch.setattr(_frameworks.TorchFramework, "stream", lambda self, like: 0)
    _torch_direct._plans.clear()
    yield fake
    _torch_direct._plans.clear()
    _build_info._cached_build_info.cache_clear()


WINDOWS_AND_CAPS = [((3, 0), 0.0), ((-1, 2), 5.0), ((0, 0), 0.25), ((-1, -1), 30.0)]


@pytest.mark.parametrize("window,softcap", WINDOWS_AND_CAPS)
def test_direct_route_passes_window_and_softcap(ext, window, softcap):
    q, k, v = _qkv()
    flashcute.attention(q, k, v, window=window, softcap=softcap, causal=True)
    flashcute.attention(q, k, v, window=list(window), softcap=softcap, causal=True)  # same plan
    flashcute.attention(q, k, v, window=window, softcap=softcap, out=torch.empty_like(q))
    assert [c["window"] for c in ext.of("forward")] == [window] * 3
    assert [c["softcap"] for c in ext.of("forward")] == [softcap] * 3
    assert [c["window"] for c in ext.of("forward_workspace_size")] == [window] * 2
    ext.calls.clear()
    flashcute.attention_backward(*_bwd_args(), window=window, softcap=softcap, causal=True)
    (call,) = ext.of("backward")
    assert (call["window"], call["softcap"], call["causal"]) == (window, softcap, True)
    assert [c["window"] for c in ext.of("backward_workspace_size")] == [window]


def test_plans_are_kept_per_window_and_softcap(ext):
    q, k, v = _qkv()
    for window, softcap in [((3, 0), 0.0), ((4, 0), 0.0), ((3, 0), 1.0), ((3, 0), 0.0)]:
        flashcute.attention(q, k, v, window=window, softcap=softcap)
    assert [c["window"] for c in ext.of("forward_workspace_size")] == [(3, 0), (4, 0), (3, 0)]
    assert [(c["window"], c["softcap"]) for c in ext.of("forward")] == [
        ((3, 0), 0.0), ((4, 0), 0.0), ((3, 0), 1.0), ((3, 0), 0.0)]


def test_long_window_sides_reach_the_extension_clipped(ext):
    q, k, v = _qkv()
    flashcute.attention(q, k, v, window=(2**40, 10**30))
    assert ext.of("forward")[0]["window"] == (WINDOW_SIDE_MAX, WINDOW_SIDE_MAX)


@pytest.mark.parametrize("window,softcap", WINDOWS_AND_CAPS)
def test_dlpack_route_passes_window_and_softcap(ext, window, softcap):
    from flashcute.attention import attention_dlpack
    from flashcute.backward import attention_backward_dlpack

    q, k, v = _qkv()
    attention_dlpack(q, k, v, window=window, softcap=softcap, return_lse=True)
    (call,) = ext.of("forward")
    assert (call["window"], call["softcap"]) == (window, softcap)
    assert ext.of("forward_workspace_size")[0]["window"] == window
    attention_backward_dlpack(*_bwd_args(), window=window, softcap=softcap, deterministic=True)
    (call,) = ext.of("backward")
    assert (call["window"], call["softcap"], call["deterministic"]) == (window, softcap, True)
    assert ext.of("backward_workspace_size")[0]["window"] == window


@pytest.mark.parametrize("window,softcap", WINDOWS_AND_CAPS)
def test_autograd_backward_gets_the_forwards_window_and_softcap(ext, window, softcap):
    q, k, v = _qkv(requires_grad=True)
    out = flashcute.attention(q, k, v, window=window, softcap=softcap, softmax_scale=0.5)
    out.float().sum().backward()
    assert q.grad is not None and k.grad.shape == k.shape
    (fwd,) = ext.of("forward")
    (bwd,) = ext.of("backward")
    for call in (fwd, bwd):
        assert (call["window"], call["softcap"], call["softmax_scale"]) == (window, softcap, 0.5)


def test_compiled_training_step_passes_window_and_softcap(ext):
    """torch.compile(fullgraph=True) traces the front door and runs the custom ops, forward
    and backward, with the call's window, softcap and scale, also when they change from one
    call to the next (torch.compile then makes them symbolic)."""
    q, k, v = _qkv(requires_grad=True)

    def step(q, k, v, window, softcap, scale):
        out = flashcute.attention(q, k, v, causal=True, window=window, softcap=softcap,
                                  softmax_scale=scale)
        return out.float().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for window, softcap, scale in [((3, 0), 2.0, 0.5), ((-1, 1), 0.0, 0.25), ((5, 2), 1.5, 0.3),
                                   ((0, -1), 0.0, 0.125)]:
        ext.calls.clear()
        compiled(q, k, v, window, softcap, scale).backward()
        (fwd,) = ext.of("forward")
        (bwd,) = ext.of("backward")
        for call in (fwd, bwd):
            assert (call["window"], call["softcap"], call["softmax_scale"], call["causal"]) == (
                window, softcap, scale, True)


def test_compiled_call_with_out_passes_window_and_softcap(ext):
    q, k, v = _qkv()

    def fn(q, k, v, window, softcap):
        out = torch.empty_like(q)
        flashcute.attention(q, k, v, out=out, window=window, softcap=softcap)
        return out

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    for window, softcap in [((5, 1), 3.0), ((2, 0), 0.0), ((7, 7), 1.0)]:
        ext.calls.clear()
        compiled(q, k, v, window, softcap)
        (call,) = ext.of("forward")
        assert (call["window"], call["softcap"]) == (window, softcap)


def test_custom_ops_default_to_no_window_and_no_softcap(ext):
    q, k, v = _qkv()
    out, lse, _ = torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None)
    torch.ops.flashcute.attention_backward(torch.randn_like(q), q, k, v, out, lse, False, 0.125,
                                           False, None)
    for call in ext.of("forward") + ext.of("backward"):
        assert (call["window"], call["softcap"]) == ((-1, -1), 0.0)


def test_flash_attn_func_passes_window_size_and_softcap(ext):
    q, k, v = _qkv(seqlen_q=8, seqlen_k=8)
    flashcute.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), softcap=50.0)
    flashcute.flash_attn_func(q, k, v, window_size=(9, -3))  # FlashAttention: no bounds
    assert [(c["window"], c["softcap"]) for c in ext.of("forward")] == [((4, 0), 50.0),
                                                                         ((-1, -1), 0.0)]


# ---------------------------------------------------------------------------------------------
# Fakes and compile-time errors


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize("window_left,window_right,softcap,match", [
    (-2, -1, 0.0, "window: "), (0, -7, 0.0, "window: "), (-1, -1, -1.0, "softcap: "),
    (-1, -1, math.nan, "softcap: "), (-1, -1, 1e-50, "softcap: "),
])
def test_forward_and_backward_fakes_agree_with_the_real_ops(ext, window_left, window_right,
                                                            softcap, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    lse = torch.zeros(2, 4, 8)
    mask = (window_left, window_right, softcap)
    calls = {
        "forward": lambda q, k, v, lse: torch.ops.flashcute.attention_forward(
            q, k, v, False, 0.125, None, False, *mask),
        "forward_out": lambda q, k, v, lse: torch.ops.flashcute.attention_forward_out(
            q, k, v, torch.empty_like(q), False, 0.125, None, *mask),
        "backward": lambda q, k, v, lse: torch.ops.flashcute.attention_backward(
            q, q, k, v, q, lse, False, 0.125, False, None, *mask),
    }
    for name, call in calls.items():
        real = _error(lambda: call(q, k, v, lse))
        with FakeTensorMode() as mode:
            fake = _error(lambda: call(*(mode.from_tensor(x) for x in (q, k, v, lse))))
        assert fake == real, name
        assert real[1].startswith(match), real


def test_compiled_call_reports_a_bad_softcap_for_the_scale_while_tracing():
    q, k, v = _qkv()
    compiled = torch.compile(lambda q, k, v: flashcute.attention(q, k, v, softcap=1e-50),
                             fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"softcap: .*softmax_scale"):
        compiled(q, k, v)


@pytest.mark.parametrize("kwargs,match", [(dict(window=(-3, 0)), r"window: "),
                                          (dict(softcap=-2.0), r"softcap: ")])
def test_compiled_call_names_a_bad_window_or_softcap(kwargs, match):
    q, k, v = _qkv()
    compiled = torch.compile(lambda q, k, v: flashcute.attention(q, k, v, **kwargs),
                             fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=match):
        compiled(q, k, v)

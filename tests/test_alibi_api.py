"""``alibi_slopes=`` on the CPU: its checks on every route, that every route hands the extension
the caller's slopes (forward and backward), flash_attn_func's argument, the binding's own
checks, and the benchmark's ``--alibi``.

As in test_window_softcap_api.py, ``RecordingExtension`` stands in for the compiled extension
and CPU tensors pass the device check: no kernel runs. What the kernels compute with the
slopes is checked on a GPU (tests/test_gpu_alibi.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import _build_info, _validate, _validate_backward  # noqa: E402
from flashcute.bench import (  # noqa: E402
    BenchConfig, BenchRow, alibi_slopes, feature_name, feature_skip_reason, parse_args,
    with_feature,
)
from flashcute.bench.report import format_table, results_to_json  # noqa: E402

from test_window_softcap_api import (  # noqa: E402,F401
    RecordingExtension, _bwd_args, _error, _qkv, ext,
)

NHEADS, BATCH = 4, 2  # _qkv's query heads and batch


def _slopes(*shape, dtype=torch.float32):
    shape = shape or (NHEADS,)
    return (torch.arange(1, 1 + int(np.prod(shape)), dtype=torch.float32).reshape(shape) / 8).to(dtype)


BAD_SLOPES = [
    ("float64", lambda: _slopes(dtype=torch.float64), TypeError, r"^alibi_slopes: expected float32"),
    ("float16", lambda: _slopes(dtype=torch.float16), TypeError, r"^alibi_slopes: expected float32"),
    ("int32", lambda: torch.ones(NHEADS, dtype=torch.int32), TypeError,
     r"^alibi_slopes: expected float32"),
    ("nheads+1", lambda: _slopes(NHEADS + 1), ValueError, r"^alibi_slopes: expected shape"),
    ("batch+1", lambda: _slopes(BATCH + 1, NHEADS), ValueError, r"^alibi_slopes: expected shape"),
    ("transposed", lambda: _slopes(NHEADS, BATCH), ValueError, r"^alibi_slopes: expected shape"),
    ("3d", lambda: _slopes(BATCH, NHEADS, 1), ValueError, r"^alibi_slopes: expected shape"),
    ("scalar", lambda: torch.tensor(0.5), ValueError, r"^alibi_slopes: expected shape"),
    ("strided", lambda: _slopes(2 * NHEADS)[::2], ValueError,
     r"^alibi_slopes: expected unit stride over heads"),
    ("column", lambda: _slopes(NHEADS, BATCH).t(), ValueError,
     r"^alibi_slopes: expected unit stride over heads"),
]
_BAD_IDS = [c[0] for c in BAD_SLOPES]
_BAD_PARAMS = [c[1:] for c in BAD_SLOPES]


# ---------------------------------------------------------------------------------------------
# Signatures


@pytest.mark.parametrize("fn", [flashcute.attention, flashcute.attention_backward])
def test_alibi_slopes_is_keyword_only_and_off_by_default(fn):
    param = inspect.signature(fn).parameters["alibi_slopes"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None


def test_custom_op_schemas_take_optional_slopes():
    for op in ("attention_forward", "attention_forward_out", "attention_backward"):
        schema = str(getattr(torch.ops.flashcute, op).default._schema)
        assert "Tensor? alibi_slopes=None" in schema, schema


# ---------------------------------------------------------------------------------------------
# Bad slopes, on every route: named before any device or kernel is looked at.


@pytest.mark.parametrize("make, error, match", _BAD_PARAMS, ids=_BAD_IDS)
def test_bad_slopes_are_named_on_every_route(ext, make, error, match):
    from flashcute.attention import attention_dlpack
    from flashcute.backward import attention_backward_dlpack

    q, k, v = _qkv()
    slopes = make()
    calls = {
        "direct": lambda: flashcute.attention(q, k, v, alibi_slopes=slopes),
        "out": lambda: flashcute.attention(q, k, v, alibi_slopes=slopes, out=torch.empty_like(q)),
        "autograd": lambda: flashcute.attention(*_qkv(requires_grad=True), alibi_slopes=slopes),
        "dlpack": lambda: attention_dlpack(q, k, v, alibi_slopes=slopes),
        "backward": lambda: flashcute.attention_backward(*_bwd_args(), alibi_slopes=slopes),
        "backward-dlpack": lambda: attention_backward_dlpack(*_bwd_args(), alibi_slopes=slopes),
        "validate": lambda: _validate.validate_forward(q, k, v, alibi_slopes=slopes),
        "validate-backward": lambda: _validate_backward.validate_backward(
            *_bwd_args(), alibi_slopes=slopes),
        "flash_attn_func": lambda: flashcute.flash_attn_func(q, k, v, alibi_slopes=slopes),
        "custom-op": lambda: torch.ops.flashcute.attention_forward(
            q, k, v, False, 0.125, None, False, -1, -1, 0.0, slopes),
    }
    for name, call in calls.items():
        with pytest.raises(error, match=match):
            call()
    assert ext.of("forward") == [] and ext.of("backward") == []


class _NumpyExtension(RecordingExtension):
    """Reads numpy arrays as the binding's ``inspect`` does."""

    def inspect(self, x):
        strides = tuple(s // x.itemsize for s in x.strides)
        return 1, 0, str(x.dtype), tuple(x.shape), strides


def test_bad_slopes_on_the_numpy_route_are_named(monkeypatch):
    """DLPack tensors of another framework (numpy, with out=) are checked alike."""
    monkeypatch.setattr(_build_info, "_extension", _NumpyExtension())
    x = np.zeros((2, 4, 4, 64), dtype=np.float16)
    for slopes, error, match in (
        (np.ones(4, dtype=np.float64), TypeError, r"^alibi_slopes: expected float32"),
        (np.ones((3, 4), dtype=np.float32), ValueError, r"^alibi_slopes: expected shape"),
        (np.ones(8, dtype=np.float32)[::2], ValueError, r"^alibi_slopes: expected unit stride"),
        ([0.5] * 4, TypeError, r"^alibi_slopes: expected a DLPack tensor"),
    ):
        with pytest.raises(error, match=match):
            flashcute.attention(x, x, x, out=x.copy(), alibi_slopes=slopes)


@pytest.mark.parametrize("slopes", [[0.5] * NHEADS, np.ones(NHEADS, dtype=np.float32), 0.5])
def test_torch_calls_take_torch_slopes(slopes):
    """Another framework's array (or a list) would leave a torch call without autograd and
    torch.compile: refused by name, forward and backward."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor like q"):
        flashcute.attention(q, k, v, alibi_slopes=slopes)
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor like q"):
        flashcute.attention_backward(*_bwd_args(), alibi_slopes=slopes)


class _FakeDLPack:
    """A DLPack object of no known framework, described by the recording extension."""

    def __init__(self, device_type, device_id, dtype, shape):
        self.info = (device_type, device_id, dtype, tuple(shape),
                     tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape))))

    def __dlpack__(self, stream=None):  # pragma: no cover - never exported here
        raise AssertionError("not exported")

    def __dlpack_device__(self):
        return self.info[:2]


class _InspectingExtension(RecordingExtension):
    def inspect(self, x):
        return x.info


@pytest.mark.parametrize("device_type, device_id, match", [
    (1, 0, r"^alibi_slopes: expected a CUDA tensor, got a CPU tensor"),
    (2, 1, r"^alibi_slopes: on CUDA device 1, but q is on CUDA device 0"),
])
def test_slopes_on_another_device_are_named(monkeypatch, device_type, device_id, match):
    fake = _InspectingExtension()
    monkeypatch.setattr(_build_info, "_extension", fake)
    _build_info._cached_build_info.cache_clear()
    q = _FakeDLPack(2, 0, "float16", (2, 8, 4, 64))
    kv = _FakeDLPack(2, 0, "float16", (2, 8, 2, 64))
    lse = _FakeDLPack(2, 0, "float32", (2, 4, 8))
    slopes = _FakeDLPack(device_type, device_id, "float32", (4,))
    try:
        with pytest.raises(ValueError, match=match):
            _validate.validate_forward(q, kv, kv, alibi_slopes=slopes)
        with pytest.raises(ValueError, match=match):
            flashcute.attention(q, kv, kv, out=q, alibi_slopes=slopes)
        with pytest.raises(ValueError, match=match):
            _validate_backward.validate_backward(q, q, kv, kv, q, lse, alibi_slopes=slopes)
        assert fake.of("forward") == []
    finally:
        _build_info._cached_build_info.cache_clear()


def test_good_slopes_reach_the_device_check():
    pytest.importorskip("flashcute._C")
    q, k, v = _qkv()
    for slopes in (_slopes(), _slopes(BATCH, NHEADS), _slopes().expand(BATCH, NHEADS)):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            flashcute.attention(q, k, v, alibi_slopes=slopes)
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            flashcute.attention_backward(*_bwd_args(), alibi_slopes=slopes)


# ---------------------------------------------------------------------------------------------
# Fakes and compile-time errors


@pytest.mark.parametrize("make, error, match", _BAD_PARAMS[:5], ids=_BAD_IDS[:5])
def test_fakes_agree_with_the_real_ops_on_bad_slopes(ext, make, error, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    lse = torch.zeros(2, 4, 8)
    slopes = make()
    calls = {
        "forward": lambda q, k, v, lse, s: torch.ops.flashcute.attention_forward(
            q, k, v, False, 0.125, None, False, -1, -1, 0.0, s),
        "forward_out": lambda q, k, v, lse, s: torch.ops.flashcute.attention_forward_out(
            q, k, v, torch.empty_like(q), False, 0.125, None, -1, -1, 0.0, s),
        "backward": lambda q, k, v, lse, s: torch.ops.flashcute.attention_backward(
            q, q, k, v, q, lse, False, 0.125, False, None, -1, -1, 0.0, s),
    }
    for name, call in calls.items():
        real = _error(lambda: call(q, k, v, lse, slopes))
        with FakeTensorMode() as mode:
            fake = _error(lambda: call(*(mode.from_tensor(x) for x in (q, k, v, lse, slopes))))
        assert fake == real, name
        assert real[0] is error and real[1].startswith("alibi_slopes: "), real


def test_compiled_call_names_bad_slopes_while_tracing():
    q, k, v = _qkv()
    compiled = torch.compile(lambda q, k, v, s: flashcute.attention(q, k, v, alibi_slopes=s),
                             fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"alibi_slopes: expected float32"):
        compiled(q, k, v, _slopes(dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Plumbing: the slopes that reach the extension on each route.


def _same(received, slopes) -> bool:
    return received is not None and torch.equal(received, slopes)


@pytest.mark.parametrize("shape", [(NHEADS,), (BATCH, NHEADS)])
def test_direct_route_passes_the_slopes(ext, shape):
    q, k, v = _qkv()
    slopes = _slopes(*shape)
    flashcute.attention(q, k, v, alibi_slopes=slopes, causal=True)
    flashcute.attention(q, k, v, alibi_slopes=slopes * 2, causal=True)  # same plan, new values
    flashcute.attention(q, k, v, alibi_slopes=slopes, out=torch.empty_like(q))
    calls = ext.of("forward")
    assert [_same(c["alibi_slopes"], s) for c, s in zip(calls, (slopes, slopes * 2, slopes))] == [
        True] * 3
    assert [c["alibi"] for c in ext.of("forward_workspace_size")] == [True, True]
    ext.calls.clear()
    flashcute.attention_backward(*_bwd_args(), alibi_slopes=slopes, causal=True)
    (call,) = ext.of("backward")
    assert _same(call["alibi_slopes"], slopes) and call["causal"]


def test_no_slopes_reach_the_extension_as_none(ext):
    q, k, v = _qkv()
    flashcute.attention(q, k, v)
    flashcute.attention_backward(*_bwd_args())
    assert ext.of("forward")[0]["alibi_slopes"] is None
    assert ext.of("backward")[0]["alibi_slopes"] is None
    assert ext.of("forward_workspace_size")[0]["alibi"] is False


def test_plans_are_kept_per_slopes_layout(ext):
    """Slopes are part of the call signature by layout (shape, strides, dtype, device), not by
    value: new values reuse the plan, a new layout makes one (and is checked)."""
    q, k, v = _qkv()
    for slopes in (None, _slopes(), _slopes() + 1, _slopes(BATCH, NHEADS),
                   _slopes().expand(BATCH, NHEADS), None):
        flashcute.attention(q, k, v, alibi_slopes=slopes)
    assert [c["alibi"] for c in ext.of("forward_workspace_size")] == [False, True, True, True]
    assert len(ext.of("forward")) == 6


def test_dlpack_route_passes_the_slopes(ext):
    from flashcute.attention import attention_dlpack
    from flashcute.backward import attention_backward_dlpack

    q, k, v = _qkv()
    slopes = _slopes(BATCH, NHEADS)
    attention_dlpack(q, k, v, alibi_slopes=slopes, return_lse=True)
    assert _same(ext.of("forward")[0]["alibi_slopes"], slopes)
    assert ext.of("forward_workspace_size")[0]["alibi"] is True
    attention_backward_dlpack(*_bwd_args(), alibi_slopes=slopes, deterministic=True)
    assert _same(ext.of("backward")[0]["alibi_slopes"], slopes)


def test_autograd_backward_gets_the_forwards_slopes(ext):
    q, k, v = _qkv(requires_grad=True)
    slopes = _slopes(BATCH, NHEADS)
    out = flashcute.attention(q, k, v, alibi_slopes=slopes, softmax_scale=0.5)
    out.float().sum().backward()
    assert q.grad is not None and k.grad.shape == k.shape
    for call in (ext.of("forward")[0], ext.of("backward")[0]):
        assert _same(call["alibi_slopes"], slopes) and call["softmax_scale"] == 0.5


def test_slopes_that_require_grad_get_none(ext):
    q, k, v = _qkv(requires_grad=True)
    slopes = _slopes().requires_grad_(True)
    flashcute.attention(q, k, v, alibi_slopes=slopes).float().sum().backward()
    assert slopes.grad is None and q.grad is not None
    assert _same(ext.of("backward")[0]["alibi_slopes"], slopes.detach())


def test_compiled_training_step_passes_the_slopes(ext):
    """torch.compile(fullgraph=True) traces the front door and runs the custom ops with the
    call's slopes, forward and backward, also when their values change between calls."""
    q, k, v = _qkv(requires_grad=True)

    def step(q, k, v, slopes):
        out = flashcute.attention(q, k, v, causal=True, window=(3, 0), softcap=2.0,
                                  alibi_slopes=slopes)
        return out.float().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for slopes in (_slopes(), _slopes() * 3, _slopes(BATCH, NHEADS)):
        ext.calls.clear()
        compiled(q, k, v, slopes).backward()
        (fwd,) = ext.of("forward")
        (bwd,) = ext.of("backward")
        for call in (fwd, bwd):
            assert _same(call["alibi_slopes"], slopes)
            assert (call["window"], call["softcap"], call["causal"]) == ((3, 0), 2.0, True)


def test_compiled_call_with_out_passes_the_slopes(ext):
    q, k, v = _qkv()

    def fn(q, k, v, slopes):
        out = torch.empty_like(q)
        flashcute.attention(q, k, v, out=out, alibi_slopes=slopes)
        return out

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    slopes = _slopes(BATCH, NHEADS)
    compiled(q, k, v, slopes)
    assert _same(ext.of("forward")[0]["alibi_slopes"], slopes)


def test_custom_ops_default_to_no_slopes(ext):
    q, k, v = _qkv()
    out, lse, _ = torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None)
    torch.ops.flashcute.attention_backward(torch.randn_like(q), q, k, v, out, lse, False, 0.125,
                                           False, None)
    assert [c["alibi_slopes"] for c in ext.of("forward") + ext.of("backward")] == [None, None]


def test_flash_attn_func_passes_the_slopes(ext):
    q, k, v = _qkv()
    slopes = _slopes(BATCH, NHEADS)
    flashcute.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    flashcute.flash_attn_func(q, k, v, 0.0, None, False, (-1, -1), 0.0, slopes)  # positional
    assert [_same(c["alibi_slopes"], slopes) for c in ext.of("forward")] == [True, True]


# ---------------------------------------------------------------------------------------------
# The binding checks the slopes again (for callers of the extension), and the Hopper forward
# does not pack the query heads of a group under ALiBi.


def _binding_with_alibi():
    ext = pytest.importorskip("flashcute._C")
    if "alibi_slopes" not in (ext.forward.__doc__ or ""):
        pytest.skip("this build of flashcute._C predates alibi_slopes")
    return ext


@pytest.mark.parametrize("slopes, error, match", [
    (_slopes(dtype=torch.float64), TypeError, r"^alibi_slopes: expected float32"),
    (_slopes(NHEADS + 1), ValueError, r"^alibi_slopes: expected shape"),
    (_slopes(BATCH + 1, NHEADS), ValueError, r"^alibi_slopes: expected shape"),
    (_slopes(2 * NHEADS)[::2], ValueError, r"^alibi_slopes: expected unit stride"),
], ids=["float64", "nheads+1", "batch+1", "strided"])
def test_binding_refuses_bad_slopes(slopes, error, match):
    from torch.utils.dlpack import to_dlpack

    ext = _binding_with_alibi()
    q, k, v = _qkv()
    out = torch.empty_like(q)
    with pytest.raises(error, match=match):
        ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), None, 0.125, False,
                    ext.BACKEND_AMPERE, 0, None, -1, -1, 0.0, to_dlpack(slopes))
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    grads = [torch.empty_like(x) for x in (q, k, v)]
    with pytest.raises(error, match=match):
        ext.backward(*(to_dlpack(x) for x in (q, q, k, v, q, lse, *grads)),
                     to_dlpack(torch.empty(16, dtype=torch.uint8)), 0.125, False, False,
                     ext.BACKEND_AMPERE, 0, -1, -1, 0.0, to_dlpack(slopes))


def test_hopper_forward_packs_no_heads_under_alibi():
    ext = _binding_with_alibi()
    # A GQA decoding step that packs its group of 4 query heads without ALiBi.
    assert ext._forward_packed_heads(32, 8, 1, 4096, 128, False) == 4
    assert ext._forward_packed_heads(32, 8, 1, 4096, 128, False, alibi=True) == 1


# ---------------------------------------------------------------------------------------------
# The benchmark's --alibi


def test_bench_alibi_slopes_and_feature_names():
    assert alibi_slopes(4) == [0.25, 0.0625, 0.015625, 0.00390625]
    assert alibi_slopes(8)[0] == 0.5 and alibi_slopes(8)[-1] == 2.0**-8
    assert feature_name(alibi=True) == "alibi"
    assert feature_name((128, 0), 0.0, True) == "window+alibi"
    assert feature_name((128, 0), 30.0, True) == "window+softcap+alibi"
    assert feature_name(softcap=30.0, alibi=True) == "softcap+alibi"
    cfg = BenchConfig("bf16", 128, True, 4096, 4, 16, alibi=True)
    assert cfg.feature == "alibi" and "alibi" in cfg.label
    assert cfg.dense() == BenchConfig("bf16", 128, True, 4096, 4, 16)
    assert cfg.key != cfg.dense().key


def test_bench_alibi_configs_and_json(tmp_path):
    base = [BenchConfig("bf16", 128, True, 4096, 4, 16)]
    assert [c.feature for c in with_feature(base, alibi=True)] == ["alibi"]
    assert [c.feature for c in with_feature(base, alibi=True, with_dense=True)] == [
        "dense", "alibi"]
    with pytest.raises(ValueError, match="alibi"):
        with_feature(base, alibi=1)
    rows = [BenchRow.from_config("flashcute-hopper", base[0], 500.0),
            BenchRow.from_config("flashcute-hopper", dataclasses.replace(base[0], alibi=True),
                                 480.0, bwd_tflops=300.0)]
    loaded = json.loads(json.dumps(results_to_json(
        rows, device="d", torch_version="t", flashcute_version="v", dtype="bf16")))["rows"]
    assert [r["feature"] for r in loaded] == ["dense", "alibi"]
    assert "alibi" not in loaded[0] and loaded[1]["alibi"] is True
    table = format_table(rows)
    assert "hopper/dense" in table and "0.96x" in table  # 480 / 500 on the ALiBi line


def test_bench_parse_alibi():
    assert parse_args([]).alibi is False
    args = parse_args(["--alibi", "--with-dense"])
    assert args.alibi and args.with_dense
    assert feature_skip_reason("flashcute-hopper", alibi=True) is None
    for impl in ("sdpa-cudnn", "fa3"):
        reason = feature_skip_reason(impl, alibi=True)
        assert reason is not None and "alibi" in reason and impl in reason


def test_bench_forward_fn_passes_slopes(monkeypatch):
    import types

    from flashcute.bench import impls

    calls: list[dict] = []
    fake = types.SimpleNamespace(attention=lambda q, k, v, **kw: calls.append(kw) or q)
    monkeypatch.setattr(impls, "_import_flashcute", lambda: fake)
    q = k = v = torch.zeros(1, 4, 8, 16)
    impls.make_forward_fn("flashcute-hopper", q, k, v, True)()
    impls.make_forward_fn("flashcute-ampere", q, k, v, False, window=(16, 0), alibi=True)()
    assert calls[0] == {"causal": True, "backend": "hopper"}  # dense: no extra keyword
    slopes = calls[1].pop("alibi_slopes")
    assert calls[1] == {"causal": False, "backend": "ampere", "window": (16, 0)}
    assert slopes.dtype == torch.float32 and slopes.tolist() == alibi_slopes(8)
    with pytest.raises(ValueError, match="not timed with alibi"):
        impls.make_forward_fn("sdpa-cudnn", q, k, v, True, alibi=True)


def test_bench_reference_with_alibi_slices_like_the_whole():
    import flashcute.reference
    from flashcute.bench.timing import feature_reference, reference_output

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 9, 6, 16, generator=gen)
    k = torch.randn(2, 13, 2, 16, generator=gen)
    v = torch.randn(2, 13, 2, 16, generator=gen)
    slopes = torch.tensor(alibi_slopes(6))
    for causal, window in ((True, (3, 0)), (False, (-1, -1))):
        expected = flashcute.reference.attention(q, k, v, causal=causal, window=window,
                                                 alibi_slopes=slopes).float()
        for chunk_bytes in (1, 1 << 30):
            got = feature_reference(q, k, v, causal, window=window, alibi=True,
                                    chunk_bytes=chunk_bytes)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        got = reference_output(q, k, v, causal, window=window, alibi=True)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        plain = reference_output(q, k, v, causal, window=window)
        assert (plain - expected).abs().max() > 1e-3  # the slopes mattered

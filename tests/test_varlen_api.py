"""Variable-length batches on the CPU: the argument checks of ``attention_varlen``,
``attention_varlen_backward`` and ``flash_attn_varlen_func`` on every route, and what every
route hands the extension (offsets, seqused_k, max_seqlen, the sizes of the workspace
queries), forward and backward, eager, autograd and compiled.

The plumbing tests swap the compiled extension for ``VarlenRecordingExtension``, which has
the binding's signatures and records each call, and let CPU tensors past the device check:
the kernels never run. The numbers the kernels compute are checked on a GPU
(tests/test_gpu_varlen.py).
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import _build_info, _frameworks, _torch_direct, _torch_ops  # noqa: E402
from flashcute import _torch_varlen, _validate, _validate_backward, _validate_varlen  # noqa: E402
from flashcute._validate import _Info  # noqa: E402

from test_window_softcap_api import RecordingExtension  # noqa: E402

LENGTHS_Q = (3, 0, 5)
LENGTHS_K = (4, 2, 6)


def _offsets(lengths, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=dtype)


def _packed(nheads=4, nheads_kv=2, headdim=64, requires_grad=False):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for 3 sequences."""
    gen = torch.Generator().manual_seed(0)
    total_q, total_k = sum(LENGTHS_Q), sum(LENGTHS_K)
    shapes = [(total_q, nheads, headdim)] + [(total_k, nheads_kv, headdim)] * 2
    q, k, v = (torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_(requires_grad)
               for s in shapes)
    return q, k, v, _offsets(LENGTHS_Q), _offsets(LENGTHS_K), max(LENGTHS_Q), max(LENGTHS_K)


def _bwd_args():
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    lse = torch.zeros(q.shape[1], q.shape[0])
    return (torch.randn_like(q), q, k, v, torch.randn_like(q), lse, cu_q, cu_k, max_q, max_k)


# ---------------------------------------------------------------------------------------------
# Signatures


def test_exported():
    for name in ("attention_varlen", "attention_varlen_backward", "flash_attn_varlen_func"):
        assert name in flashcute.__all__ and callable(getattr(flashcute, name))


@pytest.mark.parametrize("fn", [flashcute.attention_varlen, flashcute.attention_varlen_backward])
def test_keywords_and_defaults(fn):
    params = inspect.signature(fn).parameters
    positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional[-4:] == ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    for name, default in (("seqused_k", None), ("causal", False), ("softmax_scale", None),
                          ("window", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                          ("backend", None)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_flash_attn_varlen_func_keeps_flash_attentions_positional_order():
    params = list(inspect.signature(flashcute.flash_attn_varlen_func).parameters)
    assert params[:15] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
        "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs"]


def test_custom_op_schemas():
    for op in ("attention_varlen_forward", "attention_varlen_forward_out",
               "attention_varlen_backward"):
        schema = str(getattr(torch.ops.flashcute, op).default._schema)
        for arg in ("Tensor cu_seqlens_q", "Tensor cu_seqlens_k", "Tensor? seqused_k",
                    "max_seqlen_q", "max_seqlen_k", "window_left=-1", "float softcap=0.",
                    "Tensor? alibi_slopes=None"):
            assert arg in schema, (op, schema)


# ---------------------------------------------------------------------------------------------
# Bad arguments, on every route: the error names the argument.


def _routes(**bad):
    """Zero-argument calls of every route with the keyword arguments ``bad`` replacing the
    defaults (positional ones by name)."""
    from flashcute.varlen import attention_varlen_backward_dlpack, attention_varlen_dlpack

    def forward(fn, requires_grad=False, with_out=False):
        q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=requires_grad)
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                    max_seqlen_k=max_k)
        args.update(bad)
        if with_out:  # an out of q's shape and dtype, whatever q is
            args["out"] = torch.empty_like(args["q"])
        return lambda: fn(**args)

    def backward(fn):
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k = _bwd_args()
        args = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
        args.update(bad)
        if "q" in bad:  # out and dout follow q
            args["out"], args["dout"] = torch.empty_like(bad["q"]), torch.empty_like(bad["q"])
        return lambda: fn(**args)

    return {
        "torch": forward(flashcute.attention_varlen),
        "autograd": forward(flashcute.attention_varlen, requires_grad=True),
        "out": forward(flashcute.attention_varlen, with_out=True),
        "dlpack": forward(attention_varlen_dlpack),
        "validate": forward(_validate_varlen.validate_varlen),
        "backward": backward(flashcute.attention_varlen_backward),
        "backward_dlpack": backward(attention_varlen_backward_dlpack),
        "validate_backward": backward(_validate_varlen.validate_varlen_backward),
    }


BAD_ARGUMENTS = [
    (dict(cu_seqlens_q=_offsets(LENGTHS_Q, torch.int64)), TypeError, r"^cu_seqlens_q: .*int32"),
    (dict(cu_seqlens_k=_offsets(LENGTHS_K).float()), TypeError, r"^cu_seqlens_k: .*int32"),
    (dict(cu_seqlens_q=_offsets(LENGTHS_Q)[None]), ValueError, r"^cu_seqlens_q: .*1-d"),
    (dict(cu_seqlens_q=torch.tensor([0], dtype=torch.int32)), ValueError,
     r"^cu_seqlens_q: .*batch \+ 1 >= 2"),
    (dict(cu_seqlens_k=torch.zeros(0, dtype=torch.int32)), ValueError,
     r"^cu_seqlens_k: .*batch \+ 1 >= 2"),
    (dict(cu_seqlens_k=_offsets((4, 8))), ValueError, r"^cu_seqlens_k: 3 offsets, but cu_seqlens_q has 4"),
    (dict(cu_seqlens_q=torch.arange(8, dtype=torch.int32)[::2]), ValueError,
     r"^cu_seqlens_q: expected a contiguous"),
    (dict(cu_seqlens_q=[0, 3, 3, 8]), TypeError,
     r"^cu_seqlens_q: expected a (DLPack tensor|torch.Tensor)"),
    (dict(max_seqlen_q=-1), ValueError, r"^max_seqlen_q: "),
    (dict(max_seqlen_k=-5), ValueError, r"^max_seqlen_k: "),
    (dict(max_seqlen_q=5.0), TypeError, r"^max_seqlen_q: expected an int"),
    (dict(max_seqlen_k=True), TypeError, r"^max_seqlen_k: expected an int"),
    (dict(max_seqlen_q=None), TypeError, r"^max_seqlen_q: expected an int"),
    (dict(seqused_k=torch.tensor([1, 2], dtype=torch.int32)), ValueError,
     r"^seqused_k: expected shape \(3,\)"),
    (dict(seqused_k=torch.tensor([1, 2, 3])), TypeError, r"^seqused_k: .*int32"),
    (dict(seqused_k=torch.ones(3, 1, dtype=torch.int32)), ValueError, r"^seqused_k: .*1-d"),
    (dict(q=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16)), ValueError,
     r"^q: expected a 3-d packed tensor"),
    (dict(k=torch.zeros(12, 2, 64, 1, dtype=torch.bfloat16)), ValueError,
     r"^k: expected a 3-d packed tensor"),
    (dict(q=torch.zeros(8, 4, 60, dtype=torch.bfloat16), k=torch.zeros(12, 2, 60, dtype=torch.bfloat16),
          v=torch.zeros(12, 2, 60, dtype=torch.bfloat16)), ValueError, r"^q: head dim 60"),
    (dict(q=torch.zeros(8, 3, 64, dtype=torch.bfloat16)), ValueError, r"^q, k: "),
    (dict(v=torch.zeros(11, 2, 64, dtype=torch.bfloat16)), ValueError, r"^v: shape"),
    (dict(q=torch.zeros(8, 4, 64, dtype=torch.float32)), TypeError, r"^q: expected float16"),
    (dict(k=torch.zeros(12, 2, 64, dtype=torch.float16)), TypeError, r"^k: dtype float16"),
    (dict(q=torch.zeros(8, 4, 128, dtype=torch.bfloat16)[..., ::2]), ValueError,
     r"^q: expected unit stride"),
    (dict(causal=1), TypeError, r"^causal: "),
    (dict(window=(-2, 0)), ValueError, r"^window: "),
    (dict(softcap=-1.0), ValueError, r"^softcap: "),
    (dict(softmax_scale=0.0), ValueError, r"^softmax_scale: "),
    (dict(backend="volta"), ValueError, r"^backend: "),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.float64)), TypeError,
     r"^alibi_slopes: expected float32"),
    (dict(alibi_slopes=torch.ones(2, 4)), ValueError,
     r"^alibi_slopes: expected shape \(nheads,\) = \(4,\) or \(batch, nheads\) = \(3, 4\)"),
    (dict(alibi_slopes=torch.ones(5)), ValueError, r"^alibi_slopes: expected shape"),
    (dict(alibi_slopes=torch.ones(3, 8)[:, ::2]), ValueError, r"^alibi_slopes: expected unit stride"),
    (dict(alibi_slopes=[0.5] * 4), TypeError, r"^alibi_slopes: expected a (DLPack tensor|torch.Tensor)"),
]


def _expect(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("bad,error,match", BAD_ARGUMENTS)
def test_bad_argument_is_named_on_every_route(ext, bad, error, match):
    for name, call in _routes(**bad).items():
        try:
            _expect(call, error, match)
        except BaseException as exc:
            raise AssertionError(f"route {name}: {exc}") from exc
    assert ext.of("forward") == [] and ext.of("backward") == []


@pytest.mark.parametrize("bad,error,match", [
    (dict(out=torch.zeros(9, 4, 64, dtype=torch.bfloat16)), ValueError, r"^out: expected shape"),
    (dict(out=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16)), ValueError, r"^out: expected a 3-d"),
    (dict(return_lse=1), TypeError, r"^return_lse: "),
    (dict(deterministic=None), TypeError, r"^deterministic: "),
])
def test_bad_forward_only_argument_is_named(ext, bad, error, match):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    with pytest.raises(error, match=match):
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **bad)


@pytest.mark.parametrize("bad,error,match", [
    (dict(lse=torch.zeros(1, 4, 8)), ValueError, r"^lse: .*\(nheads, total_q\)"),
    (dict(lse=torch.zeros(8, 4)), ValueError, r"^lse: "),
    (dict(lse=torch.zeros(4, 8, dtype=torch.float16)), ValueError, r"^lse: .*float32"),
    (dict(lse=torch.zeros(8, 4).t()), ValueError, r"^lse: expected unit stride"),
    (dict(dout=torch.zeros(8, 4, 32, dtype=torch.bfloat16)), ValueError, r"^dout: expected shape"),
    (dict(dq=torch.zeros(8, 4, 64, dtype=torch.float16)), TypeError, r"^dq: dtype"),
    (dict(dk=torch.zeros(8, 2, 64, dtype=torch.bfloat16)), ValueError, r"^dk: expected shape"),
    (dict(dv=torch.zeros(1, 12, 2, 64, dtype=torch.bfloat16)), ValueError, r"^dv: expected a 3-d"),
    (dict(out=None), TypeError, r"^out: "),
    (dict(deterministic=True, backend="hopper"), ValueError, r"^backend='hopper'"),
])
def test_bad_backward_argument_is_named(ext, bad, error, match):
    from flashcute.varlen import attention_varlen_backward_dlpack

    names = ("dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k",
             "max_seqlen_q", "max_seqlen_k")
    args = dict(zip(names, _bwd_args()))
    args.update(bad)
    for fn in (flashcute.attention_varlen_backward, attention_varlen_backward_dlpack):
        with pytest.raises(error, match=match):
            fn(**args)
    assert ext.of("backward") == []


def test_offsets_on_another_device_are_named(monkeypatch):
    """Device checks come last and cover the offsets and seqused_k (CPU tensors here,
    described as if on CUDA devices)."""
    real = _validate_varlen._inspect

    def on_cuda(name, x):
        info = real(name, x)
        device = 1 if name == monkeypatch_target[0] else 0
        return _Info(info.name, 2, device, info.dtype, info.shape, info.strides)

    monkeypatch.setattr(_validate_varlen, "_inspect", on_cuda)
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    used = torch.tensor([1, 2, 3], dtype=torch.int32)
    for target in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k"):
        monkeypatch_target = [target]
        with pytest.raises(ValueError, match=rf"^{target}: on CUDA device 1, but q is on CUDA device 0"):
            _validate_varlen.validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used)
    monkeypatch_target = ["none"]
    problem = _validate_varlen.validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used)
    assert (problem.batch, problem.total_q, problem.total_k, problem.seqused_k) == (3, 8, 12, True)


def test_cpu_tensors_reach_the_device_check():
    pytest.importorskip("flashcute._C")
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    try:
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    except ImportError:
        pytest.skip("no flashcute._C with variable-length batches")
    except ValueError as exc:
        assert str(exc).startswith("q: expected a CUDA tensor"), exc
    else:
        raise AssertionError("a CPU call went through")


def test_problem_sizes_and_max_seqlen_clipped_to_the_rows():
    q, k, v, cu_q, cu_k, _, _ = _packed()
    problem, _ = _validate_varlen.varlen_problem(q, k, v, cu_q, cu_k, 10**12, 3)
    assert problem.out_shape == (8, 4, 64) and problem.kv_shape == (12, 2, 64)
    assert problem.lse_shape == (4, 8)
    assert (problem.max_seqlen_q, problem.max_seqlen_k) == (8, 3)
    assert problem.scale == pytest.approx(64 ** -0.5)
    empty, _ = _validate_varlen.varlen_problem(q, k, v, cu_q, cu_k, 0, 3)
    assert empty.empty_output
    assert _validate_varlen.check_max_seqlen("m", np.int64(7)) == 7


# ---------------------------------------------------------------------------------------------
# Plumbing: what reaches the extension on each route.


def _values(capsule):
    return None if capsule is None else torch.from_dlpack(capsule).tolist()


def _shape(capsule):
    return None if capsule is None else tuple(torch.from_dlpack(capsule).shape)


class VarlenRecordingExtension(RecordingExtension):
    """RecordingExtension with the variable-length arguments of the binding."""

    def inspect(self, x):
        """The binding's DLPack description, for CPU arrays of other frameworks (numpy)."""
        a = np.from_dlpack(x)
        return 1, 0, str(a.dtype), a.shape, tuple(s // a.itemsize for s in a.strides)

    def forward(self, q, k, v, out, lse, softmax_scale, causal, backend, stream, workspace=None,
                window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None,
                cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0):
        """Records the call (cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes: the values)."""
        self.calls.append(("forward", dict(
            softmax_scale=softmax_scale, causal=causal, window=(window_left, window_right),
            softcap=softcap, alibi_slopes=_values(alibi_slopes),
            cu_seqlens_q=_values(cu_seqlens_q), cu_seqlens_k=_values(cu_seqlens_k),
            seqused_k=_values(seqused_k), max_seqlen=(max_seqlen_q, max_seqlen_k),
            q=_shape(q), out=_shape(out), lse=_shape(lse))))

    def forward_workspace_size(self, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                               dtype, causal, backend, device, window_left=-1, window_right=-1,
                               alibi=False, total_q=-1, total_k=-1, seqused_k=False):
        self.calls.append(("forward_workspace_size", dict(
            batch=batch, seqlen=(seqlen_q, seqlen_k), total=(total_q, total_k),
            seqused_k=seqused_k, causal=causal, window=(window_left, window_right), alibi=alibi)))
        return 0

    def backward(self, dout, q, k, v, out, lse, dq, dk, dv, workspace, softmax_scale, causal,
                 deterministic, backend, stream, window_left=-1, window_right=-1, softcap=0.0,
                 alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                 max_seqlen_q=0, max_seqlen_k=0):
        self.calls.append(("backward", dict(
            softmax_scale=softmax_scale, causal=causal, window=(window_left, window_right),
            softcap=softcap, alibi_slopes=_values(alibi_slopes), deterministic=deterministic, cu_seqlens_q=_values(cu_seqlens_q),
            cu_seqlens_k=_values(cu_seqlens_k), seqused_k=_values(seqused_k),
            max_seqlen=(max_seqlen_q, max_seqlen_k), dq=_shape(dq), dk=_shape(dk),
            lse=_shape(lse), workspace=_shape(workspace))))

    def backward_workspace_size(self, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                dtype, deterministic, backend, causal=False, window_left=-1,
                                window_right=-1, total_q=-1, total_k=-1, seqused_k=False):
        self.calls.append(("backward_workspace_size", dict(
            batch=batch, seqlen=(seqlen_q, seqlen_k), total=(total_q, total_k),
            seqused_k=seqused_k, causal=causal, deterministic=deterministic,
            window=(window_left, window_right))))
        return 48


def installed(monkeypatch, fake):
    """Generator for fixtures: `fake` in place of flashcute._C, CPU tensors passing the device
    checks, stream 0 as the current stream, the routes' plans cleared around the test."""
    monkeypatch.setattr(_build_info, "_extension", fake)
    _build_info._cached_build_info.cache_clear()
    no_check = lambda first, others: None  # noqa: E731
    for module in (_validate, _validate_backward, _validate_varlen, _torch_ops):
        monkeypatch.setattr(module, "_check_devices", no_check)
    monkeypatch.setattr(_torch_direct, "_stream", lambda device: 0)
    monkeypatch.setattr(_torch_varlen, "_stream", lambda device: 0)
    monkeypatch.setattr(_frameworks.TorchFramework, "stream", lambda self, like: 0)
    _torch_direct._plans.clear()
    _torch_varlen._plans.clear()
    yield fake
    _torch_direct._plans.clear()
    _torch_varlen._plans.clear()
    _build_info._cached_build_info.cache_clear()


@pytest.fixture
def ext(monkeypatch):
    """A VarlenRecordingExtension in place of flashcute._C (``installed``)."""
    yield from installed(monkeypatch, VarlenRecordingExtension())


EXPECTED_OFFSETS = dict(cu_seqlens_q=[0, 3, 3, 8], cu_seqlens_k=[0, 4, 6, 12])


def _check_forward_call(call, *, seqused=None, max_seqlen=(5, 6), window=(-1, -1), softcap=0.0,
                        causal=False, lse=True):
    assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS
    assert call["seqused_k"] == seqused
    assert call["max_seqlen"] == max_seqlen
    assert (call["window"], call["softcap"], call["causal"]) == (window, softcap, causal)
    assert call["q"] == call["out"] == (8, 4, 64)
    assert call["lse"] == ((4, 8) if lse else None)


def test_direct_route(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    used = torch.tensor([4, 1, 6], dtype=torch.int32)
    out = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                     causal=True, window=(3, 0), softcap=5.0)
    assert out.shape == (8, 4, 64) and out.dtype == torch.bfloat16
    out, lse = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                          causal=True, window=(3, 0), softcap=5.0, return_lse=True)
    assert lse.shape == (4, 8) and lse.dtype == torch.float32
    first, second = ext.of("forward")
    _check_forward_call(first, seqused=[4, 1, 6], window=(3, 0), softcap=5.0, causal=True, lse=False)
    _check_forward_call(second, seqused=[4, 1, 6], window=(3, 0), softcap=5.0, causal=True)
    (size,) = ext.of("forward_workspace_size")  # one plan for both calls
    assert size == dict(batch=3, seqlen=(5, 6), total=(8, 12), seqused_k=True, causal=True,
                        window=(3, 0), alibi=False)


def test_plans_are_kept_per_max_seqlen(ext):
    q, k, v, cu_q, cu_k, _, _ = _packed()
    for max_q in (5, 6, 5, 100):
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, 6)
    assert [c["max_seqlen"] for c in ext.of("forward")] == [(5, 6), (6, 6), (5, 6), (8, 6)]
    assert [c["seqlen"] for c in ext.of("forward_workspace_size")] == [(5, 6), (6, 6), (8, 6)]


def test_out_is_written_and_returned(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    out = torch.empty_like(q)
    result, lse = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=out,
                                             return_lse=True)
    assert result is out and lse.shape == (4, 8)
    _check_forward_call(ext.of("forward")[0])


def test_no_launch_without_query_rows(ext):
    q, k, v, cu_q, cu_k, _, max_k = _packed()
    out, lse = flashcute.attention_varlen(q, k, v, cu_q, cu_k, 0, max_k, return_lse=True)
    assert out.shape == (8, 4, 64) and lse.shape == (4, 8)
    assert ext.of("forward") == []


def test_grad_with_out_is_refused(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=True)
    with pytest.raises(NotImplementedError, match="out="):
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=torch.empty_like(q))


def test_dlpack_route(ext):
    from flashcute.varlen import attention_varlen_backward_dlpack, attention_varlen_dlpack

    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    out, lse = attention_varlen_dlpack(q, k, v, cu_q, cu_k, max_q, max_k, window=(2, 1),
                                       return_lse=True)
    assert out.shape == (8, 4, 64) and lse.shape == (4, 8)
    _check_forward_call(ext.of("forward")[0], window=(2, 1))
    dq, dk, dv = attention_varlen_backward_dlpack(*_bwd_args(), window=(2, 1),
                                                  deterministic=True)
    assert dq.shape == (8, 4, 64) and dk.shape == dv.shape == (12, 2, 64)
    (call,) = ext.of("backward")
    assert call["deterministic"] and call["window"] == (2, 1)
    assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS
    assert call["workspace"] == (48,)


def test_numpy_offsets_take_the_dlpack_route(ext):
    """Offsets of another framework send the call through DLPack (here: numpy, which cannot
    allocate, so out= is needed); the offsets reach the extension."""
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    x = np.zeros((8, 4, 64), dtype=np.float16)
    kv = np.zeros((12, 2, 64), dtype=np.float16)
    out = np.zeros_like(x)
    result = flashcute.attention_varlen(x, kv, kv, cu_q.numpy(), cu_k.numpy(), max_q, max_k,
                                        out=out)
    assert result is out
    call = ext.of("forward")[0]
    assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS


def test_backward_direct_route(ext):
    dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k = _bwd_args()
    used = torch.tensor([4, 2, 0], dtype=torch.int32)
    bufs = [torch.empty_like(x) for x in (q, k, v)]
    grads = flashcute.attention_varlen_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, seqused_k=used, causal=True,
        softcap=2.0, dq=bufs[0], dk=bufs[1], dv=bufs[2])
    assert all(g is b for g, b in zip(grads, bufs))
    (call,) = ext.of("backward")
    assert call["seqused_k"] == [4, 2, 0] and call["max_seqlen"] == (5, 6)
    assert (call["causal"], call["softcap"], call["dq"], call["dk"]) == (True, 2.0, (8, 4, 64), (12, 2, 64))
    (size,) = ext.of("backward_workspace_size")
    assert size["batch"] == 3 and size["seqlen"] == (5, 6) and size["total"] == (8, 12)
    assert size["seqused_k"] and size["causal"]


@pytest.mark.parametrize("used", [None, torch.tensor([2, 2, 5], dtype=torch.int32)])
def test_autograd_backward_gets_the_forwards_arguments(ext, used):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=True)
    out = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                     window=(4, 2), softcap=3.0, softmax_scale=0.5)
    assert out.requires_grad
    out.float().sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == v.grad.shape == k.shape
    (fwd,) = ext.of("forward")
    (bwd,) = ext.of("backward")
    for call in (fwd, bwd):
        assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS
        assert call["seqused_k"] == (None if used is None else used.tolist())
        assert (call["window"], call["softcap"], call["softmax_scale"]) == ((4, 2), 3.0, 0.5)
        assert call["max_seqlen"] == (5, 6)
    assert not bwd["deterministic"]


def test_deterministic_reaches_the_backward(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=True)
    flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                               deterministic=True).float().sum().backward()
    assert ext.of("backward")[0]["deterministic"]


def test_compiled_training_step(ext):
    """torch.compile(fullgraph=True) runs the custom ops forward and backward with the
    call's offsets, seqused_k, max_seqlen, window and softcap, also when max_seqlen and the
    window change from one call to the next."""
    q, k, v, cu_q, cu_k, _, _ = _packed(requires_grad=True)
    used = torch.tensor([3, 2, 6], dtype=torch.int32)

    def step(q, k, v, cu_q, cu_k, used, max_q, max_k, window, softcap):
        out = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                         causal=True, window=window, softcap=softcap)
        return out.float().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for max_q, max_k, window, softcap in [(5, 6, (3, 0), 2.0), (6, 7, (-1, 1), 0.0),
                                          (7, 6, (5, 2), 1.5)]:
        ext.calls.clear()
        compiled(q, k, v, cu_q, cu_k, used, max_q, max_k, window, softcap).backward()
        (fwd,) = ext.of("forward")
        (bwd,) = ext.of("backward")
        for call in (fwd, bwd):
            assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS
            assert call["seqused_k"] == [3, 2, 6]
            assert call["max_seqlen"] == (max_q, max_k)
            assert (call["window"], call["softcap"], call["causal"]) == (window, softcap, True)


SLOPES = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [1.0, 2.0, 3.0, 4.0], [0.0, 0.1, 0.2, 0.3]])


@pytest.mark.parametrize("slopes", [SLOPES[0], SLOPES], ids=["per_head", "per_sequence"])
def test_alibi_slopes_reach_the_kernels_on_every_route(ext, slopes):
    """(nheads,) and (batch, nheads) slopes (a row per sequence) reach the forward, its
    workspace query and the backward: direct, autograd, DLPack and flash_attn_varlen_func."""
    from flashcute.varlen import attention_varlen_backward_dlpack, attention_varlen_dlpack

    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    want = slopes.tolist()
    flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=slopes,
                               causal=True)
    (size,) = ext.of("forward_workspace_size")
    assert size["alibi"] is True
    flashcute.attention_varlen_backward(*_bwd_args(), alibi_slopes=slopes)
    attention_varlen_dlpack(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=slopes)
    attention_varlen_backward_dlpack(*_bwd_args(), alibi_slopes=slopes)
    flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=slopes)
    leaves = _packed(requires_grad=True)
    flashcute.attention_varlen(*leaves, alibi_slopes=slopes).float().sum().backward()
    assert leaves[0].grad is not None
    forwards, backwards = ext.of("forward"), ext.of("backward")
    assert len(forwards) == 4 and len(backwards) == 3
    for call in forwards + backwards:
        assert call["alibi_slopes"] == want
        assert {k: call[k] for k in EXPECTED_OFFSETS} == EXPECTED_OFFSETS
    # Without slopes nothing is passed.
    ext.calls.clear()
    flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    assert ext.of("forward")[0]["alibi_slopes"] is None


def test_alibi_slopes_of_another_framework_are_refused_beside_torch_tensors(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    slopes = np.ones(4, dtype=np.float32)
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor"):
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=slopes)
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor"):
        flashcute.attention_varlen_backward(*_bwd_args(), alibi_slopes=slopes)
    assert ext.of("forward") == [] and ext.of("backward") == []


def test_compiled_training_step_with_alibi(ext):
    """torch.compile(fullgraph=True): the slopes go through the custom ops' schemas to the
    forward and to the autograd formula's backward."""
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=True)

    def step(q, k, v, cu_q, cu_k, slopes):
        out = flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                         alibi_slopes=slopes)
        return out.float().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(q, k, v, cu_q, cu_k, SLOPES).backward()
    (fwd,) = ext.of("forward")
    (bwd,) = ext.of("backward")
    assert fwd["alibi_slopes"] == bwd["alibi_slopes"] == SLOPES.tolist()


def test_compiled_call_with_out(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()

    def fn(q, k, v, cu_q, cu_k):
        out = torch.empty_like(q)
        flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=out)
        return out

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    assert compiled(q, k, v, cu_q, cu_k).shape == q.shape
    _check_forward_call(ext.of("forward")[0])


@pytest.mark.parametrize("kwargs,match", [(dict(max_seqlen_q=-1), r"max_seqlen_q: "),
                                          (dict(window=(-3, 0)), r"window: ")])
def test_compiled_call_names_a_bad_argument(kwargs, match):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    args = dict(max_seqlen_q=max_q, max_seqlen_k=max_k)
    args.update(kwargs)
    compiled = torch.compile(
        lambda q, k, v, cu_q, cu_k: flashcute.attention_varlen(q, k, v, cu_q, cu_k, **args),
        fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=match):
        compiled(q, k, v, cu_q, cu_k)


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize("bad,match", [
    (dict(cu_q=_offsets(LENGTHS_Q, torch.int64)), "cu_seqlens_q: "),
    (dict(cu_k=_offsets((1, 2))), "cu_seqlens_k: "),
    (dict(used=torch.zeros(2, dtype=torch.int32)), "seqused_k: "),
    (dict(max_q=-3), "max_seqlen_q: "),
    (dict(window=(-2, 0)), "window: "),
])
def test_fakes_agree_with_the_real_ops(ext, bad, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    args = dict(cu_q=cu_q, cu_k=cu_k, used=None, max_q=max_q, max_k=max_k, window=(-1, -1))
    args.update(bad)
    lse = torch.zeros(4, 8)
    ops = torch.ops.flashcute
    calls = {
        "forward": lambda q, k, v, lse, cu_q, cu_k, used: ops.attention_varlen_forward(
            q, k, v, cu_q, cu_k, used, args["max_q"], args["max_k"], False, 0.125, None, False,
            *args["window"]),
        "forward_out": lambda q, k, v, lse, cu_q, cu_k, used: ops.attention_varlen_forward_out(
            q, k, v, torch.empty_like(q), cu_q, cu_k, used, args["max_q"], args["max_k"], False,
            0.125, None, *args["window"]),
        "backward": lambda q, k, v, lse, cu_q, cu_k, used: ops.attention_varlen_backward(
            q, q, k, v, q, lse, cu_q, cu_k, used, args["max_q"], args["max_k"], False, 0.125,
            False, None, *args["window"]),
    }
    tensors = [q, k, v, lse, args["cu_q"], args["cu_k"], args["used"]]
    for name, call in calls.items():
        real = _error(lambda: call(*tensors))
        with FakeTensorMode() as mode:
            fake = _error(lambda: call(*(None if x is None else mode.from_tensor(x) for x in tensors)))
        assert fake == real, name
        assert real[1].startswith(match), real


def test_custom_ops_default_to_no_window_and_no_softcap(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    out, lse, _ = torch.ops.flashcute.attention_varlen_forward(q, k, v, cu_q, cu_k, None, max_q,
                                                               max_k, False, 0.125, None)
    assert out.shape == q.shape and lse.shape == (4, 8)
    torch.ops.flashcute.attention_varlen_backward(torch.randn_like(q), q, k, v, out, lse, cu_q,
                                                  cu_k, None, max_q, max_k, False, 0.125, False,
                                                  None)
    for call in ext.of("forward") + ext.of("backward"):
        assert (call["window"], call["softcap"], call["seqused_k"]) == ((-1, -1), 0.0, None)


def test_custom_ops_pass_opcheck(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    used = torch.tensor([3, 1, 6], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.flashcute.attention_varlen_forward.default,
        (q, k, v, cu_q, cu_k, used, max_q, max_k, True, 0.125, None, False, 3, 0, 0.0),
        test_utils=("test_schema", "test_faketensor"),
    )


# ---------------------------------------------------------------------------------------------
# flash_attn_varlen_func


def test_flash_attn_varlen_func_passes_its_arguments(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    used = torch.tensor([4, 2, 6], dtype=torch.int32)
    out = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, 0.5, True,
                                           (3, 0), 20.0, seqused_k=used)
    assert out.shape == q.shape
    out, lse, probs = flashcute.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, window_size=(6, 9), return_attn_probs=True)
    assert lse.shape == (4, 8) and probs is None
    flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(2, 0))
    first, second, third = ext.of("forward")
    assert (first["window"], first["softcap"], first["causal"], first["softmax_scale"]) == (
        (3, 0), 20.0, True, 0.5)
    assert first["seqused_k"] == [4, 2, 6]
    assert second["window"] == (-1, -1)  # bounds of at least max_seqlen_k are none
    assert (third["window"], third["causal"]) == ((2, 0), True)


def test_flash_attn_varlen_func_differentiates(ext):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed(requires_grad=True)
    flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                     deterministic=True).float().sum().backward()
    assert ext.of("backward")[0]["deterministic"] and q.grad is not None


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(dropout_p=1.0), ValueError, r"^dropout_p: "),
    (dict(block_table=torch.zeros(3, 1, dtype=torch.int32)), NotImplementedError, r"^block_table: "),
    (dict(seqused_q=torch.ones(3, dtype=torch.int32)), NotImplementedError, r"^seqused_q: "),
    (dict(dropout_p="0"), TypeError, r"^dropout_p: "),
    (dict(causal=None), TypeError, r"^causal: "),
    (dict(return_attn_probs=1), TypeError, r"^return_attn_probs: "),
    (dict(window_size=(1.5, 0)), TypeError, r"^window_size: "),
])
def test_flash_attn_varlen_func_refuses_what_flashcute_lacks(ext, kwargs, error, match):
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    with pytest.raises(error, match=match):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    assert ext.of("forward") == []


# ---------------------------------------------------------------------------------------------
# The binding (a build with variable-length batches): shapes it refuses before any launch.


def _varlen_binding():
    ext = pytest.importorskip("flashcute._C")
    if "cu_seqlens_q" not in (ext.forward.__doc__ or ""):
        pytest.skip("this build of flashcute._C predates variable-length batches")
    return ext


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16)), r"^q: expected a 3-d packed"),
    (dict(cu_seqlens_q=torch.zeros(4, dtype=torch.int64)), r"^cu_seqlens_q: expected a contiguous 1-d int32"),
    (dict(cu_seqlens_k=torch.zeros(1, dtype=torch.int32)), r"^cu_seqlens_k: expected batch \+ 1 >= 2"),
    (dict(cu_seqlens_k=torch.zeros(3, dtype=torch.int32)), r"^cu_seqlens_q, cu_seqlens_k: expected the same"),
    (dict(seqused_k=torch.zeros(2, dtype=torch.int32)), r"^seqused_k: expected one entry per sequence"),
    (dict(lse=torch.zeros(1, 4, 8)), r"^lse: expected a float32 \(heads, total_q\)"),
])
def test_binding_refuses_bad_varlen_shapes(change, match):
    from torch.utils.dlpack import to_dlpack

    ext = _varlen_binding()
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    args = dict(q=q, k=k, v=v, out=torch.empty_like(q), lse=torch.empty(4, 8), cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k, seqused_k=None)
    args.update(change)
    caps = {n: (None if x is None else to_dlpack(x)) for n, x in args.items()}
    with pytest.raises(ValueError, match=match):
        ext.forward(caps["q"], caps["k"], caps["v"], caps["out"], caps["lse"], 0.125, False,
                    ext.BACKEND_AMPERE, 0, None, -1, -1, 0.0, None, caps["cu_seqlens_q"],
                    caps["cu_seqlens_k"], caps["seqused_k"], max_q, max_k)


@pytest.mark.parametrize("sizes,match", [
    (dict(batch=0), r"^batch: expected at least 1 sequence"),
    (dict(total_q=2**31 - 300, seqlen_q=200), r"^total_q: .*32 bits"),
    (dict(total_k=2**31), r"^total_k: "),
    (dict(seqlen_q=-1), r"^seqlen_q, seqlen_k: "),
])
def test_cpp_layer_refuses_bad_varlen_sizes(sizes, match):
    ext = _varlen_binding()
    args = dict(batch=2, seqlen_q=8, seqlen_k=8, nheads=4, nheads_kv=2, headdim=64,
                dtype="bfloat16", causal=False, backend=ext.BACKEND_AMPERE, device=0,
                window_left=-1, window_right=-1, total_q=16, total_k=16, seqused_k=False)
    args.update(sizes)
    with pytest.raises(ValueError, match=match):
        ext.forward_workspace_size(**args)


def test_cpp_workspace_sizes_for_varlen():
    """The backward's workspace is that of a fixed-length batch of max_seqlen_q rows (capped
    by total_q); the forward never splits a variable-length call."""
    ext = _varlen_binding()
    common = dict(nheads=4, nheads_kv=2, headdim=64, dtype="bfloat16", deterministic=True,
                  backend=ext.BACKEND_AMPERE, causal=False)
    fixed = ext.backward_workspace_size(batch=3, seqlen_q=300, seqlen_k=300, **common)
    packed = ext.backward_workspace_size(batch=3, seqlen_q=300, seqlen_k=300, total_q=500,
                                         total_k=500, **common)
    capped = ext.backward_workspace_size(batch=3, seqlen_q=10**6, seqlen_k=300, total_q=300,
                                         total_k=500, **common)
    assert packed == fixed == capped > 0
    assert ext.forward_workspace_size(2, 4096, 4096, 4, 2, 64, "bfloat16", False,
                                      ext.BACKEND_HOPPER, 0, -1, -1, False, 8192, 8192, False) == 0

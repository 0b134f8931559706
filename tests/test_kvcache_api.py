"""``attention_with_kvcache`` and ``merge_attention_states`` on the CPU: the argument checks
on every route (each error names its argument), what every route hands the extension
(``kvcache_plan``, ``kvcache_forward``, ``merge_states``), the custom ops under
``torch.compile(fullgraph=True)``, and the float64 references against a plain loop.

The plumbing tests swap the compiled extension for ``KVCacheRecordingExtension``, which has
the bindings' signatures, records each call and computes the call with the float64
reference, writing the results (and the appends into the cache) through the DLPack views it
gets, as the kernels would; CPU tensors pass the device check. No GPU and no build with the
KV-cache bindings is needed. The kernels' numbers are checked on a GPU
(tests/test_gpu_kvcache.py).
"""

from __future__ import annotations

import inspect
import math
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import _build_info, _frameworks, _torch_kvcache, _torch_ops  # noqa: E402
from flashcute import _validate_kvcache, reference  # noqa: E402
from flashcute._validate import _Info  # noqa: E402
from flashcute.kvcache import (  # noqa: E402
    attention_with_kvcache_dlpack,
    merge_attention_states_dlpack,
)

from test_varlen_api import VarlenRecordingExtension  # noqa: E402

BATCH, SEQLEN_Q, NHEADS, NHEADS_KV, HEADDIM = 2, 3, 4, 2, 64
NUM_PAGES, PAGE_SIZE, MAX_PAGES = 6, 4, 3
SEQLEN_NEW = 2


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _int32(values):
    return torch.tensor(values, dtype=torch.int32)


def _paged_call(**overrides):
    """Keyword arguments of a paged decode call with appends (2 sequences, 3 query rows,
    GQA 4:2, pages of 4 keys, 3 pages per sequence); ``overrides`` replace them."""
    args = dict(
        q=_randn(BATCH, SEQLEN_Q, NHEADS, HEADDIM, seed=1),
        k_cache=_randn(NUM_PAGES, PAGE_SIZE, NHEADS_KV, HEADDIM, seed=2),
        v_cache=_randn(NUM_PAGES, PAGE_SIZE, NHEADS_KV, HEADDIM, seed=3),
        cache_seqlens=_int32([5, 3]),
        page_table=_int32([[4, 0, 2], [5, 1, 3]]),
        k_new=_randn(BATCH, SEQLEN_NEW, NHEADS_KV, HEADDIM, seed=4),
        v_new=_randn(BATCH, SEQLEN_NEW, NHEADS_KV, HEADDIM, seed=5),
    )
    args.update(overrides)
    return args


def _varlen_call(**overrides):
    """A packed q of sequences of 3, 0 and 4 rows against a paged cache, without appends."""
    args = dict(
        q=_randn(7, NHEADS, HEADDIM, seed=6),
        k_cache=_randn(NUM_PAGES, PAGE_SIZE, NHEADS_KV, HEADDIM, seed=2),
        v_cache=_randn(NUM_PAGES, PAGE_SIZE, NHEADS_KV, HEADDIM, seed=3),
        cache_seqlens=_int32([5, 2, 8]),
        page_table=_int32([[4, 0], [5, 1], [3, 2]]),
        cu_seqlens_q=_int32([0, 3, 3, 7]),
        max_seqlen_q=4,
    )
    args.update(overrides)
    return args


# ---------------------------------------------------------------------------------------------
# Signatures


def test_exported():
    for name in ("attention_with_kvcache", "merge_attention_states"):
        assert name in flashcute.__all__ and callable(getattr(flashcute, name))
        assert getattr(flashcute, name).__doc__


def test_keywords_and_defaults():
    params = inspect.signature(flashcute.attention_with_kvcache).parameters
    assert [n for n, p in params.items()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD] == ["q", "k_cache", "v_cache"]
    assert params["cache_seqlens"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["cache_seqlens"].default is inspect.Parameter.empty
    defaults = dict(page_table=None, k_new=None, v_new=None, cu_seqlens_q=None,
                    max_seqlen_q=None, causal=False, softmax_scale=None, window=(-1, -1),
                    softcap=0.0, alibi_slopes=None, num_splits=0, return_lse=False, out=None,
                    backend=None)
    for name, default in defaults.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name
    merge = inspect.signature(flashcute.merge_attention_states).parameters
    assert list(merge) == ["out_a", "lse_a", "out_b", "lse_b"]


def test_custom_op_schemas_declare_the_mutated_cache():
    ops = torch.ops.flashcute
    schema = str(ops.attention_with_kvcache.default._schema)
    assert "Tensor(a1!) k_cache" in schema and "Tensor(a2!) v_cache" in schema, schema
    for arg in ("Tensor cache_seqlens", "Tensor? page_table", "Tensor? k_new", "Tensor? v_new",
                "Tensor? cu_seqlens_q", "max_seqlen_q", "num_splits=0", "window_left=-1",
                "float softcap=0.", "Tensor? alibi_slopes=None"):
        assert arg in schema, (arg, schema)
    out_schema = str(ops.attention_with_kvcache_out.default._schema)
    assert "k_cache" in out_schema and "Tensor(a3!) out" in out_schema, out_schema
    assert "!" not in str(ops.merge_attention_states.default._schema)


# ---------------------------------------------------------------------------------------------
# Bad arguments: the error names the argument, on every route, before any launch.


def _routes(args):
    """Zero-argument calls of the front door, the DLPack route and the checks alone."""
    routes = {
        "front_door": lambda: flashcute.attention_with_kvcache(**args),
        "dlpack": lambda: attention_with_kvcache_dlpack(**args),
        "validate": lambda: _validate_kvcache.validate_kvcache(**args),
    }
    if "return_lse" in args:  # not an argument of the checks
        del routes["validate"]
    return routes


BAD_ARGUMENTS = [
    (dict(q=_randn(2, 3, 4, 64, dtype=torch.float32)), TypeError, r"^q: expected float16"),
    (dict(k_cache=_randn(6, 4, 2, 64, dtype=torch.float16)), TypeError,
     r"^k_cache: dtype float16 does not match"),
    (dict(v_new=_randn(2, 2, 2, 64, dtype=torch.float16)), TypeError, r"^v_new: dtype float16"),
    (dict(out=_randn(2, 3, 4, 64, dtype=torch.float16)), TypeError, r"^out: dtype float16"),
    (dict(q=_randn(6, 4, 64)), ValueError, r"^q: expected a 4-d tensor \(batch, seqlen_q"),
    (dict(k_cache=_randn(24, 2, 64)), ValueError, r"^k_cache: expected a 4-d tensor \(num_pages"),
    (dict(k_new=_randn(2, 2, 2, 64, 1)), ValueError, r"^k_new: expected a 4-d tensor"),
    (dict(out=_randn(6, 4, 64)), ValueError, r"^out: expected a 4-d tensor"),
    (dict(k_cache=_randn(6, 4, 2, 32), v_cache=_randn(6, 4, 2, 32)), ValueError,
     r"^k_cache: head dim 32 does not match q's 64"),
    (dict(v_cache=_randn(6, 5, 2, 64)), ValueError, r"^v_cache: shape \(6, 5, 2, 64\)"),
    (dict(v_cache=_randn(6, 4, 2, 32)), ValueError, r"^v_cache: head dim 32 differs"),
    (dict(q=_randn(2, 3, 3, 64)), ValueError, r"^q, k_cache: q's 3 heads"),
    (dict(q=_randn(2, 3, 4, 60), k_cache=_randn(6, 4, 2, 60), v_cache=_randn(6, 4, 2, 60),
          k_new=None, v_new=None), ValueError, r"^q: head dim 60 is not supported"),
    (dict(q=_randn(2, 3, 4, 264), k_cache=_randn(6, 4, 2, 264), v_cache=_randn(6, 4, 2, 264),
          k_new=None, v_new=None), ValueError, r"^q: head dim 264 is not supported"),
    (dict(page_table=None, k_cache=_randn(3, 8, 2, 64), v_cache=_randn(3, 8, 2, 64)), ValueError,
     r"^k_cache: batch size 3 does not match q's batch size 2"),
    (dict(k_cache=_randn(0, 4, 2, 64), v_cache=_randn(0, 4, 2, 64)), ValueError,
     r"^k_cache: a paged cache needs at least one page"),
    (dict(k_cache=_randn(6, 0, 2, 64), v_cache=_randn(6, 0, 2, 64), k_new=None, v_new=None),
     ValueError, r"^k_cache: a paged cache needs at least one page of at least one key"),
    (dict(page_table=_int32([[4, 0, 2], [5, 1, 3]]).long()), TypeError,
     r"^page_table: expected an int32 tensor, got int64"),
    (dict(page_table=_int32([[4, 0, 2], [5, 1, 3], [0, 0, 0]])), ValueError,
     r"^page_table: expected shape \(2, max_pages\)"),
    (dict(page_table=_int32([4, 0, 2])), ValueError, r"^page_table: expected shape \(2, max_pages\)"),
    (dict(page_table=_int32([[], []])), ValueError, r"^page_table: expected shape \(2, max_pages\)"),
    (dict(page_table=_int32([[4, 9, 0, 9, 2, 9], [5, 9, 1, 9, 3, 9]])[:, ::2]), ValueError,
     r"^page_table: expected unit stride over pages"),
    (dict(page_table=[[4, 0, 2], [5, 1, 3]]), TypeError,
     r"^page_table: expected a (DLPack tensor|torch.Tensor)"),
    (dict(cache_seqlens=_int32([5, 3]).long()), TypeError, r"^cache_seqlens: expected an int32"),
    (dict(cache_seqlens=_int32([5, 3, 1])), ValueError, r"^cache_seqlens: expected shape \(2,\)"),
    (dict(cache_seqlens=_int32([[5, 3]])), ValueError, r"^cache_seqlens: expected a 1-d"),
    (dict(cache_seqlens=_int32([5, 0, 3, 0])[::2]), ValueError,
     r"^cache_seqlens: expected a contiguous"),
    (dict(cache_seqlens=None), TypeError, r"^cache_seqlens: expected an int32 tensor"),
    (dict(cache_seqlens=5), TypeError, r"^cache_seqlens: expected a DLPack tensor"),
    (dict(v_new=None), ValueError, r"^v_new: expected together with k_new"),
    (dict(k_new=None), ValueError, r"^k_new: expected together with v_new"),
    (dict(k_new=_randn(3, 2, 2, 64), v_new=_randn(3, 2, 2, 64)), ValueError,
     r"^k_new: expected shape \(2, 2, 2, 64\)"),
    (dict(k_new=_randn(2, 2, 1, 64), v_new=_randn(2, 2, 1, 64)), ValueError,
     r"^k_new: expected shape \(2, 2, 2, 64\)"),
    (dict(v_new=_randn(2, 3, 2, 64)), ValueError, r"^v_new: expected shape \(2, 2, 2, 64\)"),
    (dict(k_new=_randn(2, 13, 2, 64), v_new=_randn(2, 13, 2, 64)), ValueError,
     r"^k_new: 13 new keys per sequence do not fit the cache's 12 keys"),
    (dict(max_seqlen_q=3), ValueError, r"^max_seqlen_q: given without cu_seqlens_q"),
    (dict(num_splits=-1), ValueError, r"^num_splits: expected an int from 0"),
    (dict(num_splits=1025), ValueError, r"^num_splits: expected an int from 0 .* to 1024"),
    (dict(num_splits=2.0), TypeError, r"^num_splits: expected an int"),
    (dict(num_splits=True), TypeError, r"^num_splits: expected an int"),
    (dict(num_splits=None), TypeError, r"^num_splits: expected an int"),
    (dict(causal=1), TypeError, r"^causal: "),
    (dict(window=(-2, 0)), ValueError, r"^window: "),
    (dict(window=(1.0, 0)), TypeError, r"^window: "),
    (dict(softcap=-1.0), ValueError, r"^softcap: "),
    (dict(softcap=1e-50), ValueError, r"^softcap: .*softmax_scale"),
    (dict(softmax_scale=0.0), ValueError, r"^softmax_scale: "),
    (dict(backend="volta"), ValueError, r"^backend: "),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.float64)), TypeError,
     r"^alibi_slopes: expected float32"),
    (dict(alibi_slopes=torch.ones(5)), ValueError,
     r"^alibi_slopes: expected shape \(nheads,\) = \(4,\) or \(batch, nheads\) = \(2, 4\)"),
    (dict(alibi_slopes=torch.ones(2, 8)[:, ::2]), ValueError, r"^alibi_slopes: expected unit stride"),
    (dict(out=_randn(2, 3, 4, 32)), ValueError, r"^out: expected shape \(2, 3, 4, 64\)"),
    (dict(q=_randn(2, 3, 4, 128)[..., ::2]), ValueError, r"^q: expected unit stride"),
    (dict(k_cache=_randn(6, 4, 2, 128)[..., ::2]), ValueError, r"^k_cache: expected unit stride"),
    (dict(return_lse=1), TypeError, r"^return_lse: "),
]

VARLEN_BAD_ARGUMENTS = [
    (dict(max_seqlen_q=None), TypeError, r"^max_seqlen_q: expected an int with cu_seqlens_q"),
    (dict(max_seqlen_q=-1), ValueError, r"^max_seqlen_q: "),
    (dict(max_seqlen_q=4.0), TypeError, r"^max_seqlen_q: expected an int"),
    (dict(cu_seqlens_q=_int32([0, 3, 3, 7]).long()), TypeError, r"^cu_seqlens_q: .*int32"),
    (dict(cu_seqlens_q=_int32([0])), ValueError, r"^cu_seqlens_q: expected batch \+ 1 >= 2"),
    (dict(cu_seqlens_q=_int32([0, 3, 7])), ValueError, r"^page_table: expected shape \(2, max_pages\)"),
    (dict(cu_seqlens_q=_int32([0, 3, 7]), page_table=_int32([[4, 0], [5, 1]])), ValueError,
     r"^cache_seqlens: expected shape \(2,\)"),
    (dict(q=_randn(1, 7, 4, 64)), ValueError, r"^q: expected a 3-d tensor \(total_q"),
    (dict(k_new=_randn(3, 1, 2, 64), v_new=_randn(3, 1, 2, 64)), ValueError,
     r"^k_new: appends take a batched q"),
    (dict(page_table=None), ValueError, r"^k_cache: batch size 6 does not match cu_seqlens_q's"),
    (dict(out=_randn(7, 4, 32)), ValueError, r"^out: expected shape \(7, 4, 64\)"),
    (dict(alibi_slopes=torch.ones(2, 4)), ValueError, r"^alibi_slopes: expected shape"),
]


def _expect_everywhere(args, error, match, ext):
    for name, call in _routes(args).items():
        try:
            with pytest.raises(error, match=match):
                call()
        except BaseException as exc:
            raise AssertionError(f"route {name}: {exc}") from exc
    assert ext.of("kvcache_forward") == []


@pytest.mark.parametrize("bad,error,match", BAD_ARGUMENTS)
def test_bad_argument_is_named_on_every_route(ext, bad, error, match):
    _expect_everywhere(_paged_call(**bad), error, match, ext)


@pytest.mark.parametrize("bad,error,match", VARLEN_BAD_ARGUMENTS)
def test_bad_varlen_argument_is_named_on_every_route(ext, bad, error, match):
    _expect_everywhere(_varlen_call(**bad), error, match, ext)


def test_jax_caches_take_no_appends(ext, monkeypatch):
    """A cache of an immutable framework (jax) cannot take appends; read-only calls pass."""
    from flashcute import kvcache

    class Immutable:
        name = "jax"

    real = kvcache.framework_of
    monkeypatch.setattr(kvcache, "framework_of",
                        lambda x: Immutable() if x is args["k_cache"] else real(x))
    args = _paged_call()
    with pytest.raises(ValueError, match=r"^k_cache: jax arrays are immutable"):
        attention_with_kvcache_dlpack(**args)
    assert ext.of("kvcache_forward") == []


def test_devices_are_checked_last_and_name_the_tensor(monkeypatch):
    """Every tensor, the int32 ones and the slopes included, must be on q's device (CPU
    tensors described as if on CUDA devices here)."""
    real = _validate_kvcache._inspect
    target = ["none"]

    def on_cuda(name, x):
        info = real(name, x)
        return _Info(info.name, 2, 1 if name == target[0] else 0, info.dtype, info.shape,
                     info.strides)

    monkeypatch.setattr(_validate_kvcache, "_inspect", on_cuda)
    args = _paged_call(out=_randn(2, 3, 4, 64), alibi_slopes=torch.ones(4))
    for name in ("k_cache", "v_cache", "cache_seqlens", "page_table", "k_new", "v_new", "out",
                 "alibi_slopes"):
        target[0] = name
        with pytest.raises(ValueError, match=rf"^{name}: on CUDA device 1, but q is on CUDA device 0"):
            _validate_kvcache.validate_kvcache(**args)
    target[0] = "cu_seqlens_q"
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: on CUDA device 1"):
        _validate_kvcache.validate_kvcache(**_varlen_call())
    target[0] = "none"
    problem = _validate_kvcache.validate_kvcache(**args)
    assert (problem.batch, problem.seqlen_q, problem.capacity, problem.seqlen_new) == (2, 3, 12, 2)
    assert problem.pages == (NUM_PAGES, PAGE_SIZE, MAX_PAGES)


def test_cpu_tensors_reach_the_device_check():
    """Without a stand-in: checks run before the extension is asked for anything, so a CPU
    call fails on the device check whatever build is installed."""
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
        flashcute.attention_with_kvcache(**_paged_call())
    with pytest.raises(ValueError, match=r"^out_a: expected a CUDA tensor"):
        out, lse = _randn(2, 3, 4, 8, dtype=torch.float32), torch.zeros(2, 4, 3)
        flashcute.merge_attention_states(out, lse, out, lse)


def test_problem_sizes():
    problem = _validate_kvcache.kvcache_problem(**_varlen_call(max_seqlen_q=10**12))[0]
    assert problem.varlen and problem.total_q == 7 and problem.seqlen_q == 7  # clipped
    assert problem.out_shape == (7, 4, 64) and problem.lse_shape == (4, 7)
    assert problem.capacity == 8 and not problem.appends and problem.launches
    contiguous = _validate_kvcache.kvcache_problem(
        **_paged_call(page_table=None, k_cache=_randn(2, 9, 2, 64), v_cache=_randn(2, 9, 2, 64)))[0]
    assert not contiguous.paged and contiguous.capacity == 9 and contiguous.appends
    assert contiguous.out_shape == (2, 3, 4, 64) and contiguous.lse_shape == (2, 4, 3)
    assert contiguous.scale == pytest.approx(64 ** -0.5)
    assert _validate_kvcache.check_num_splits(np.int64(3)) == 3


# ---------------------------------------------------------------------------------------------
# The stand-in extension.


def _tensor(x):
    """What the extension received (a DLPack capsule or object) as a torch tensor over the
    same memory, or None."""
    return None if x is None else torch.from_dlpack(x)


class KVCacheRecordingExtension(VarlenRecordingExtension):
    """``VarlenRecordingExtension`` with the KV-cache and merge bindings. ``kvcache_plan``
    answers ``splits`` splits (or the number asked for) with ``workspace`` bytes when split;
    ``kvcache_forward`` and ``merge_states`` compute the float64 reference and write it into
    the tensors they get (the appends into the cache too), as the kernels would."""

    def __init__(self, splits=4, workspace=4096):
        super().__init__()
        self.splits, self.workspace = splits, workspace

    def kvcache_plan(self, batch, seqlen_q, nheads, nheads_kv, headdim, headdim_v, max_seqlen_k,
                     num_splits, total_q, dtype, causal, window_left, window_right, alibi, device,
                     backend, page_size=0, copy_pages=True):
        self.calls.append(("kvcache_plan", dict(
            batch=batch, seqlen_q=seqlen_q, heads=(nheads, nheads_kv), headdims=(headdim, headdim_v),
            max_seqlen_k=max_seqlen_k, num_splits=num_splits, total_q=total_q, dtype=dtype,
            causal=causal, window=(window_left, window_right), alibi=alibi, device=device,
            backend=backend, page_size=page_size, copy_pages=copy_pages)))
        splits = num_splits or self.splits
        return splits, self.workspace if splits > 1 else 0

    def kvcache_forward(self, q, k_cache, v_cache, out, lse, cache_seqlens, page_table, k_new,
                        v_new, cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_left,
                        window_right, softcap, alibi_slopes, num_splits, workspace, backend,
                        stream, copy_pages=True):
        t = {name: _tensor(x) for name, x in dict(
            q=q, k_cache=k_cache, v_cache=v_cache, out=out, lse=lse, cache_seqlens=cache_seqlens,
            page_table=page_table, k_new=k_new, v_new=v_new, cu_seqlens_q=cu_seqlens_q,
            alibi_slopes=alibi_slopes, workspace=workspace).items()}
        self.calls.append(("kvcache_forward", dict(
            shapes={name: None if x is None else tuple(x.shape) for name, x in t.items()},
            cache_seqlens=t["cache_seqlens"].tolist(),
            page_table=None if t["page_table"] is None else t["page_table"].tolist(),
            cu_seqlens_q=None if t["cu_seqlens_q"] is None else t["cu_seqlens_q"].tolist(),
            max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=causal,
            window=(window_left, window_right), softcap=softcap, num_splits=num_splits,
            backend=backend, stream=stream, copy_pages=copy_pages)))
        result = reference.attention_with_kvcache(
            t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"],
            page_table=t["page_table"], k_new=t["k_new"], v_new=t["v_new"],
            cu_seqlens_q=t["cu_seqlens_q"], causal=causal, softmax_scale=softmax_scale,
            window=(window_left, window_right), softcap=softcap, alibi_slopes=t["alibi_slopes"])
        t["out"].copy_(result.out)
        if t["lse"] is not None:
            t["lse"].copy_(result.lse)
        t["k_cache"].copy_(result.k_cache)
        t["v_cache"].copy_(result.v_cache)

    def merge_states(self, out_a, lse_a, out_b, lse_b, out, lse, stream):
        t = [_tensor(x) for x in (out_a, lse_a, out_b, lse_b, out, lse)]
        self.calls.append(("merge_states", dict(shapes=[tuple(x.shape) for x in t],
                                                out_strides=t[4].stride(), stream=stream)))
        merged, merged_lse = reference.merge_attention_states(*t[:4])
        t[4].copy_(merged)
        t[5].copy_(merged_lse)


@pytest.fixture
def ext(monkeypatch):
    """A KVCacheRecordingExtension in place of flashcute._C, CPU tensors passing the device
    checks, stream 0 as the current stream, plans cleared around the test."""
    fake = KVCacheRecordingExtension()
    monkeypatch.setattr(_build_info, "_extension", fake)
    _build_info._cached_build_info.cache_clear()
    no_check = lambda first, others: None  # noqa: E731
    for module in (_validate_kvcache, _torch_ops):
        monkeypatch.setattr(module, "_check_devices", no_check)
    monkeypatch.setattr(_torch_kvcache, "_stream", lambda device: 0)
    monkeypatch.setattr(_frameworks.TorchFramework, "stream", lambda self, like: 0)
    _torch_kvcache._plans.clear()
    yield fake
    _torch_kvcache._plans.clear()
    _build_info._cached_build_info.cache_clear()


def _reference_of(args, **kwargs):
    keep = ("cache_seqlens", "page_table", "k_new", "v_new", "cu_seqlens_q", "max_seqlen_q",
            "causal", "softmax_scale", "window", "softcap", "alibi_slopes")
    return reference.attention_with_kvcache(
        args["q"], args["k_cache"], args["v_cache"],
        **{k: v for k, v in {**args, **kwargs}.items() if k in keep})


def _clone(args):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _check_result(args, out, lse, want, *, caches=True):
    torch.testing.assert_close(out.double(), want.out.to(out.dtype).double(), rtol=0, atol=0)
    if lse is not None:
        torch.testing.assert_close(lse.double(), want.lse.float().double(), rtol=0, atol=0)
    if caches:
        assert torch.equal(args["k_cache"], want.k_cache)
        assert torch.equal(args["v_cache"], want.v_cache)


# ---------------------------------------------------------------------------------------------
# Plumbing


@pytest.mark.parametrize("route", ["front_door", "dlpack"])
def test_paged_decode_with_appends(ext, route):
    args = _paged_call(causal=True, window=(6, 0), softcap=3.0, softmax_scale=0.25)
    want = _reference_of(_clone(args))
    fn = flashcute.attention_with_kvcache if route == "front_door" else attention_with_kvcache_dlpack
    out, lse = fn(**args, return_lse=True)
    assert out.shape == (2, 3, 4, 64) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 3) and lse.dtype == torch.float32
    _check_result(args, out, lse, want)
    (plan,) = ext.of("kvcache_plan")
    assert plan == dict(batch=2, seqlen_q=3, heads=(4, 2), headdims=(64, 64), max_seqlen_k=12,
                        num_splits=0, total_q=-1, dtype="bfloat16", causal=True, window=(6, 0),
                        alibi=False, device=0, backend=ext.BACKEND_AUTO, page_size=4,
                        copy_pages=True)
    (call,) = ext.of("kvcache_forward")
    assert call["num_splits"] == 4 and call["shapes"]["workspace"] == (4096,)
    assert call["cache_seqlens"] == [5, 3] and call["page_table"] == [[4, 0, 2], [5, 1, 3]]
    assert call["cu_seqlens_q"] is None and call["max_seqlen_q"] == 3
    assert (call["softmax_scale"], call["causal"], call["window"], call["softcap"]) == (
        0.25, True, (6, 0), 3.0)
    assert call["shapes"]["k_new"] == (2, 2, 2, 64) and call["stream"] == 0


def test_contiguous_cache_without_appends(ext):
    args = _paged_call(page_table=None, k_cache=_randn(2, 9, 2, 64), v_cache=_randn(2, 9, 2, 64),
                       k_new=None, v_new=None, cache_seqlens=_int32([9, 0]))
    before = _clone(args)
    out = flashcute.attention_with_kvcache(**args, num_splits=1)
    want = _reference_of(before)
    _check_result(args, out, None, want)
    assert torch.equal(args["k_cache"], before["k_cache"])
    assert (out[1] == 0).all()  # no keys: zeros
    (plan,) = ext.of("kvcache_plan")
    assert plan["max_seqlen_k"] == 9 and plan["num_splits"] == 1
    (call,) = ext.of("kvcache_forward")
    assert call["page_table"] is None and call["shapes"]["lse"] is None
    assert call["num_splits"] == 1 and call["shapes"]["workspace"] is None


def test_varlen_queries_against_a_paged_cache(ext):
    args = _varlen_call(causal=True)
    out, lse = flashcute.attention_with_kvcache(**args, return_lse=True)
    _check_result(args, out, lse, _reference_of(args))
    assert out.shape == (7, 4, 64) and lse.shape == (4, 7)
    (plan,) = ext.of("kvcache_plan")
    assert (plan["batch"], plan["seqlen_q"], plan["total_q"], plan["max_seqlen_k"]) == (3, 4, 7, 8)
    (call,) = ext.of("kvcache_forward")
    assert call["cu_seqlens_q"] == [0, 3, 3, 7] and call["max_seqlen_q"] == 4


def test_plans_are_kept_per_signature(ext):
    args = _paged_call(k_new=None, v_new=None)
    for splits in (0, 0, 3, 0, 3):
        flashcute.attention_with_kvcache(**args, num_splits=splits)
    assert [p["num_splits"] for p in ext.of("kvcache_plan")] == [0, 3]
    assert [c["num_splits"] for c in ext.of("kvcache_forward")] == [4, 4, 3, 4, 3]
    flashcute.attention_with_kvcache(**args, causal=True)
    assert len(ext.of("kvcache_plan")) == 3


def test_out_is_written_and_returned(ext):
    args = _paged_call()
    want = _reference_of(_clone(args))
    out = torch.full((2, 3, 4, 64), math.nan, dtype=torch.bfloat16)
    result, lse = flashcute.attention_with_kvcache(**args, out=out, return_lse=True)
    assert result is out
    _check_result(args, out, lse, want)


@pytest.mark.parametrize("backend", [None, "ampere", "hopper"])
def test_backend_names_reach_the_library(ext, backend):
    flashcute.attention_with_kvcache(**_paged_call(), backend=backend)
    codes = {None: ext.BACKEND_AUTO, "ampere": ext.BACKEND_AMPERE, "hopper": ext.BACKEND_HOPPER}
    assert ext.of("kvcache_plan")[0]["backend"] == codes[backend]
    assert ext.of("kvcache_forward")[0]["backend"] == codes[backend]


def test_alibi_slopes_reach_the_kernels(ext):
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [1.0, 0.5, 0.25, 0.0]])
    args = _paged_call(alibi_slopes=slopes)
    want = _reference_of(_clone(args))
    out = flashcute.attention_with_kvcache(**args)
    _check_result(args, out, None, want)
    assert ext.of("kvcache_plan")[0]["alibi"] is True
    assert ext.of("kvcache_forward")[0]["shapes"]["alibi_slopes"] == (2, 4)
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor"):
        flashcute.attention_with_kvcache(**_paged_call(alibi_slopes=slopes.numpy()))


def test_no_launch_without_rows_or_appends(ext):
    args = _paged_call(q=_randn(2, 0, 4, 64), k_new=None, v_new=None)
    out, lse = flashcute.attention_with_kvcache(**args, return_lse=True)
    assert out.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0)
    empty = _paged_call(q=_randn(0, 3, 4, 64), page_table=_int32([[0]] * 0).reshape(0, 3),
                        cache_seqlens=_int32([]), k_new=_randn(0, 2, 2, 64),
                        v_new=_randn(0, 2, 2, 64))
    assert flashcute.attention_with_kvcache(**empty).shape == (0, 3, 4, 64)
    assert ext.of("kvcache_forward") == [] and ext.of("kvcache_plan") == []


def test_appends_without_query_rows_still_launch(ext):
    args = _paged_call(q=_randn(2, 0, 4, 64))
    want = _reference_of(_clone(args))
    flashcute.attention_with_kvcache(**args)
    assert len(ext.of("kvcache_forward")) == 1
    assert torch.equal(args["k_cache"], want.k_cache) and torch.equal(args["v_cache"], want.v_cache)


def test_inputs_that_require_grad_give_results_without_grad(ext):
    args = _paged_call(q=_randn(2, 3, 4, 64).requires_grad_())
    out, lse = flashcute.attention_with_kvcache(**args, return_lse=True)
    assert not out.requires_grad and not lse.requires_grad
    state = _randn(2, 3, 4, 8, dtype=torch.float32).requires_grad_()
    merged, _ = flashcute.merge_attention_states(state, torch.zeros(2, 4, 3), state,
                                                 torch.zeros(2, 4, 3))
    assert not merged.requires_grad


def test_numpy_arrays_take_the_dlpack_route(ext):
    """Arrays of a framework that cannot allocate (numpy) need out=; the appends and the
    output are written into them."""
    args = _paged_call()
    want = _reference_of(_clone(args))
    arrays = {k: v.float().numpy().astype(np.float16) if v.is_floating_point() else v.numpy()
              for k, v in args.items()}
    out = np.zeros((2, 3, 4, 64), dtype=np.float16)
    result = flashcute.attention_with_kvcache(**arrays, out=out, num_splits=2)
    assert result is out
    (call,) = ext.of("kvcache_forward")
    assert call["num_splits"] == 1 and call["shapes"]["workspace"] is None  # no allocator
    assert not call["copy_pages"]  # nor a copy of the pages
    assert [(p["num_splits"], p["copy_pages"]) for p in ext.of("kvcache_plan")] == [(2, True), (1, False)]
    appended = torch.from_numpy(arrays["k_cache"])
    # keys 5, 6 of sequence 0 (pages 4, 0); keys 3, 4 of sequence 1 (pages 5, 1: across a boundary)
    positions = [(0, 1), (0, 2), (5, 3), (1, 0)]
    for (page, row), new in zip(positions, [(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert torch.equal(appended[page, row], torch.from_numpy(arrays["k_new"])[new])
    assert np.isfinite(out).all()
    torch.testing.assert_close(torch.from_numpy(out).double(), want.out, atol=2e-2, rtol=2e-2)


def test_compiled_decode_step_mutates_the_cache(ext):
    """torch.compile(fullgraph=True): the custom op runs with the call's arguments, and the
    appends land in the caller's cache (the op declares the cache mutated)."""
    def step(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new, scale):
        out, lse = flashcute.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table,
            k_new=k_new, v_new=v_new, causal=True, softmax_scale=scale, return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for scale in (0.25, 0.5):
        args = _paged_call()
        want = _reference_of(_clone(args), causal=True, softmax_scale=scale)
        out, lse = compiled(args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"],
                            args["page_table"], args["k_new"], args["v_new"], scale)
        torch.testing.assert_close(out, want.out.to(torch.bfloat16).float() * 2, rtol=0, atol=0)
        torch.testing.assert_close(lse.double(), want.lse.float().double(), rtol=0, atol=0)
        assert torch.equal(args["k_cache"], want.k_cache)
        assert torch.equal(args["v_cache"], want.v_cache)
        assert ext.of("kvcache_forward")[-1]["softmax_scale"] == scale


def test_compiled_call_with_out_and_varlen(ext):
    def fn(q, k_cache, v_cache, cache_seqlens, page_table, cu):
        out = torch.empty_like(q)
        flashcute.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                         page_table=page_table, cu_seqlens_q=cu, max_seqlen_q=4,
                                         out=out, num_splits=3)
        return out

    args = _varlen_call()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"],
                   args["page_table"], args["cu_seqlens_q"])
    _check_result(args, out, None, _reference_of(args))
    assert ext.of("kvcache_forward")[0]["num_splits"] == 3


@pytest.mark.parametrize("kwargs,match", [(dict(num_splits=-1), r"num_splits: "),
                                          (dict(window=(-3, 0)), r"window: "),
                                          (dict(cache_seqlens=_int32([1, 2, 3])), r"cache_seqlens: ")])
def test_compiled_call_names_a_bad_argument(kwargs, match):
    args = _paged_call(**kwargs)
    compiled = torch.compile(lambda a: flashcute.attention_with_kvcache(**a), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match=match):
        compiled(args)


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize("bad,match", [
    (dict(page_table=_int32([[1, 2, 3]])), "page_table: "),
    (dict(cache_seqlens=_int32([1, 2]).long()), "cache_seqlens: "),
    (dict(k_new=_randn(2, 2, 1, 64)), "k_new: "),
    (dict(q=_randn(2, 3, 3, 64)), "q, k_cache: "),
    (dict(v_cache=_randn(6, 4, 2, 32)), "v_cache: "),
])
def test_fakes_agree_with_the_real_ops(ext, bad, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _paged_call(**bad)
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "page_table", "k_new", "v_new")
    tensors = [args[n] for n in names]
    ops = torch.ops.flashcute
    calls = {
        "op": lambda q, k, v, s, t, kn, vn: ops.attention_with_kvcache(
            q, k, v, s, t, kn, vn, None, None, False, 0.125),
        "out_op": lambda q, k, v, s, t, kn, vn: ops.attention_with_kvcache_out(
            q, k, v, torch.empty_like(q), s, t, kn, vn, None, None, False, 0.125),
    }
    for name, call in calls.items():
        real = _error(lambda: call(*tensors))
        with FakeTensorMode() as mode:
            fake = _error(lambda: call(*(mode.from_tensor(x) for x in tensors)))
        assert fake == real, name
        assert real[1].startswith(match), real


def test_custom_ops_pass_opcheck(ext):
    args = _paged_call()
    ops = torch.ops.flashcute
    torch.library.opcheck(
        ops.attention_with_kvcache.default,
        (args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"], args["page_table"],
         args["k_new"], args["v_new"], None, None, True, 0.125, 5, 0, 2.0, None, 2, None),
        test_utils=("test_schema", "test_faketensor"),
    )
    varlen = _varlen_call()
    torch.library.opcheck(
        ops.attention_with_kvcache_out.default,
        (varlen["q"], varlen["k_cache"], varlen["v_cache"], torch.empty_like(varlen["q"]),
         varlen["cache_seqlens"], varlen["page_table"], None, None, varlen["cu_seqlens_q"], 4,
         False, 0.125),
        test_utils=("test_schema", "test_faketensor"),
    )
    out, lse = _randn(2, 3, 4, 8, dtype=torch.float32), torch.randn(2, 4, 3)
    torch.library.opcheck(ops.merge_attention_states.default, (out, lse, out * 2, lse - 1),
                          test_utils=("test_schema", "test_faketensor"))


# ---------------------------------------------------------------------------------------------
# merge_attention_states


def _states(shape=(2, 3, 4, 8), dtype=torch.float32):
    packed = len(shape) == 3
    lse_shape = (shape[1], shape[0]) if packed else (shape[0], shape[2], shape[1])
    return (_randn(*shape, dtype=dtype, seed=7), _randn(*lse_shape, dtype=torch.float32, seed=8),
            _randn(*shape, dtype=dtype, seed=9), _randn(*lse_shape, dtype=torch.float32, seed=10))


MERGE_BAD = [
    (dict(out_b=_randn(2, 3, 4, 16, dtype=torch.float32)), ValueError, r"^out_b: shape"),
    (dict(out_b=_randn(2, 3, 4, 8, dtype=torch.float16)), TypeError, r"^out_b: dtype float16"),
    (dict(out_a=torch.zeros(2, 3, 4, 8, dtype=torch.int32),
          out_b=torch.zeros(2, 3, 4, 8, dtype=torch.int32)), TypeError,
     r"^out_a: expected float16, bfloat16 or float32"),
    (dict(out_a=_randn(3, 8, dtype=torch.float32)), ValueError, r"^out_a: expected a 4-d"),
    (dict(lse_a=torch.zeros(2, 4, 3, dtype=torch.float16)), TypeError, r"^lse_a: expected float32"),
    (dict(lse_b=torch.zeros(2, 3, 4)), ValueError, r"^lse_b: expected shape \(2, 4, 3\)"),
    (dict(out_a=_randn(2, 3, 4, 16, dtype=torch.float32)[..., ::2]), ValueError,
     r"^out_a: expected unit stride"),
    (dict(lse_a=[0.0]), TypeError, r"^lse_a: expected a (DLPack tensor|torch.Tensor)"),
    (dict(out_a=_randn(2, 3, 4, 264, dtype=torch.float32), out_b=_randn(2, 3, 4, 264, dtype=torch.float32)),
     ValueError, r"^out_a: head dim 264 is larger than 256"),
]


@pytest.mark.parametrize("bad,error,match", MERGE_BAD)
def test_bad_merge_argument_is_named(ext, bad, error, match):
    args = dict(zip(("out_a", "lse_a", "out_b", "lse_b"), _states()))
    args.update(bad)
    for fn in (flashcute.merge_attention_states, merge_attention_states_dlpack,
               _validate_kvcache.validate_merge):
        with pytest.raises(error, match=match):
            fn(**args)
    assert ext.of("merge_states") == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("route", ["front_door", "dlpack"])
def test_merge_plumbing(ext, dtype, route):
    out_a, lse_a, out_b, lse_b = _states(dtype=dtype)
    lse_b[0, 1, 2] = lse_a[0, 1, 2] = -math.inf  # a row empty in both
    fn = flashcute.merge_attention_states if route == "front_door" else merge_attention_states_dlpack
    out, lse = fn(out_a, lse_a, out_b, lse_b)
    want, want_lse = reference.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert out.dtype == dtype and out.shape == out_a.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out, want.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(lse.double(), want_lse.float().double(), rtol=0, atol=0)
    assert (out[0, 2, 1] == 0).all() and lse[0, 1, 2] == -math.inf


def test_merge_takes_out_as_layout_and_packed_states(ext):
    out_a, lse_a, out_b, lse_b = _states()
    transposed = out_a.transpose(1, 2).contiguous().transpose(1, 2)  # SDPA's layout as a view
    out, _ = flashcute.merge_attention_states(transposed, lse_a, out_b, lse_b)
    assert out.stride() == transposed.stride()
    assert ext.of("merge_states")[0]["out_strides"] == transposed.stride()
    ext.calls.clear()
    packed = _states((5, 4, 8))
    for fn in (flashcute.merge_attention_states, merge_attention_states_dlpack):
        out, lse = fn(*packed)
        assert out.shape == (5, 4, 8) and lse.shape == (4, 5)
        want, want_lse = reference.merge_attention_states(*packed)
        torch.testing.assert_close(out.double(), want.float().double(), rtol=0, atol=0)
        torch.testing.assert_close(lse.double(), want_lse.float().double(), rtol=0, atol=0)
    for call in ext.of("merge_states"):
        assert call["shapes"] == [(1, 5, 4, 8), (1, 4, 5)] * 3


def test_merge_of_empty_states_launches_nothing(ext):
    out, lse = flashcute.merge_attention_states(*_states((0, 3, 4, 8)))
    assert out.shape == (0, 3, 4, 8) and lse.shape == (0, 4, 3)
    assert ext.of("merge_states") == []


def test_compiled_merge(ext):
    states = _states()
    compiled = torch.compile(lambda *s: flashcute.merge_attention_states(*s), fullgraph=True,
                             backend="aot_eager")
    out, lse = compiled(*states)
    want, want_lse = reference.merge_attention_states(*states)
    torch.testing.assert_close(out.double(), want.float().double(), rtol=0, atol=0)
    assert len(ext.of("merge_states")) == 1


# ---------------------------------------------------------------------------------------------
# The float64 references against a plain loop


def _naive_kvcache(q, k_cache, v_cache, cache_seqlens, page_table=None, k_new=None, v_new=None,
                   cu_seqlens_q=None, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                   slopes=None):
    """Every key of every query one at a time, in Python floats: (out, lse, k_cache, v_cache)
    as nested lists."""
    kc, vc = k_cache.double().tolist(), v_cache.double().tolist()
    lengths = cache_seqlens.tolist()
    table = None if page_table is None else page_table.tolist()
    page_size = k_cache.shape[1]
    nheads, headdim = q.shape[-2], q.shape[-1]
    group = nheads // k_cache.shape[2]
    scale = 1 / math.sqrt(headdim) if scale is None else scale

    def slot(b, j):
        return (table[b][j // page_size], j % page_size) if table is not None else (b, j)

    seqlen_new = 0
    if k_new is not None:
        seqlen_new = k_new.shape[1]
        kn, vn = k_new.double().tolist(), v_new.double().tolist()
        for b, n in enumerate(lengths):
            for t in range(seqlen_new):
                page, row = slot(b, n + t)
                kc[page][row], vc[page][row] = kn[b][t], vn[b][t]
    if cu_seqlens_q is None:
        queries = [q[b].double().tolist() for b in range(q.shape[0])]
    else:
        starts = cu_seqlens_q.tolist()
        queries = [q[s:e].double().tolist() for s, e in zip(starts, starts[1:])]
    left, right = window
    if causal:
        right = 0
    outs, lses = [], []
    for b, rows in enumerate(queries):
        length = lengths[b] + seqlen_new
        out_b, lse_b = [], []
        for i, row in enumerate(rows):
            diag = i + length - len(rows)
            out_i, lse_i = [], []
            for h in range(nheads):
                scores, values = [], []
                for j in range(length):
                    if (left >= 0 and j < diag - left) or (right >= 0 and j > diag + right):
                        continue
                    page, r = slot(b, j)
                    s = scale * sum(a * c for a, c in zip(row[h], kc[page][r][h // group]))
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= slopes[b][h] * abs(diag - j)
                    scores.append(s)
                    values.append(vc[page][r][h // group])
                if not scores:
                    out_i.append([0.0] * len(vc[0][0][0]))
                    lse_i.append(-math.inf)
                    continue
                m = max(scores)
                weights = [math.exp(s - m) for s in scores]
                total = sum(weights)
                out_i.append([sum(w * v[d] for w, v in zip(weights, values)) / total
                              for d in range(len(values[0]))])
                lse_i.append(m + math.log(total))
            out_b.append(out_i)
            lse_b.append(lse_i)
        outs.append(out_b)
        lses.append(lse_b)
    return outs, lses, kc, vc


def _shuffled_pages(gen, batch, max_pages, num_pages):
    """A page table of distinct pages in random order (unused entries point anywhere)."""
    pages = list(range(num_pages))
    gen.shuffle(pages)
    return _int32([pages[b * max_pages:(b + 1) * max_pages] for b in range(batch)])


REFERENCE_CASES = [
    # (name, page_size, batch, seqlen_q, nheads, nheads_kv, lengths, seqlen_new, keywords)
    ("page1_appends_causal", 1, 2, 3, 4, 2, [0, 9], 2, dict(causal=True)),
    ("page16_crossing_boundary_mqa", 16, 3, 2, 8, 1, [14, 15, 29], 3, dict(causal=True)),
    ("page16_full_and_empty", 16, 2, 1, 4, 4, [0, 29], 3, {}),
    ("page4_window_softcap", 4, 2, 4, 4, 2, [6, 11], 2, dict(window=(3, 1), softcap=2.0)),
    ("page4_causal_window_alibi", 4, 2, 3, 4, 2, [7, 2], 1,
     dict(causal=True, window=(4, 0), alibi=True)),
    ("contiguous_appends", None, 2, 2, 4, 2, [5, 0], 3, dict(causal=True, softmax_scale=0.3)),
    ("contiguous_no_appends", None, 2, 5, 6, 3, [8, 3], 0, dict(causal=True, window=(2, -1))),
]


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_reference_against_a_plain_loop(case):
    name, page_size, batch, seqlen_q, nheads, nheads_kv, lengths, seqlen_new, kw = case
    gen = random.Random(name)
    headdim = 8
    capacity = 32
    if page_size is None:
        shape, table = (batch, capacity), None
    else:
        max_pages = capacity // page_size
        num_pages = batch * max_pages + 2  # two pages no sequence uses
        shape = (num_pages, page_size)
        table = _shuffled_pages(gen, batch, max_pages, num_pages)
    seed = iter(range(100, 200))
    k_cache = _randn(*shape, nheads_kv, headdim, dtype=torch.float32, seed=next(seed))
    v_cache = _randn(*shape, nheads_kv, headdim, dtype=torch.float32, seed=next(seed))
    q = _randn(batch, seqlen_q, nheads, headdim, dtype=torch.float32, seed=next(seed))
    k_new = v_new = None
    if seqlen_new:
        k_new = _randn(batch, seqlen_new, nheads_kv, headdim, dtype=torch.float32, seed=next(seed))
        v_new = _randn(batch, seqlen_new, nheads_kv, headdim, dtype=torch.float32, seed=next(seed))
    kw = dict(kw)
    slopes = torch.rand(batch, nheads, generator=torch.Generator().manual_seed(1)) \
        if kw.pop("alibi", False) else None
    before = (k_cache.clone(), v_cache.clone())
    result = reference.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=_int32(lengths), page_table=table, k_new=k_new,
        v_new=v_new, alibi_slopes=slopes, **kw)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])  # not modified
    out, lse, kc, vc = _naive_kvcache(
        q, k_cache, v_cache, _int32(lengths), table, k_new, v_new, causal=kw.get("causal", False),
        scale=kw.get("softmax_scale"), window=kw.get("window", (-1, -1)),
        softcap=kw.get("softcap", 0.0), slopes=None if slopes is None else slopes.tolist())
    torch.testing.assert_close(result.out, torch.tensor(out, dtype=torch.float64))
    torch.testing.assert_close(result.lse, torch.tensor(lse, dtype=torch.float64).transpose(1, 2))
    torch.testing.assert_close(result.k_cache.double(), torch.tensor(kc, dtype=torch.float64))
    torch.testing.assert_close(result.v_cache.double(), torch.tensor(vc, dtype=torch.float64))
    if table is not None:  # pages no sequence uses are untouched
        used = set(table.flatten().tolist())
        for page in set(range(k_cache.shape[0])) - used:
            assert torch.equal(result.k_cache[page], k_cache[page])
    if 0 in lengths and not seqlen_new:
        b = lengths.index(0)
        assert (result.out[b] == 0).all() and torch.isneginf(result.lse[b]).all()


def test_reference_varlen_queries_against_a_plain_loop():
    gen = random.Random(3)
    table = _shuffled_pages(gen, 3, 4, 14)
    k_cache = _randn(14, 4, 2, 8, dtype=torch.float32, seed=20)
    v_cache = _randn(14, 4, 2, 8, dtype=torch.float32, seed=21)
    q = _randn(9, 4, 8, dtype=torch.float32, seed=22)
    cu, lengths = _int32([0, 4, 4, 9]), _int32([7, 3, 16])
    result = reference.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, cu_seqlens_q=cu,
        max_seqlen_q=5, causal=True, softcap=4.0)
    out, lse, _, _ = _naive_kvcache(q, k_cache, v_cache, lengths, table, cu_seqlens_q=cu,
                                    causal=True, softcap=4.0)
    flat_out = torch.tensor([row for seq in out for row in seq], dtype=torch.float64)
    flat_lse = torch.tensor([row for seq in lse for row in seq], dtype=torch.float64).t()
    torch.testing.assert_close(result.out, flat_out)
    torch.testing.assert_close(result.lse, flat_lse)
    assert result.out.shape == (9, 4, 8) and result.lse.shape == (4, 9)


def test_reference_matches_the_dense_reference_on_a_contiguous_cache():
    q = _randn(2, 3, 4, 16, dtype=torch.float32, seed=30)
    k = _randn(2, 10, 2, 16, dtype=torch.float32, seed=31)
    v = _randn(2, 10, 2, 16, dtype=torch.float32, seed=32)
    result = reference.attention_with_kvcache(q, k, v, cache_seqlens=_int32([10, 10]),
                                              causal=True, window=(5, 0))
    out, lse = reference.attention(q, k, v, causal=True, window=(5, 0), return_lse=True)
    torch.testing.assert_close(result.out, out)
    torch.testing.assert_close(result.lse, lse)
    low = reference.attention_with_kvcache(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                           cache_seqlens=_int32([10, 10]), dtype=torch.bfloat16)
    assert low.out.dtype == torch.bfloat16 and low.lse.dtype == torch.float32


@pytest.mark.parametrize("change,match", [
    (dict(cache_seqlens=_int32([-1, 3])), r"^cache_seqlens: sequence 0 holds -1 keys"),
    (dict(cache_seqlens=_int32([11, 3])), r"^cache_seqlens: sequence 0 holds 11 keys"),
    (dict(page_table=_int32([[4, 6, 2], [5, 1, 3]])), r"^page_table: sequence 0 uses pages"),
    (dict(page_table=_int32([[4, -1, 2], [5, 1, 3]])), r"^page_table: sequence 0 uses pages"),
])
def test_reference_refuses_values_the_kernels_clamp(change, match):
    args = _paged_call(**change)
    with pytest.raises(ValueError, match=match):
        _reference_of(args)


def test_reference_ignores_page_ids_past_the_used_pages():
    args = _paged_call(cache_seqlens=_int32([2, 1]), page_table=_int32([[4, -7, 99], [5, 2**31 - 1, -1]]))
    result = _reference_of(args)
    assert torch.isfinite(result.out).all()


def test_merge_reference_with_an_empty_state_is_the_identity():
    out_a, lse_a, _, _ = _states()
    empty_out, empty_lse = torch.full_like(out_a, math.nan), torch.full_like(lse_a, -math.inf)
    for args in ((out_a, lse_a, empty_out, empty_lse), (empty_out, empty_lse, out_a, lse_a)):
        out, lse = reference.merge_attention_states(*args)
        torch.testing.assert_close(out, out_a.double())
        torch.testing.assert_close(lse, lse_a.double())


def test_merge_reference_of_rows_empty_in_both_is_zeros_and_minus_inf():
    out_a, lse_a, out_b, lse_b = _states()
    lse_a[:, 1] = -math.inf
    lse_b[:, 1] = -math.inf
    out, lse = reference.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert (out[:, :, 1] == 0).all() and torch.isneginf(lse[:, 1]).all()
    assert torch.isfinite(lse[:, 0]).all()


@pytest.mark.parametrize("packed", [False, True])
def test_merge_reference_of_two_key_halves_is_attention_over_all_keys(packed):
    q = _randn(2, 5, 4, 8, dtype=torch.float64, seed=40)
    k = _randn(2, 12, 2, 8, dtype=torch.float64, seed=41)
    v = _randn(2, 12, 2, 8, dtype=torch.float64, seed=42)
    full, full_lse = reference.attention(q, k, v, return_lse=True)
    a, lse_a = reference.attention(q, k[:, :7], v[:, :7], return_lse=True)
    b, lse_b = reference.attention(q, k[:, 7:], v[:, 7:], return_lse=True)
    if packed:  # the first sequence as a packed (total, nheads, headdim) state
        full, full_lse, a, lse_a, b, lse_b = full[0], full_lse[0], a[0], lse_a[0], b[0], lse_b[0]
    out, lse = reference.merge_attention_states(a, lse_a, b, lse_b)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, full_lse)

"""The adapters flashcute.sdpa, flashcute.flash_attn_func and the transformers integration,
without a GPU.

Most tests swap the kernel call (``flashcute.attention`` as the adapters import it) for
``flashcute.reference.attention`` in float64, which has the same semantics (bottom-right
causal, GQA, zeros for rows without keys) and is differentiable: what is tested is the
adapters' own logic (layouts, views, top-left causal from bottom-right calls, argument
mapping), against torch's SDPA on the CPU. The kernels themselves: tests/test_gpu_adapters.py.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

sdpa_module = importlib.import_module("flashcute.sdpa")
fa_module = importlib.import_module("flashcute.flash_attn_compat")
hf_module = importlib.import_module("flashcute.integrations.transformers")


class ReferenceKernel:
    """Stands in for ``flashcute.attention`` in the adapters and records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1),
                 softcap=0.0, alibi_slopes=None, dropout_p=0.0, return_lse=False, out=None,
                 backend=None, deterministic=False):
        self.calls.append(dict(q=q, k=k, v=v, causal=causal, softmax_scale=softmax_scale,
                               window=tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
                               out=out, deterministic=deterministic, dropout_p=dropout_p))
        result = reference.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                     window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                     return_lse=return_lse, dtype=q.dtype)
        if out is not None:
            out.copy_(result[0] if return_lse else result)
            return (out, result[1]) if return_lse else out
        return result


@pytest.fixture
def kernel(monkeypatch):
    fake = ReferenceKernel()
    monkeypatch.setattr(sdpa_module, "attention", fake)
    monkeypatch.setattr(fa_module, "attention", fake)
    monkeypatch.setattr(hf_module, "attention", fake)
    return fake


def sdpa_inputs(batch=2, nheads=4, nheads_kv=4, seqlen_q=5, seqlen_k=5, headdim=8, *, lead=None,
                dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = (batch,) if lead is None else lead

    def randn(*shape):
        return torch.randn(shape, generator=gen, dtype=dtype)

    return (randn(*lead, nheads, seqlen_q, headdim), randn(*lead, nheads_kv, seqlen_k, headdim),
            randn(*lead, nheads_kv, seqlen_k, headdim))


# --- flashcute.sdpa ----------------------------------------------------------------------------

def test_sdpa_signature_is_torch_sdpa():
    names = list(inspect.signature(flashcute.sdpa).parameters)
    assert names == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                     "enable_gqa"]


SEQLENS = [(5, 5), (3, 8), (8, 3), (1, 6), (6, 1), (0, 4), (4, 0), (0, 0), (7, 6)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("nheads,nheads_kv", [(4, 4), (4, 2), (4, 1)])
def test_sdpa_matches_torch_sdpa(kernel, seqlen_q, seqlen_k, is_causal, nheads, nheads_kv):
    q, k, v = sdpa_inputs(nheads=nheads, nheads_kv=nheads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    gqa = nheads != nheads_kv
    got = flashcute.sdpa(q, k, v, is_causal=is_causal, scale=0.3, enable_gqa=gqa)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3, enable_gqa=gqa)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(3, 8), (8, 3), (6, 6)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_gradients_match_torch_sdpa(kernel, seqlen_q, seqlen_k, is_causal):
    inputs = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    dout = torch.randn(2, 4, seqlen_q, 8, dtype=torch.float64)
    grads = []
    for fn in (flashcute.sdpa, F.scaled_dot_product_attention):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        fn(*leaves, is_causal=is_causal, enable_gqa=True).backward(dout)
        grads.append([x.grad for x in leaves])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_sdpa_passes_transposed_views_without_copies(kernel):
    q, k, v = sdpa_inputs(seqlen_q=5, seqlen_k=9)
    flashcute.sdpa(q, k, v)
    (call,) = kernel.calls
    for given, original in ((call["q"], q), (call["k"], k), (call["v"], v)):
        assert given.data_ptr() == original.data_ptr()
        assert given.stride() == original.transpose(1, 2).stride()
    assert call["causal"] is False


def test_sdpa_causal_with_fewer_queries_slices_keys(kernel):
    q, k, v = sdpa_inputs(seqlen_q=3, seqlen_k=8)
    flashcute.sdpa(q, k, v, is_causal=True)
    (call,) = kernel.calls
    assert call["causal"] is True
    assert call["k"].shape[1] == 3 and call["v"].shape[1] == 3
    assert call["k"].data_ptr() == k.data_ptr() and call["k"].stride() == k.transpose(1, 2).stride()


def test_sdpa_causal_with_more_queries_writes_one_output(kernel):
    q, k, v = sdpa_inputs(seqlen_q=8, seqlen_k=3)
    out = flashcute.sdpa(q, k, v, is_causal=True)
    square, rest = kernel.calls
    assert (square["causal"], rest["causal"]) == (True, False)
    assert square["q"].shape[1] == 3 and rest["q"].shape[1] == 5
    assert rest["q"].data_ptr() == q[:, :, 3:].data_ptr()
    # Nothing requires grad: both parts are written into slices of the returned tensor.
    assert square["out"].data_ptr() == out.data_ptr()
    assert rest["out"].data_ptr() == out[:, :, 3:].data_ptr()


def test_sdpa_causal_with_more_queries_under_autograd_concatenates(kernel):
    q, k, v = sdpa_inputs(seqlen_q=8, seqlen_k=3)
    q.requires_grad_(True)
    out = flashcute.sdpa(q, k, v, is_causal=True)
    assert all(call["out"] is None for call in kernel.calls)
    assert out.requires_grad


def test_sdpa_returns_a_transposed_view(kernel):
    q, k, v = sdpa_inputs(seqlen_q=5, seqlen_k=7)
    out = flashcute.sdpa(q, k, v)
    assert out.shape == (2, 4, 5, 8)
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("lead", [(), (2, 3), (1, 2, 2)])
def test_sdpa_leading_dims(kernel, lead):
    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=6, seqlen_k=4, lead=lead)
    got = flashcute.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def sdpa_raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        flashcute.sdpa(*args, **kwargs)


def test_sdpa_refuses_masks_and_dropout(kernel):
    q, k, v = sdpa_inputs()
    mask = torch.ones(5, 5, dtype=torch.bool)
    sdpa_raises(NotImplementedError, r"^attn_mask: .*is_causal=True", q, k, v, attn_mask=mask)
    sdpa_raises(NotImplementedError, r"^dropout_p: ", q, k, v, dropout_p=0.1)
    sdpa_raises(TypeError, r"^dropout_p: ", q, k, v, dropout_p=None)
    assert kernel.calls == []
    flashcute.sdpa(q, k, v, dropout_p=0.0)


def test_sdpa_argument_errors(kernel):
    q, k, v = sdpa_inputs()
    sdpa_raises(TypeError, r"^is_causal: expected a bool", q, k, v, is_causal=1)
    sdpa_raises(TypeError, r"^enable_gqa: expected a bool", q, k, v, enable_gqa=None)
    sdpa_raises(TypeError, r"^scale: expected a float", q, k, v, scale="0.1")
    sdpa_raises(ValueError, r"^scale: .*positive", q, k, v, scale=-0.5)
    sdpa_raises(ValueError, r"^scale: .*positive", q, k, v, scale=float("inf"))
    sdpa_raises(ValueError, r"^scale: .*positive", q, k, v, scale=10**400)
    sdpa_raises(ValueError, r"^scale: .*float32 range", q, k, v, scale=1e300)
    sdpa_raises(TypeError, r"^query: expected a torch.Tensor", q.numpy(), k, v)
    sdpa_raises(ValueError, r"^query: expected \(\.\.\., nheads, seqlen, headdim\)", q[0, 0], k[0, 0],
                v[0, 0])
    sdpa_raises(ValueError, r"^key: .*leading \(batch\) dimensions", q, k[:1], v[:1])
    sdpa_raises(ValueError, r"^key: .*leading", q, k[None], v[None])
    sdpa_raises(ValueError, r"^value: head dim 4 differs from query's 8", q, k, v[..., :4])
    sdpa_raises(ValueError, r"^value: shape .* does not match key's", q, k, v[:, :, :3])
    assert kernel.calls == []


def test_sdpa_head_counts_follow_enable_gqa(kernel):
    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2)
    sdpa_raises(ValueError, r"^enable_gqa: query has 4 heads and key/value 2", q, k, v)
    q3, k3, v3 = sdpa_inputs(nheads=3, nheads_kv=2)
    sdpa_raises(ValueError, r"^key: query's 3 heads are not a multiple", q3, k3, v3, enable_gqa=True)
    same = sdpa_inputs(nheads=4, nheads_kv=4)
    torch.testing.assert_close(flashcute.sdpa(*same, enable_gqa=True), flashcute.sdpa(*same))


def test_sdpa_on_cpu_reaches_the_device_check():
    pytest.importorskip("flashcute._C")
    q, k, v = sdpa_inputs(seqlen_q=3, seqlen_k=8, headdim=64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a CPU tensor"):
        flashcute.sdpa(q, k, v, is_causal=True)


# --- flashcute.flash_attn_func -----------------------------------------------------------------

def fa_inputs(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_kv=2, headdim=8, seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, headdim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen, dtype=torch.float64)
    return q, k, v


def test_flash_attn_func_signature_is_flash_attention_2s():
    params = inspect.signature(flashcute.flash_attn_func).parameters
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size",
                          "softcap", "alibi_slopes", "deterministic", "return_attn_probs"]
    assert params["window_size"].default == (-1, -1)
    assert params["dropout_p"].default == 0.0 and params["softcap"].default == 0.0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 7), (7, 5)])
def test_flash_attn_func_is_flashcute_attention(kernel, causal, seqlen_q, seqlen_k):
    q, k, v = fa_inputs(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    out = flashcute.flash_attn_func(q, k, v, 0.0, 0.25, causal)
    (call,) = kernel.calls
    assert call["q"] is q and call["k"] is k and call["v"] is v
    assert (call["causal"], call["softmax_scale"], call["deterministic"]) == (causal, 0.25, False)
    want = reference.attention(q, k, v, causal=causal, softmax_scale=0.25)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_flash_attn_func_return_attn_probs_gives_lse(kernel):
    q, k, v = fa_inputs()
    out, lse, probs = flashcute.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    want, want_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    assert probs is None
    assert lse.shape == (2, 4, 5)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


def test_flash_attn_func_passes_deterministic(kernel):
    q, k, v = fa_inputs()
    flashcute.flash_attn_func(q, k, v, deterministic=True)
    assert kernel.calls[0]["deterministic"] is True


@pytest.mark.parametrize("window_size,causal,seqlen_q,want", [
    ((-1, -1), False, 5, (-1, -1)),
    ([-1, -1], True, 5, (-1, -1)),
    ((-1, 0), False, 5, (-1, 0)),     # FlashAttention's causal mask as a window
    ((-5, -2), False, 5, (-1, -1)),   # any negative bound is no bound
    ((7, 7), False, 5, (-1, -1)),     # bounds of at least seqlen_k are no bounds
    ((100, 0), False, 5, (-1, 0)),
    ((3, -1), False, 5, (3, -1)),
    ((-1, 2), False, 5, (-1, 2)),
    ((2, 0), True, 5, (2, 0)),
    ((2, 3), True, 5, (2, 3)),        # causal forces the right bound to 0 (flashcute's too)
    ((6, 6), False, 5, (6, 6)),
    ((0, 0), False, 9, (0, 0)),
    ((1, 7), False, 9, (1, -1)),      # more queries than keys: a right bound of seqlen_k is
    ((1, 6), False, 9, (1, 6)),       # none for FlashAttention, though it masks for flashcute
])
def test_flash_attn_func_windows(kernel, window_size, causal, seqlen_q, want):
    q, k, v = fa_inputs(seqlen_q=seqlen_q, seqlen_k=7)
    out = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    (call,) = kernel.calls
    assert call["window"] == want and call["causal"] is (causal or want[1] == 0)
    torch.testing.assert_close(out, fa_window_oracle(q, k, v, window_size, causal),
                               rtol=1e-10, atol=1e-10)


def fa_window_oracle(q, k, v, window_size, causal, softcap=0.0, scale=None, alibi_slopes=None):
    """FlashAttention's sliding-window attention as its documentation states it, written
    out here: query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right, a bound
    that is negative or at least seqlen_k being none, causal making right 0; ALiBi adds
    -slope * |i + sk - sq - j| to the (softcapped) score."""
    seqlen_q, seqlen_k, headdim = q.shape[1], k.shape[1], q.shape[3]
    left, right = (b if 0 <= b < seqlen_k else None for b in window_size)
    if causal:
        right = 0
    scale = headdim**-0.5 if scale is None else scale
    group = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k)[None, :]
    if alibi_slopes is not None:  # (nheads,) or (batch, nheads) against scores (b, h, i, j)
        scores = scores - alibi_slopes.to(scores.dtype)[..., None, None] * (i - j).abs()
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left is not None:
        seen &= j >= i - left
    if right is not None:
        seen &= j <= i + right
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", probs, vv)


def test_flash_attn_func_softcap(kernel):
    q, k, v = fa_inputs(seqlen_q=6, seqlen_k=6)
    q = q * 4  # scores large enough for the cap to matter
    out, lse, _ = flashcute.flash_attn_func(q, k, v, softmax_scale=0.7, causal=True,
                                             window_size=(2, 0), softcap=1.5,
                                             return_attn_probs=True)
    (call,) = kernel.calls
    assert call["softcap"] == 1.5 and call["window"] == (2, 0)
    want = fa_window_oracle(q, k, v, (2, 0), True, softcap=1.5, scale=0.7)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    uncapped = fa_window_oracle(q, k, v, (2, 0), True, scale=0.7)
    assert (out - uncapped).abs().max() > 1e-2  # the cap changed the result


@pytest.mark.parametrize("per_batch", [False, True])
def test_flash_attn_func_alibi(kernel, per_batch):
    q, k, v = fa_inputs(seqlen_q=5, seqlen_k=7)
    gen = torch.Generator().manual_seed(3)
    shape = (2, 4) if per_batch else (4,)
    slopes = torch.rand(shape, generator=gen, dtype=torch.float32) * 2
    out = flashcute.flash_attn_func(q, k, v, softmax_scale=0.5, causal=True, window_size=(3, 0),
                                    softcap=2.0, alibi_slopes=slopes)
    (call,) = kernel.calls
    assert call["alibi_slopes"] is slopes
    want = fa_window_oracle(q, k, v, (3, 0), True, softcap=2.0, scale=0.5, alibi_slopes=slopes)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    unbiased = fa_window_oracle(q, k, v, (3, 0), True, softcap=2.0, scale=0.5)
    assert (out - unbiased).abs().max() > 1e-2  # the bias changed the result


@pytest.mark.parametrize("softcap,error", [(-1.0, ValueError), (float("nan"), ValueError),
                                           (True, TypeError), (None, TypeError)])
def test_flash_attn_func_bad_softcap(kernel, softcap, error):
    q, k, v = fa_inputs()
    with pytest.raises(error, match=r"^softcap: "):
        flashcute.flash_attn_func(q, k, v, softcap=softcap)


@pytest.mark.parametrize("window_size", [(-1,), None, (-1.0, -1), (True, -1)])
def test_flash_attn_func_window_size_type(kernel, window_size):
    q, k, v = fa_inputs()
    with pytest.raises(TypeError, match=r"^window_size: expected a pair"):
        flashcute.flash_attn_func(q, k, v, window_size=window_size)


@pytest.mark.parametrize("name,value", [
    ("qv", torch.ones(1)),
    ("q_descale", torch.ones(1)), ("k_descale", torch.ones(1)), ("v_descale", torch.ones(1)),
    ("attention_chunk", 128),
])
def test_flash_attn_func_refuses_missing_features_by_name(kernel, name, value):
    q, k, v = fa_inputs()
    with pytest.raises(NotImplementedError, match=rf"^{name}: flashcute does not support"):
        flashcute.flash_attn_func(q, k, v, **{name: value})
    assert kernel.calls == []


def test_flash_attn_func_accepts_defaults_and_scheduling_hints(kernel):
    q, k, v = fa_inputs()
    flashcute.flash_attn_func(q, k, v, dropout_p=0.0, softcap=0.0, alibi_slopes=None,
                              window_size=(-1, -1), attention_chunk=0, num_splits=1,
                              pack_gqa=True, sm_margin=0)
    assert len(kernel.calls) == 1


def test_flash_attn_func_passes_dropout_p(kernel):
    q, k, v = fa_inputs()
    flashcute.flash_attn_func(q, k, v, 0.25)  # positional, as FlashAttention's
    flashcute.flash_attn_func(q, k, v, dropout_p=0.0)
    assert [c["dropout_p"] for c in kernel.calls] == [0.25, 0.0]
    for bad, error in ((1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                       (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match=r"^dropout_p: "):
            flashcute.flash_attn_func(q, k, v, dropout_p=bad)
    assert len(kernel.calls) == 2


def test_flash_attn_func_argument_types(kernel):
    q, k, v = fa_inputs()
    for kwargs, name in (({"causal": 1}, "causal"), ({"return_attn_probs": None}, "return_attn_probs"),
                         ({"dropout_p": "0"}, "dropout_p"), ({"softcap": None}, "softcap")):
        with pytest.raises(TypeError, match=rf"^{name}: "):
            flashcute.flash_attn_func(q, k, v, **kwargs)


def test_flash_attn_func_on_cpu_reaches_the_device_check():
    pytest.importorskip("flashcute._C")
    q, k, v = (x.to(torch.float16) for x in fa_inputs(headdim=64))
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a CPU tensor"):
        flashcute.flash_attn_func(q, k, v, causal=True)


# --- flashcute.integrations.transformers -------------------------------------------------------

def test_transformers_integration_imports_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    monkeypatch.delitem(sys.modules, "flashcute.integrations.transformers", raising=False)
    # The package's attribute too, so that later tests get the module they patch back.
    monkeypatch.delattr(importlib.import_module("flashcute.integrations"), "transformers",
                        raising=False)
    integration = importlib.import_module("flashcute.integrations.transformers")
    with pytest.raises(ImportError, match=r"pip install transformers"):
        integration.register()


def test_register_names_a_transformers_without_the_interfaces(monkeypatch):
    import types

    old = types.ModuleType("transformers")
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)
    from flashcute.integrations import transformers as integration

    with pytest.raises(ImportError, match=r"transformers 4.40.0 has no AttentionInterface.*--upgrade"):
        integration.register()


@pytest.fixture
def hf():
    """transformers with flashcute registered (skips where transformers is not installed)."""
    transformers = pytest.importorskip("transformers")
    from flashcute.integrations import transformers as integration

    integration.register()
    return transformers


def tiny_llama(hf, attn_implementation, dtype=torch.float32, **overrides):
    config = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                  initializer_range=0.05)
    config.update(overrides)
    torch.manual_seed(0)
    model = hf.LlamaForCausalLM(hf.LlamaConfig(**config)).to(dtype).eval()
    model.set_attn_implementation(attn_implementation)
    return model


def continue_cache(model, ids, previous):
    """A forward call on ``ids`` after ``previous`` (a model output with a cache), the cache
    passed positionally: transformers 5 renamed the argument ``past_key_values`` to ``cache``."""
    cache = previous["cache"] if "cache" in previous else previous["past_key_values"]
    return model(ids, None, None, cache, use_cache=True)


def test_register_adds_flashcute_to_transformers(hf):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from flashcute.integrations import transformers as integration

    integration.register()  # again: changes nothing
    assert hf.AttentionInterface()["flashcute"] is integration.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["flashcute"] is integration.mask_function
    model = tiny_llama(hf, "flashcute")
    assert model.config._attn_implementation == "flashcute"


def test_llama_on_cpu_reaches_flashcutes_device_check(hf):
    pytest.importorskip("flashcute._C")
    model = hf.LlamaForCausalLM._from_config(
        hf.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1),
        attn_implementation="flashcute",
    ).to(torch.bfloat16)
    assert model.config._attn_implementation == "flashcute"
    with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a CPU tensor"):
        model(torch.randint(0, 128, (1, 6)))


def test_llama_matches_sdpa(hf, kernel):
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(2))
    want = tiny_llama(hf, "sdpa")(ids).logits
    model = tiny_llama(hf, "flashcute")
    got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(kernel.calls) == 2 and all(call["causal"] for call in kernel.calls)


def test_llama_decoding_with_a_cache_matches_sdpa(hf, kernel):
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    results = []
    for implementation in ("sdpa", "flashcute"):
        model = tiny_llama(hf, implementation)
        with torch.no_grad():
            prefill = model(ids[:, :7], use_cache=True)
            step = continue_cache(model, ids[:, 7:8], prefill)
            step2 = continue_cache(model, ids[:, 8:9], step)
        results.append((prefill.logits, step.logits, step2.logits))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # A decoding step's single query row attends every cached key: not causal.
    assert [call["causal"] for call in kernel.calls] == [True, True, False, False, False, False]


def test_llama_training_gradients_match_sdpa(hf, kernel):
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(4))
    grads = []
    for implementation in ("sdpa", "flashcute"):
        model = tiny_llama(hf, implementation).train()
        model(ids, labels=ids).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    for name, want in grads[0].items():
        torch.testing.assert_close(grads[1][name], want, rtol=1e-4, atol=1e-6, msg=name)


def test_llama_refuses_padding_masks(hf, kernel):
    model = tiny_llama(hf, "flashcute")
    ids = torch.randint(0, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    model(ids, attention_mask=mask)  # all ones: no mask reaches the attention
    mask[0, :2] = 0
    with pytest.raises(NotImplementedError, match=r"^attention_mask: "):
        model(ids, attention_mask=mask)


def test_llama_refuses_packed_sequences(hf, kernel):
    model = tiny_llama(hf, "flashcute")
    ids = torch.randint(0, 128, (1, 8))
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])  # two sequences in one row
    # transformers looks for packed sequences only without a cache.
    with pytest.raises(NotImplementedError, match=r"^attention_mask: "):
        model(ids, position_ids=position_ids, use_cache=False)


def test_llama_refuses_attention_dropout_in_training(hf, kernel):
    model = tiny_llama(hf, "flashcute", attention_dropout=0.1)
    ids = torch.randint(0, 128, (1, 5))
    model.eval()(ids)  # no dropout in eval mode
    with pytest.raises(NotImplementedError, match=r"^dropout: "):
        model.train()(ids)


class _Module(torch.nn.Module):
    def __init__(self, is_causal: bool) -> None:
        super().__init__()
        self.is_causal = is_causal


@pytest.mark.parametrize("name", ["s_aux", "cu_seq_lens_q", "max_length_k",
                                  "head_mask", "position_bias", "seq_idx"])
def test_attention_forward_refuses_features_by_name(kernel, name):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2)
    with pytest.raises(NotImplementedError, match=rf"^{name}: "):
        attention_forward(_Module(True), q, k, v, None, **{name: 4})
    attention_forward(_Module(True), q, k, v, None, **{name: None})


@pytest.mark.parametrize("module_causal,is_causal,want", [(True, None, True), (False, None, False),
                                                          (True, False, False), (False, True, True)])
def test_attention_forward_causality(kernel, module_causal, is_causal, want):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=6, seqlen_k=6)
    out, weights = attention_forward(_Module(module_causal), q, k, v, None, scaling=0.2,
                                     is_causal=is_causal)
    assert weights is None and out.shape == (2, 6, 4, 8)
    want_out = F.scaled_dot_product_attention(q, k, v, is_causal=want, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(out, want_out.transpose(1, 2), rtol=1e-10, atol=1e-10)
    assert kernel.calls[-1]["causal"] is want


def hf_oracle(query, key, value, *, causal, scale, window=None, softcap=None):
    """transformers' eager attention with its masks, written out: (batch, heads, seq, dim)
    inputs, GQA by repetition, a causal mask aligned top-left (query i sees key j <= i),
    a sliding window i - window < j, softcap on the scaled scores."""
    group = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(group, dim=1) for x in (key, value))
    scores = query @ key.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(query.shape[2])[:, None]
    j = torch.arange(key.shape[2])[None, :]
    if query.shape[2] == 1:  # a decoding step: the query is the last position
        i = i + key.shape[2] - 1
    seen = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool)
    if causal:
        seen &= j <= i
    if window is not None:
        seen &= j > i - window
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return (probs @ value).transpose(1, 2)


@pytest.mark.parametrize("seqlen_q,seqlen_k,window", [
    (6, 6, 7), (6, 6, 6), (6, 6, 2), (6, 6, 1), (4, 9, 2), (1, 9, 3), (1, 3, 3),
])
def test_attention_forward_sliding_window(kernel, seqlen_q, seqlen_k, window):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    out, _ = attention_forward(_Module(True), q, k, v, None, scaling=0.3, sliding_window=window)
    want = hf_oracle(q, k, v, causal=seqlen_q > 1, scale=0.3, window=window)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    masks = seqlen_k > window if seqlen_q == 1 else seqlen_q > window
    assert kernel.calls[-1]["window"] == ((window - 1, -1) if masks else (-1, -1))


def test_attention_forward_takes_the_window_from_the_module(kernel):
    """Some models (Qwen2-MoE) keep the window on the layer and do not pass it."""
    from flashcute.integrations.transformers import attention_forward

    module = _Module(True)
    module.sliding_window = 3
    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=7, seqlen_k=7)
    out, _ = attention_forward(module, q, k, v, None, scaling=0.3)
    torch.testing.assert_close(out, hf_oracle(q, k, v, causal=True, scale=0.3, window=3),
                               rtol=1e-10, atol=1e-10)
    assert kernel.calls[-1]["window"] == (2, -1)
    # A window the model passes, None included, overrides the module's.
    attention_forward(module, q, k, v, None, sliding_window=None)
    assert kernel.calls[-1]["window"] == (-1, -1)
    attention_forward(module, q, k, v, None, sliding_window=5)
    assert kernel.calls[-1]["window"] == (4, -1)


def test_attention_forward_softcap(kernel):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=6, seqlen_k=6)
    q = q * 5
    out, _ = attention_forward(_Module(True), q, k, v, None, scaling=0.3, softcap=0.8,
                               sliding_window=3)
    want = hf_oracle(q, k, v, causal=True, scale=0.3, window=3, softcap=0.8)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    assert kernel.calls[-1]["softcap"] == 0.8
    attention_forward(_Module(True), q, k, v, None, softcap=None)
    assert kernel.calls[-1]["softcap"] == 0.0


def test_attention_forward_window_argument_errors(kernel):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=6, seqlen_k=6)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"^sliding_window: expected a positive int"):
            attention_forward(_Module(True), q, k, v, None, sliding_window=bad)
    # A module that is not causal: only windows that mask nothing.
    attention_forward(_Module(False), q, k, v, None, sliding_window=6)
    with pytest.raises(NotImplementedError, match=r"^sliding_window: .*bidirectional"):
        attention_forward(_Module(False), q, k, v, None, sliding_window=5)
    # More queries than keys: SDPA's top-left window has no bottom-right equivalent.
    q8, k3, v3 = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=8, seqlen_k=3)
    with pytest.raises(NotImplementedError, match=r"^sliding_window, softcap: .*8 queries"):
        attention_forward(_Module(True), q8, k3, v3, None, sliding_window=2)
    attention_forward(_Module(True), q8, k3, v3, None, sliding_window=8)  # masks nothing


def test_mask_function_leaves_out_causal_sliding_windows_only(hf):
    from transformers.masking_utils import chunked_causal_mask_function, sdpa_mask, \
        sliding_window_causal_mask_function

    from flashcute.integrations.transformers import mask_function

    config = hf.MistralConfig(sliding_window=4)
    sliding = dict(batch_size=2, q_length=9, kv_length=9, local_size=4, config=config,
                   mask_function=sliding_window_causal_mask_function(4))
    assert sdpa_mask(**sliding) is not None  # SDPA's makes the window a mask
    assert mask_function(**sliding) is None
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[0, :2] = False
    masked = mask_function(**sliding, attention_mask=padding)
    assert torch.equal(masked, sdpa_mask(**sliding, attention_mask=padding))
    assert mask_function(**{**sliding, "allow_is_causal_skip": False}) is not None
    chunked = dict(sliding, mask_function=chunked_causal_mask_function(4, torch.zeros(2, dtype=int)))
    chunked["config"] = hf.MistralConfig(sliding_window=None)
    assert mask_function(**chunked) is not None
    chunked["config"] = hf.MistralConfig(sliding_window=4)
    chunked["config"].attention_chunk_size = 4
    assert mask_function(**chunked) is not None


def mistral_pair(hf, **overrides):
    config = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
                  initializer_range=0.05)
    config.update(overrides)
    models = {}
    for implementation in ("sdpa", "flashcute"):
        torch.manual_seed(0)
        models[implementation] = hf.MistralForCausalLM._from_config(
            hf.MistralConfig(**config), attn_implementation=implementation).eval()
    return models


def test_mistral_sliding_window_matches_sdpa(hf, kernel):
    models = mistral_pair(hf)
    for length in (3, 4, 11):
        ids = torch.randint(0, 128, (2, length), generator=torch.Generator().manual_seed(length))
        kernel.calls.clear()
        torch.testing.assert_close(models["flashcute"](ids).logits, models["sdpa"](ids).logits,
                                   rtol=1e-4, atol=1e-4)
        want = (3, -1) if length > 4 else (-1, -1)
        assert {call["window"] for call in kernel.calls} == {want}


def test_mistral_sliding_window_decoding_matches_sdpa(hf, kernel):
    models = mistral_pair(hf)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(5))
    results = {}
    for implementation, model in models.items():
        with torch.no_grad():
            out = model(ids[:, :7], use_cache=True)
            logits = [out.logits]
            for t in range(7, 10):
                out = continue_cache(model, ids[:, t:t + 1], out)
                logits.append(out.logits)
        results[implementation] = logits
    for got, want in zip(results["flashcute"], results["sdpa"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mistral_sliding_window_with_padding_is_refused(hf, kernel):
    model = mistral_pair(hf)["flashcute"]
    ids = torch.randint(0, 128, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :2] = 0
    with pytest.raises(NotImplementedError, match=r"^attention_mask: "):
        model(ids, attention_mask=mask)


def test_gemma2_softcap_and_sliding_window_match_eager(hf, kernel):
    """Gemma-2 alternates sliding-window and global layers and softcaps the attention logits;
    transformers' SDPA refuses softcap, so the eager implementation is the baseline."""
    models = {}
    for implementation in ("eager", "flashcute"):
        config = hf.Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=32, sliding_window=4,
                                 attn_logit_softcapping=0.5, query_pre_attn_scalar=32,
                                 initializer_range=0.5)
        torch.manual_seed(0)
        models[implementation] = hf.Gemma2ForCausalLM._from_config(
            config, attn_implementation=implementation).eval()
    assert models["eager"].config._attn_implementation == "eager"
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(6))
    want = models["eager"](ids).logits
    assert kernel.calls == []
    torch.testing.assert_close(models["flashcute"](ids).logits, want, rtol=1e-4, atol=1e-4)
    assert sorted(call["window"] for call in kernel.calls) == [(-1, -1), (3, -1)]
    assert {call["softcap"] for call in kernel.calls} == {0.5}


def test_llama_under_autocast_hands_the_kernel_the_autocast_dtype(hf, kernel):
    model = tiny_llama(hf, "flashcute")
    ids = torch.randint(0, 128, (2, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)
    assert {(c["q"].dtype, c["k"].dtype, c["v"].dtype) for c in kernel.calls} == {
        (torch.bfloat16,) * 3
    }

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


class ReferenceKernel:
    """Stands in for ``flashcute.attention`` in the adapters and records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q, k, v, *, causal=False, softmax_scale=None, return_lse=False, out=None,
                 backend=None, deterministic=False):
        self.calls.append(dict(q=q, k=k, v=v, causal=causal, softmax_scale=softmax_scale,
                               out=out, deterministic=deterministic))
        result = reference.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
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


@pytest.mark.parametrize("window_size,causal,want_causal", [
    ((-1, -1), False, False),
    ([-1, -1], True, True),
    ((-1, 0), False, True),   # FlashAttention's causal mask as a window
    ((-1, 3), True, True),    # causal sets the right bound to 0
    ((7, 7), False, False),   # bounds of at least seqlen_k are no bounds
    ((100, 0), False, True),
    ((-5, -2), False, False),
])
def test_flash_attn_func_windows_without_a_window(kernel, window_size, causal, want_causal):
    q, k, v = fa_inputs(seqlen_k=7)
    flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    assert kernel.calls[0]["causal"] is want_causal


@pytest.mark.parametrize("window_size,causal", [((3, -1), False), ((-1, 2), False), ((2, 0), True),
                                                ((6, 6), False)])
def test_flash_attn_func_refuses_sliding_windows(kernel, window_size, causal):
    q, k, v = fa_inputs(seqlen_k=7)
    with pytest.raises(NotImplementedError, match=r"^window_size: .*sliding-window"):
        flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window_size)
    assert kernel.calls == []


@pytest.mark.parametrize("window_size", [(-1,), None, (-1.0, -1), (True, -1)])
def test_flash_attn_func_window_size_type(kernel, window_size):
    q, k, v = fa_inputs()
    with pytest.raises(TypeError, match=r"^window_size: expected a pair"):
        flashcute.flash_attn_func(q, k, v, window_size=window_size)


@pytest.mark.parametrize("name,value", [
    ("dropout_p", 0.1), ("softcap", 30.0), ("alibi_slopes", torch.ones(4)), ("qv", torch.ones(1)),
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
    assert ALL_MASK_ATTENTION_FUNCTIONS["flashcute"] is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
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


@pytest.mark.parametrize("name", ["softcap", "s_aux", "cu_seq_lens_q", "max_length_k",
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


def test_attention_forward_takes_windows_longer_than_the_keys(kernel):
    from flashcute.integrations.transformers import attention_forward

    q, k, v = sdpa_inputs(nheads=4, nheads_kv=2, seqlen_q=6, seqlen_k=6)
    attention_forward(_Module(True), q, k, v, None, sliding_window=7)
    for window in (6, 2):
        with pytest.raises(NotImplementedError, match=r"^sliding_window: .*6 keys"):
            attention_forward(_Module(True), q, k, v, None, sliding_window=window)


def test_mistral_with_a_window_longer_than_the_sequence_matches_sdpa(hf, kernel):
    config = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, sliding_window=8,
                  initializer_range=0.05)
    models = {}
    for implementation in ("sdpa", "flashcute"):
        torch.manual_seed(0)
        models[implementation] = hf.MistralForCausalLM._from_config(
            hf.MistralConfig(**config), attn_implementation=implementation).eval()
    ids = torch.randint(0, 128, (2, 7))
    torch.testing.assert_close(models["flashcute"](ids).logits, models["sdpa"](ids).logits,
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(NotImplementedError, match=r"^sliding_window: "):
        models["flashcute"](torch.randint(0, 128, (2, 8)))


def test_llama_under_autocast_hands_the_kernel_the_autocast_dtype(hf, kernel):
    model = tiny_llama(hf, "flashcute")
    ids = torch.randint(0, 128, (2, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)
    assert {(c["q"].dtype, c["k"].dtype, c["v"].dtype) for c in kernel.calls} == {
        (torch.bfloat16,) * 3
    }

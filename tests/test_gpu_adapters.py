"""The adapters on a GPU: flashcute.sdpa against torch SDPA and against flashcute.attention
called directly, flashcute.flash_attn_func against flashcute.attention, and
attn_implementation="flashcute" in a small Llama against "sdpa".

Accuracy rules, as tests/test_gpu_forward.py and tests/test_gpu_backward.py:
  * forward: max |out - float64| <= 2 x PyTorch's own error at the input precision + 1e-5.
    float64 is SDPA's math backend in float64 (the definition of SDPA's semantics, top-left
    causal included); PyTorch's own error is ``lowp_sdpa``: both matmuls in the input dtype,
    softmax in float32, the same top-left mask.
  * gradients: Frobenius norm of the error vs float64 autograd <= 2 x that of autograd
    through ``lowp_sdpa`` + 1e-3 x the largest float64 gradient's norm (a floor for gradients
    that are exactly 0, dq with one key say). Over whole tensors, so that the rounded forward
    output a fused backward must use (tests/test_gpu_backward.py) does not dominate rows with
    few keys; what this test is after is the adapter's semantics (mask alignment, GQA
    mapping, the split of causal calls), whose errors are of order 1.
  * against flashcute.attention on the same views: bitwise, forward and gradients (the same
    kernels run on the same data; gradients under torch.use_deterministic_algorithms).
"""

from __future__ import annotations

import math
import zlib

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import flashcute  # noqa: E402

from test_adapters import continue_cache  # noqa: E402
from test_gpu_forward import check_close  # noqa: E402

pytestmark = pytest.mark.gpu

OUT_ABS_FLOOR = 1e-5
GRAD_REL_FLOOR = 1e-3
DTYPES = ["float16", "bfloat16"]


@pytest.fixture
def gen(request):
    """A CUDA generator seeded from the test id."""
    return torch.Generator(device="cuda").manual_seed(zlib.crc32(request.node.nodeid.encode()))


def sdpa_qkv(gen, batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim, dtype):
    """Random (batch, heads, seqlen, headdim) query, key, value: SDPA's layout, contiguous."""
    dtype = getattr(torch, dtype)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=dtype)

    return (randn(batch, nheads, seqlen_q, headdim), randn(batch, nheads_kv, seqlen_k, headdim),
            randn(batch, nheads_kv, seqlen_k, headdim))


def lowp_sdpa(q, k, v, *, is_causal, scale=None):
    """SDPA in the inputs' precision as PyTorch's math attention roughly does it: both
    matmuls in q's dtype, softmax in float32; top-left causal mask. Differentiable."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if is_causal:
        rows = torch.arange(q.shape[2], device=q.device)[:, None]
        cols = torch.arange(k.shape[2], device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v)


def sdpa64(q, k, v, *, is_causal, scale=None):
    """torch SDPA in float64 (its math backend): the ground truth."""
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=is_causal, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


def direct(q, k, v, *, is_causal, scale=None):
    """flashcute.attention on the transposed views, by hand: what flashcute.sdpa must equal."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    seqlen_q, seqlen_k = qt.shape[1], kt.shape[1]
    if not is_causal:
        out = flashcute.attention(qt, kt, vt, softmax_scale=scale)
    elif seqlen_q <= seqlen_k:
        out = flashcute.attention(qt, kt[:, :seqlen_q], vt[:, :seqlen_q], causal=True,
                                  softmax_scale=scale)
    else:
        out = torch.cat([
            flashcute.attention(qt[:, :seqlen_k], kt, vt, causal=True, softmax_scale=scale),
            flashcute.attention(qt[:, seqlen_k:], kt, vt, softmax_scale=scale),
        ], dim=1)
    return out.transpose(1, 2)


def assert_forward_close(out, q, k, v, *, is_causal, scale=None):
    ref = sdpa64(q, k, v, is_causal=is_causal, scale=scale)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    if out.numel() == 0:
        return
    low = lowp_sdpa(q, k, v, is_causal=is_causal, scale=scale)
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
        f"max |flashcute.sdpa - float64| = {err:.3g} > 2 * torch's {q.dtype} error "
        f"{torch_err:.3g} + {OUT_ABS_FLOOR}"
    )


def grads_of(fn, inputs, dout, **kwargs):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves, **kwargs)
    out.backward(dout.to(out.dtype))
    return out, [x.grad for x in leaves]


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# (batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim)
SHAPES = [
    (2, 4, 4, 128, 128, 64),
    (2, 4, 4, 129, 333, 64),
    (2, 4, 4, 333, 129, 128),
    (1, 8, 2, 257, 100, 128),
    (1, 8, 2, 100, 257, 64),
    (2, 3, 3, 1, 77, 64),
    (2, 4, 2, 77, 1, 128),
    (1, 4, 1, 1000, 999, 128),
]


def shape_id(shape):
    batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim = shape
    return f"b{batch}-h{nheads}kv{nheads_kv}-{seqlen_q}x{seqlen_k}-hd{headdim}"


# --- flashcute.sdpa ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_forward(gen, shape, is_causal, dtype):
    q, k, v = sdpa_qkv(gen, *shape, dtype)
    gqa = shape[1] != shape[2]
    out = flashcute.sdpa(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    assert_forward_close(out, q, k, v, is_causal=is_causal)
    assert torch.equal(out, direct(q, k, v, is_causal=is_causal))


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[3], SHAPES[6]], ids=shape_id)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_backward(gen, shape, is_causal, dtype):
    q, k, v = sdpa_qkv(gen, *shape, dtype)
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    gqa = shape[1] != shape[2]
    _, got = grads_of(flashcute.sdpa, (q, k, v), dout, is_causal=is_causal, enable_gqa=gqa)
    _, want = grads_of(sdpa64, [x.double() for x in (q, k, v)], dout, is_causal=is_causal)
    _, low = grads_of(lowp_sdpa, (q, k, v), dout, is_causal=is_causal)
    scale = max(ref.norm().item() for ref in want)  # dq is 0 with one key, for example
    for name, g, ref, g_low in zip(("dq", "dk", "dv"), got, want, low):
        assert g.shape == ref.shape and g.dtype == q.dtype and torch.isfinite(g).all()
        err, torch_err = (g.double() - ref).norm().item(), (g_low.double() - ref).norm().item()
        assert err <= 2 * torch_err + GRAD_REL_FLOOR * scale, (
            f"{name}: |flashcute.sdpa - float64| = {err:.3g} > 2 * torch's {torch_err:.3g} "
            f"+ {GRAD_REL_FLOOR} * {scale:.3g}"
        )


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[3]], ids=shape_id)
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_backward_is_the_direct_calls(gen, shape, is_causal):
    q, k, v = sdpa_qkv(gen, *shape, "bfloat16")
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    gqa = shape[1] != shape[2]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # dQ in a reproducible order on both sides
    try:
        out, got = grads_of(flashcute.sdpa, (q, k, v), dout, is_causal=is_causal, enable_gqa=gqa)
        want_out, want = grads_of(direct, (q, k, v), dout, is_causal=is_causal)
    finally:
        torch.use_deterministic_algorithms(was)
    assert torch.equal(out, want_out)
    for name, g, ref in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g, ref), name


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(300, 100), (100, 300)])
def test_sdpa_scale(gen, seqlen_q, seqlen_k):
    q, k, v = sdpa_qkv(gen, 2, 4, 4, seqlen_q, seqlen_k, 64, "float16")
    out = flashcute.sdpa(q, k, v, is_causal=True, scale=0.3)
    assert_forward_close(out, q, k, v, is_causal=True, scale=0.3)


@pytest.mark.parametrize("seqlen_q", [0, 5, 300])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_without_keys(gen, seqlen_q, is_causal):
    q, k, v = sdpa_qkv(gen, 2, 4, 4, seqlen_q, 0, 64, "bfloat16")
    out = flashcute.sdpa(q, k, v, is_causal=is_causal)
    assert out.shape == q.shape
    assert (out == 0).all()
    assert torch.equal(out.double(), sdpa64(q, k, v, is_causal=is_causal))


@pytest.mark.parametrize("seqlen_k", [0, 7])
def test_sdpa_without_queries(gen, seqlen_k):
    q, k, v = sdpa_qkv(gen, 2, 4, 4, 0, seqlen_k, 64, "bfloat16")
    assert flashcute.sdpa(q, k, v, is_causal=True).shape == (2, 4, 0, 64)


@pytest.mark.parametrize("lead", [(), (2, 3)])
def test_sdpa_leading_dims(gen, lead):
    dtype = torch.float16
    shape_q, shape_kv = (*lead, 4, 150, 64), (*lead, 2, 90, 64)
    q = torch.randn(shape_q, generator=gen, device="cuda", dtype=dtype)
    k, v = (torch.randn(shape_kv, generator=gen, device="cuda", dtype=dtype) for _ in range(2))
    out = flashcute.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    flat = [x.reshape(-1, *x.shape[-3:]) if lead else x[None] for x in (q, k, v)]
    assert out.shape == q.shape
    assert_forward_close(out.reshape(flat[0].shape), *flat, is_causal=True)


def test_sdpa_accepts_strided_sdpa_layouts(gen):
    # q, k, v as SDPA gets them from one (batch, seqlen, 3, heads, headdim) projection.
    qkv = torch.randn(2, 200, 3, 4, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    out = flashcute.sdpa(q, k, v, is_causal=True)
    assert_forward_close(out, q, k, v, is_causal=True)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(300, 100), (100, 300)])
def test_sdpa_under_torch_compile(gen, seqlen_q, seqlen_k):
    q, k, v = sdpa_qkv(gen, 1, 8, 2, seqlen_q, seqlen_k, 128, "bfloat16")
    compiled = torch.compile(flashcute.sdpa, fullgraph=True)
    out = compiled(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(out, flashcute.sdpa(q, k, v, is_causal=True, enable_gqa=True))


# --- flashcute.flash_attn_func -----------------------------------------------------------------

def fa_qkv(gen, batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim, dtype):
    """(batch, seqlen, heads, headdim) tensors: FlashAttention's layout."""
    return tuple(x.transpose(1, 2).contiguous()
                 for x in sdpa_qkv(gen, batch, nheads, nheads_kv, seqlen_q, seqlen_k, headdim, dtype))


@pytest.mark.parametrize("shape", SHAPES[1:5], ids=shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_func_is_flashcute_attention(gen, shape, causal, dtype):
    q, k, v = fa_qkv(gen, *shape, dtype)
    out = flashcute.flash_attn_func(q, k, v, causal=causal)
    assert torch.equal(out, flashcute.attention(q, k, v, causal=causal))
    out2, lse, probs = flashcute.flash_attn_func(q, k, v, 0.0, 0.1, causal, return_attn_probs=True)
    want, want_lse = flashcute.attention(q, k, v, causal=causal, softmax_scale=0.1, return_lse=True)
    assert probs is None
    assert torch.equal(out2, want) and torch.equal(lse, want_lse)
    check_close(out2, lse, q, k, v, causal=causal, softmax_scale=0.1)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(129, 333), (333, 129)])
def test_flash_attn_func_window_of_the_causal_mask(gen, seqlen_q, seqlen_k):
    q, k, v = fa_qkv(gen, 2, 4, 2, seqlen_q, seqlen_k, 64, "float16")
    causal = flashcute.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flashcute.flash_attn_func(q, k, v, window_size=(-1, 0)), causal)
    full = flashcute.flash_attn_func(q, k, v)
    assert torch.equal(flashcute.flash_attn_func(q, k, v, window_size=(seqlen_k, seqlen_k)), full)


def test_flash_attn_func_backward(gen):
    q, k, v = fa_qkv(gen, 1, 8, 2, 257, 300, 128, "bfloat16")
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    _, got = grads_of(flashcute.flash_attn_func, (q, k, v), dout, causal=True)
    _, want = grads_of(flashcute.attention, (q, k, v), dout, causal=True)
    for name, g, ref in zip(("dq", "dk", "dv"), got, want):
        # dK, dV are reproducible on every path; dQ sums in the order its additions land.
        if name == "dq":
            torch.testing.assert_close(g, ref, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(g, ref), name


def test_flash_attn_func_deterministic(gen):
    q, k, v = fa_qkv(gen, 2, 8, 2, 300, 300, 64, "bfloat16")
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    runs = [grads_of(flashcute.flash_attn_func, (q, k, v), dout, causal=True, deterministic=True)[1]
            for _ in range(3)]
    _, want = grads_of(flashcute.attention, (q, k, v), dout, causal=True, deterministic=True)
    for run in runs:
        for name, g, ref in zip(("dq", "dk", "dv"), run, want):
            assert torch.equal(g, ref), name


def test_flash_attn_func_and_flash_attention_3_meet_the_same_bound(gen):
    """Same call site, same inputs: flashcute and FlashAttention-3 each within the bound of the
    float64 reference (they round differently, so not bitwise)."""
    fa3 = pytest.importorskip("flash_attn_interface")
    q, k, v = fa_qkv(gen, 2, 8, 2, 333, 129, 128, "bfloat16")
    for causal in (False, True):
        theirs = fa3.flash_attn_func(q, k, v, causal=causal)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        out = flashcute.flash_attn_func(q, k, v, causal=causal)
        check_close(out, None, q, k, v, causal=causal)
        check_close(theirs, None, q, k, v, causal=causal)


# --- transformers: attn_implementation="flashcute" ---------------------------------------------

LLAMA = dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
             attention_dropout=0.0, initializer_range=0.05)


@pytest.fixture(scope="module")
def llamas():
    """(float32 "sdpa", bfloat16 "sdpa", bfloat16 "flashcute") Llamas with the same weights.

    head dim 512 / 8 = 64, GQA 8:2. initializer_range 0.05 rather than 0.02 keeps the
    attention weights far from uniform, so that a wrong mask, scale or head mapping moves the
    logits well beyond bf16 noise (checked by hand: a 0.7x scale or one row's mask off gives
    10-30x the bf16 error).
    """
    transformers = pytest.importorskip("transformers")
    from flashcute.integrations.transformers import register

    register()
    torch.manual_seed(0)
    implementations = (("sdpa", torch.float32), ("sdpa", torch.bfloat16),
                       ("flashcute", torch.bfloat16))
    models = []
    for implementation, dtype in implementations:
        # Each model its own config (the attention implementation is kept there), built in
        # its dtype (not cast with .to(), which would round the rotary frequencies too), then
        # given the float32 model's weights.
        model = transformers.LlamaForCausalLM._from_config(
            transformers.LlamaConfig(**LLAMA), attn_implementation=implementation, dtype=dtype
        )
        if models:
            model.load_state_dict(models[0].state_dict())
        models.append(model.cuda().eval())
    for model, (implementation, dtype) in zip(models, implementations):
        assert model.config._attn_implementation == implementation
        assert model.lm_head.weight.dtype == dtype
    return tuple(models)


def assert_no_worse_than_sdpa(name, ours, low, ref):
    """ours' error vs the float32 ref <= 2 x bf16 sdpa's + a small floor, in relative
    Frobenius norm and in max abs (a few wrong rows show in the latter only)."""
    ref, ours, low = ref.double(), ours.double(), low.double()
    err, sdpa_err = rel_err(ours, ref), rel_err(low, ref)
    assert err <= 2 * sdpa_err + 1e-3, f"{name}: relative error {err:.3g} vs sdpa's {sdpa_err:.3g}"
    floor = 1e-3 * ref.abs().max().item()
    err, sdpa_err = (ours - ref).abs().max().item(), (low - ref).abs().max().item()
    assert err <= 2 * sdpa_err + floor, f"{name}: max error {err:.3g} vs sdpa's {sdpa_err:.3g}"


def test_llama_logits(llamas):
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 200), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    with torch.no_grad():
        logits = [model(ids).logits.float() for model in llamas]
    assert_no_worse_than_sdpa("logits", logits[2], logits[1], logits[0])


def test_llama_decoding_step(llamas):
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 151), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(2))
    steps = []
    with torch.no_grad():
        for model in llamas:
            prefill = model(ids[:, :150], use_cache=True)
            step = continue_cache(model, ids[:, 150:], prefill)
            steps.append((prefill.logits.float(), step.logits.float()))
    for i, name in enumerate(("prefill", "step")):
        assert_no_worse_than_sdpa(name, steps[2][i], steps[1][i], steps[0][i])


def test_llama_training_step(llamas):
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 200), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(3))
    grads, losses = [], []
    for model in llamas:
        model.train()
        model.zero_grad(set_to_none=True)
        try:
            loss = model(ids, labels=ids).loss
            loss.backward()
        finally:
            model.eval()
        losses.append(loss.item())
        grads.append({name: p.grad.float() for name, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    assert abs(losses[2] - losses[0]) <= 2 * abs(losses[1] - losses[0]) + 1e-3 * abs(losses[0])
    for name, ref in grads[0].items():
        assert_no_worse_than_sdpa(f"{name}.grad", grads[2][name], grads[1][name], ref)


def test_llama_refuses_padding(llamas):
    ours = llamas[2]
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 16), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad(), pytest.raises(NotImplementedError, match=r"^attention_mask: "):
        ours(ids, attention_mask=mask)

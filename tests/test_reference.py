"""flashcute.reference against an independent loop implementation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from flashcute import reference  # noqa: E402


def naive_attention(q, k, v, causal, scale):
    """One query row at a time, in float64, straight from the definition."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group = nheads // nheads_kv
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            hk = h // group
            for i in range(seqlen_q):
                keys = [j for j in range(seqlen_k) if not causal or j <= i + seqlen_k - seqlen_q]
                if not keys:
                    continue
                s = [scale * float(q[b, i, h] @ k[b, j, hk]) for j in keys]
                m = max(s)
                total = sum(math.exp(x - m) for x in s)
                lse[b, h, i] = m + math.log(total)
                for x, j in zip(s, keys):
                    out[b, i, h] += math.exp(x - m) / total * v[b, j, hk]
    return out, lse


def make(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, headdim, generator=gen)
    k = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen)
    v = torch.randn(batch, seqlen_k, nheads_kv, headdim, generator=gen)
    return q, k, v


CASES = [
    # batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim
    (1, 1, 1, 1, 1, 4),
    (2, 5, 5, 2, 2, 8),
    (2, 3, 7, 4, 2, 8),  # GQA, seqlen_q < seqlen_k
    (1, 7, 3, 4, 1, 4),  # MQA, seqlen_q > seqlen_k: causal leaves rows fully masked
    (1, 4, 6, 3, 3, 16),
]


@pytest.mark.parametrize("shape", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softmax_scale", [None, 0.3, -0.7])
def test_matches_naive(shape, causal, softmax_scale):
    q, k, v = make(*shape)
    scale = 1.0 / math.sqrt(shape[-1]) if softmax_scale is None else softmax_scale
    want_out, want_lse = naive_attention(q, k, v, causal, scale)
    out, lse = reference.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True
    )
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert out.shape == q.shape and lse.shape == (shape[0], shape[3], shape[1])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    q, k, v = make(1, 6, 2, 2, 2, 8)
    out, lse = reference.attention(q, k, v, causal=True, return_lse=True)
    # Query i attends keys j <= i + 2 - 6, so rows 0..3 see no key.
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))
    assert torch.isneginf(lse[..., :4]).all()
    assert torch.isfinite(lse[..., 4:]).all()
    assert out[:, 4:].abs().sum() > 0


def test_no_keys():
    q, k, v = make(2, 3, 0, 2, 1, 8)
    out, lse = reference.attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros(2, 3, 2, 8, dtype=torch.float64))
    assert torch.isneginf(lse).all() and lse.shape == (2, 2, 3)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_rows_sum_to_one(causal):
    # With v = identity over keys, the output row is the softmax row itself.
    seqlen_q, seqlen_k, nheads = 5, 6, 2
    q, k, _ = make(1, seqlen_q, seqlen_k, nheads, nheads, seqlen_k)
    v = torch.eye(seqlen_k).expand(1, nheads, seqlen_k, seqlen_k).transpose(1, 2)
    probs = reference.attention(q, k, v, causal=causal)  # (1, seqlen_q, nheads, seqlen_k)
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, seqlen_q, nheads, dtype=torch.float64))
    if causal:  # query i sees keys j <= i + 1
        mask = torch.arange(seqlen_k)[None, :] > torch.arange(seqlen_q)[:, None] + 1
        assert (probs[0].transpose(0, 1)[:, mask] == 0).all()


def test_lse_is_logsumexp_of_scaled_scores():
    q, k, v = make(2, 4, 5, 3, 3, 8)
    _, lse = reference.attention(q, k, v, softmax_scale=0.5, return_lse=True)
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * 0.5
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lower_precision_dtypes(dtype):
    q, k, v = make(1, 4, 4, 2, 1, 16)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    want = reference.attention(q, k, v, causal=True)
    out, lse = reference.attention(q, k, v, causal=True, return_lse=True, dtype=dtype)
    assert out.dtype == dtype
    assert lse.dtype == torch.float32
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


def test_strided_inputs_match_contiguous():
    q, k, v = make(2, 5, 6, 4, 2, 8)
    qs = q.transpose(1, 2).contiguous().transpose(1, 2)  # SDPA layout viewed as (b, s, h, d)
    torch.testing.assert_close(reference.attention(qs, k, v), reference.attention(q, k, v))


def test_rejects_bad_arguments():
    q, k, v = make(1, 2, 2, 3, 2, 4)
    with pytest.raises(ValueError, match="multiple"):
        reference.attention(q, k, v)
    q, k, v = make(1, 2, 2, 2, 2, 4)
    with pytest.raises(ValueError, match="q: expected a 4-d"):
        reference.attention(q[0], k, v)
    with pytest.raises(TypeError, match="dtype"):
        reference.attention(q, k, v, dtype=torch.int32)

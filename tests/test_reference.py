"""flashcute.reference against an independent loop implementation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from flashcute import reference  # noqa: E402


def naive_attention(q, k, v, causal, scale):
    """One query row at a time, in float64, straight from the definition (no window, softcap
    or ALiBi: ``naive_general`` below)."""
    return naive_general(q, k, v, causal=causal, scale=scale)


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


# Sliding windows, softcap, ALiBi and packed variable-length batches.


def naive_general(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, slopes=None):
    """Brute force over every (query, key) pair, straight from the definitions: query i sees
    key j iff i + sk - sq - left <= j <= i + sk - sq + right (-1: unbounded side) and, when
    causal, j <= i + sk - sq; score = scale * q.k, then softcap, then ALiBi."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group = nheads // nheads_kv
    left, right = window
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            hk = h // group
            slope = 0.0
            if slopes is not None:
                slope = float(slopes[h] if slopes.dim() == 1 else slopes[b, h])
            for i in range(seqlen_q):
                diag = i + seqlen_k - seqlen_q
                keys = [
                    j for j in range(seqlen_k)
                    if (left == -1 or j >= diag - left)
                    and (right == -1 or j <= diag + right)
                    and (not causal or j <= diag)
                ]
                s = []
                for j in keys:
                    x = scale * float(q[b, i, h] @ k[b, j, hk])
                    if softcap > 0:
                        x = softcap * math.tanh(x / softcap)
                    s.append(x - slope * abs(diag - j))
                if not keys:
                    continue
                m = max(s)
                total = sum(math.exp(x - m) for x in s)
                lse[b, h, i] = m + math.log(total)
                for x, j in zip(s, keys):
                    out[b, i, h] += math.exp(x - m) / total * v[b, j, hk]
    return out, lse


def assert_matches_naive(q, k, v, *, causal, scale, window, softcap=0.0, slopes=None):
    want_out, want_lse = naive_general(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, slopes=slopes
    )
    out, lse = reference.attention(
        q, k, v, causal=causal, softmax_scale=scale, window=window, softcap=softcap,
        alibi_slopes=slopes, return_lse=True,
    )
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


WINDOWS = [(0, 0), (2, 0), (2, 2), (2, -1), (-1, 2), (0, -1), (-1, 0), (1, 3), (-1, -1), (9, 9)]


@pytest.mark.parametrize("seqlens", [(5, 7), (7, 5), (6, 6)])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
def test_window_matches_naive(seqlens, window, causal):
    q, k, v = make(2, seqlens[0], seqlens[1], 4, 2, 8)
    assert_matches_naive(q, k, v, causal=causal, scale=0.4, window=window)


def slopes_for(shape, seed=1):
    # Distinct positive float32 slopes large enough to move the softmax visibly.
    gen = torch.Generator().manual_seed(seed)
    return (0.2 + torch.rand(shape, generator=gen)).to(torch.float32)


@pytest.mark.parametrize("seqlens", [(5, 7), (7, 5)])
@pytest.mark.parametrize("window", [(-1, -1), (2, 0), (2, 1), (1, -1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 0.3, 5.0])
@pytest.mark.parametrize("slopes_shape", [None, (4,), (2, 4)])
def test_softcap_alibi_window_gqa_match_naive(seqlens, window, causal, softcap, slopes_shape):
    q, k, v = make(2, seqlens[0], seqlens[1], 4, 2, 8, seed=3)
    q = 3 * q  # scores of a few units, so that a cap of 0.3 or 5.0 bends them
    slopes = None if slopes_shape is None else slopes_for(slopes_shape)
    assert_matches_naive(
        q, k, v, causal=causal, scale=0.5, window=window, softcap=softcap, slopes=slopes
    )


def identity_values(seqlen_q, seqlen_k, nheads):
    """q, k and v = identity over keys, so that the output row is the softmax row itself."""
    q, k, _ = make(1, seqlen_q, seqlen_k, nheads, nheads, seqlen_k)
    v = torch.eye(seqlen_k).expand(1, nheads, seqlen_k, seqlen_k).transpose(1, 2)
    return q, k, v


@pytest.mark.parametrize("window,causal,visible", [
    # seqlen_q 3, seqlen_k 5: the diagonal of query i is key i + 2.
    ((1, 0), False, [[1, 2], [2, 3], [3, 4]]),
    ((0, 1), False, [[2, 3], [3, 4], [4]]),
    ((0, 0), False, [[2], [3], [4]]),
    ((-1, 0), False, [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]),
    ((1, -1), False, [[1, 2, 3, 4], [2, 3, 4], [3, 4]]),
    ((1, 2), True, [[1, 2], [2, 3], [3, 4]]),
    ((-1, -1), True, [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]),
])
def test_window_visible_keys_by_hand(window, causal, visible):
    q, k, v = identity_values(3, 5, 2)
    probs = reference.attention(q, k, v, window=window, causal=causal)[0]  # (sq, heads, sk)
    for i, keys in enumerate(visible):
        assert (probs[i][:, keys] > 0).all()
        hidden = [j for j in range(5) if j not in keys]
        assert (probs[i][:, hidden] == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 2, dtype=torch.float64))


def test_causal_is_window_right_zero():
    q, k, v = make(1, 5, 7, 2, 1, 8)
    causal = reference.attention(q, k, v, causal=True, return_lse=True)
    for window in [(-1, 0), (-1, 3)]:
        for got, want in zip(reference.attention(q, k, v, causal=True, window=window,
                                                 return_lse=True), causal):
            assert torch.equal(got, want)
    for got, want in zip(reference.attention(q, k, v, window=(-1, 0), return_lse=True), causal):
        assert torch.equal(got, want)
    for got, want in zip(reference.attention(q, k, v, causal=True, window=(2, 4), return_lse=True),
                         reference.attention(q, k, v, window=(2, 0), return_lse=True)):
        assert torch.equal(got, want)


def test_defaults_leave_results_unchanged():
    q, k, v = make(2, 4, 6, 4, 2, 8)
    for causal in (False, True):
        base = reference.attention(q, k, v, causal=causal, return_lse=True)
        new = reference.attention(q, k, v, causal=causal, window=(-1, -1), softcap=0.0,
                                  alibi_slopes=None, return_lse=True)
        assert all(torch.equal(a, b) for a, b in zip(base, new))
        zero = reference.attention(q, k, v, causal=causal, alibi_slopes=torch.zeros(4),
                                   return_lse=True)
        assert all(torch.equal(a, b) for a, b in zip(base, zero))


def test_alibi_by_hand():
    # q = 0 makes every score 0, so the softmax row is exp(-slope * |i + sk - sq - j|).
    seqlen_q, seqlen_k, slope = 2, 4, 0.75
    _, k, v = identity_values(seqlen_q, seqlen_k, 1)
    q = torch.zeros(1, seqlen_q, 1, seqlen_k)
    probs, lse = reference.attention(q, k, v, alibi_slopes=torch.tensor([slope]),
                                     return_lse=True)
    for i in range(seqlen_q):
        bias = torch.tensor([-slope * abs(i + 2 - j) for j in range(seqlen_k)], dtype=torch.float64)
        torch.testing.assert_close(probs[0, i, 0], torch.softmax(bias, 0), rtol=1e-12, atol=0)
        torch.testing.assert_close(lse[0, 0, i], torch.logsumexp(bias, 0), rtol=1e-12, atol=0)
    # Query 0's diagonal is key 2: it has the largest weight, keys 1 and 3 tie.
    assert probs[0, 0, 0].argmax() == 2 and probs[0, 0, 0, 1] == probs[0, 0, 0, 3]


def test_softcap_then_alibi_by_hand():
    # One key: the lse is the final score itself, cap * tanh(scale * q.k / cap) - slope * dist.
    q = torch.full((1, 2, 1, 4), 1.0)
    k = torch.full((1, 1, 1, 4), 2.0)  # q.k = 8
    v = torch.randn(1, 1, 1, 4)
    scale, cap, slope = 0.5, 3.0, 0.25
    out, lse = reference.attention(q, k, v, softmax_scale=scale, softcap=cap,
                                   alibi_slopes=torch.tensor([slope]), return_lse=True)
    capped = cap * math.tanh(scale * 8 / cap)
    assert lse[0, 0, 0].item() == pytest.approx(capped - slope * 1, rel=1e-14)  # i=0: d = -1
    assert lse[0, 0, 1].item() == pytest.approx(capped, rel=1e-14)  # i=1: d = 0
    torch.testing.assert_close(out[0, :, 0], v[0, 0, 0].double().expand(2, 4))


@pytest.mark.parametrize("window,causal,seqlens,empty", [
    ((0, 0), False, (7, 5), 2),   # diagonals -2, -1 fall before key 0
    ((2, 0), True, (7, 2), 5),
    ((3, -1), True, (6, 3), 3),
    ((-1, 1), False, (7, 4), 2),  # diagonal + 1 < 0 for queries 0 and 1
])
def test_window_empty_rows_are_zero_with_lse_minus_inf(window, causal, seqlens, empty):
    q, k, v = make(2, seqlens[0], seqlens[1], 2, 1, 8)
    slopes = slopes_for((2,))
    out, lse = reference.attention(q, k, v, window=window, causal=causal, softcap=2.0,
                                   alibi_slopes=slopes, return_lse=True)
    assert torch.equal(out[:, :empty], torch.zeros_like(out[:, :empty]))
    assert torch.isneginf(lse[..., :empty]).all()
    assert torch.isfinite(lse[..., empty:]).all() and (out[:, empty:].abs().sum(-1) > 0).all()


def test_gradients_through_window_softcap_alibi():
    # Query 0 sees no key: its row must not put NaN into any gradient.
    q, k, v = (x.double().requires_grad_() for x in make(1, 4, 3, 2, 1, 4))
    slopes = slopes_for((1, 2))

    def fn(q, k, v):
        return reference.attention(q, k, v, window=(1, 0), causal=True, softcap=1.5,
                                   alibi_slopes=slopes)

    assert torch.autograd.gradcheck(fn, (q, k, v))
    fn(q, k, v).sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_lower_precision_with_window_softcap_alibi():
    q, k, v = (x.to(torch.bfloat16) for x in make(1, 6, 6, 2, 2, 16))
    kwargs = dict(window=(2, 1), softcap=4.0, alibi_slopes=slopes_for((2,)), return_lse=True)
    want, want_lse = reference.attention(q, k, v, **kwargs)
    out, lse = reference.attention(q, k, v, dtype=torch.bfloat16, **kwargs)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(lse.double(), want_lse, rtol=3e-2, atol=3e-2)


def pack(lengths_q, lengths_k, nheads=4, nheads_kv=2, headdim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), nheads, headdim, generator=gen)
    k = torch.randn(sum(lengths_k), nheads_kv, headdim, generator=gen)
    v = torch.randn(sum(lengths_k), nheads_kv, headdim, generator=gen)

    def cu(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    return q, k, v, cu(lengths_q), cu(lengths_k)


# Sequences with 0 and 1 queries or keys, longer queries than keys and the reverse.
LENGTHS_Q = [3, 0, 1, 5, 2, 4, 1]
LENGTHS_K = [4, 2, 0, 5, 1, 2, 3]


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(causal=True),
    dict(window=(1, 0)),
    dict(window=(2, 1), softcap=0.5, softmax_scale=0.9),
    dict(causal=True, window=(1, -1), alibi_slopes=slopes_for((4,))),
    dict(window=(-1, 1), softcap=2.0, alibi_slopes=slopes_for((7, 4))),
])
def test_varlen_matches_per_sequence_and_naive(kwargs):
    q, k, v, cu_q, cu_k = pack(LENGTHS_Q, LENGTHS_K)
    out, lse = reference.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kwargs)
    assert out.shape == q.shape and out.dtype == torch.float64
    assert lse.shape == (4, q.shape[0]) and lse.dtype == torch.float64
    slopes = kwargs.pop("alibi_slopes", None)
    scale = kwargs.pop("softmax_scale", 1 / math.sqrt(8))
    for b in range(len(LENGTHS_Q)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        slopes_b = slopes if slopes is None or slopes.dim() == 1 else slopes[b]
        want_out, want_lse = naive_general(
            q[None, rows], k[None, keys], v[None, keys], scale=scale,
            causal=kwargs.get("causal", False), window=kwargs.get("window", (-1, -1)),
            softcap=kwargs.get("softcap", 0.0), slopes=slopes_b,
        )
        torch.testing.assert_close(out[rows], want_out[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lse[:, rows], want_lse[0], rtol=1e-10, atol=1e-10)
        got = reference.attention(q[None, rows], k[None, keys], v[None, keys], return_lse=True,
                                  softmax_scale=scale, alibi_slopes=slopes_b, **kwargs)
        assert torch.equal(out[rows], got[0][0]) and torch.equal(lse[:, rows], got[1][0])
    # The sequence with no key gives zeros and -inf.
    empty = slice(int(cu_q[2]), int(cu_q[3]))
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.isneginf(lse[:, empty]).all()


def test_varlen_seqused_k():
    q, k, v, cu_q, cu_k = pack(LENGTHS_Q, LENGTHS_K)
    used = [2, 1, 0, 5, 0, 1, 3]
    seqused = torch.tensor(used, dtype=torch.int32)
    kwargs = dict(causal=True, window=(2, -1), alibi_slopes=slopes_for((4,)), return_lse=True)
    out, lse = reference.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=seqused, **kwargs)
    for b in range(len(used)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b]) + used[b])  # masks align to the used length
        want_out, want_lse = reference.attention(q[None, rows], k[None, keys], v[None, keys],
                                                 **kwargs)
        assert torch.equal(out[rows], want_out[0]) and torch.equal(lse[:, rows], want_lse[0])
    full = reference.attention_varlen(q, k, v, cu_q, cu_k, **kwargs)
    first = slice(0, LENGTHS_Q[0])  # sequence 0 uses 2 of its 4 keys: the result changes
    assert not torch.allclose(out[first], full[0][first])
    everything = torch.tensor(LENGTHS_K, dtype=torch.int32)
    for got, want in zip(reference.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=everything,
                                                    **kwargs), full):
        assert torch.equal(got, want)


def test_varlen_rows_outside_sequences_and_empty_batch():
    q, k, v, _, _ = pack([6], [5])
    cu_q = torch.tensor([1, 3, 4], dtype=torch.int32)  # rows 0, 4 and 5 are in no sequence
    cu_k = torch.tensor([0, 2, 5], dtype=torch.int32)
    out, lse = reference.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    for r in (0, 4, 5):
        assert torch.equal(out[r], torch.zeros_like(out[r])) and torch.isneginf(lse[:, r]).all()
    want = reference.attention(q[None, 1:3], k[None, 0:2], v[None, 0:2])
    assert torch.equal(out[1:3], want[0])
    none = torch.zeros(1, dtype=torch.int32)
    out, lse = reference.attention_varlen(q, k, v, none, none, return_lse=True)
    assert torch.equal(out, torch.zeros(6, 4, 8, dtype=torch.float64))
    assert torch.isneginf(lse).all() and lse.shape == (4, 6)


def test_varlen_lower_precision_and_gradients():
    q, k, v, cu_q, cu_k = pack([2, 0, 3], [3, 1, 2], nheads=2, nheads_kv=1, headdim=4)
    out, lse = reference.attention_varlen(q.half(), k.half(), v.half(), cu_q, cu_k,
                                          causal=True, return_lse=True, dtype=torch.float16)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))

    def fn(q, k, v):
        return reference.attention_varlen(q, k, v, cu_q, cu_k, window=(1, 0), softcap=1.0,
                                          alibi_slopes=slopes_for((3, 2)))

    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("window,error", [
    ((-2, 0), ValueError), ((0, -5), ValueError), ((1.0, 0), TypeError), ((True, 0), TypeError),
    ((1,), TypeError), ((1, 2, 3), TypeError), (None, TypeError), (3, TypeError),
])
def test_rejects_bad_window(window, error):
    q, k, v = make(1, 2, 2, 2, 2, 4)
    with pytest.raises(error, match=r"^window: "):
        reference.attention(q, k, v, window=window)


@pytest.mark.parametrize("softcap,error", [
    (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    ("1", TypeError), (None, TypeError), (True, TypeError),
])
def test_rejects_bad_softcap(softcap, error):
    q, k, v = make(1, 2, 2, 2, 2, 4)
    with pytest.raises(error, match=r"^softcap: "):
        reference.attention(q, k, v, softcap=softcap)


@pytest.mark.parametrize("slopes,error", [
    (torch.ones(3), ValueError), (torch.ones(1), ValueError), (torch.ones(3, 2), ValueError),
    (torch.ones(2, 2, 1), ValueError), (torch.ones(()), ValueError),
    (torch.ones(2, dtype=torch.int32), TypeError), ([1.0, 1.0], TypeError),
])
def test_rejects_bad_alibi_slopes(slopes, error):
    q, k, v = make(2, 2, 2, 2, 2, 4)  # batch 2, nheads 2
    with pytest.raises(error, match=r"^alibi_slopes: "):
        reference.attention(q, k, v, alibi_slopes=slopes)


def test_varlen_rejects_bad_arguments():
    q, k, v, cu_q, cu_k = pack([2, 3], [3, 1])
    i32 = dict(dtype=torch.int32)
    cases = [
        (dict(q=q[None]), ValueError, r"^q: expected a 3-d"),
        (dict(cu_seqlens_q=cu_q.long()), ValueError, r"^cu_seqlens_q: .*int32"),
        (dict(cu_seqlens_k=cu_k[None]), ValueError, r"^cu_seqlens_k: .*1-d"),
        (dict(cu_seqlens_q=cu_q[:0]), ValueError, r"^cu_seqlens_q: .*non-empty"),
        (dict(cu_seqlens_q=[0, 2, 5]), TypeError, r"^cu_seqlens_q: "),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 2], **i32)), ValueError,
         r"^cu_seqlens_q: .*non-decreasing"),
        (dict(cu_seqlens_q=torch.tensor([0, 2, 6], **i32)), ValueError, r"^cu_seqlens_q: .*outside"),
        (dict(cu_seqlens_k=torch.tensor([-1, 2, 4], **i32)), ValueError,
         r"^cu_seqlens_k: .*outside"),
        (dict(cu_seqlens_k=torch.tensor([0, 4], **i32)), ValueError, r"^cu_seqlens_k: 2 offsets"),
        (dict(seqused_k=torch.tensor([3, 2], **i32)), ValueError, r"^seqused_k: .*key counts"),
        (dict(seqused_k=torch.tensor([-1, 0], **i32)), ValueError, r"^seqused_k: .*key counts"),
        (dict(seqused_k=torch.tensor([1], **i32)), ValueError, r"^seqused_k: .*shape"),
        (dict(seqused_k=torch.tensor([1, 1])), ValueError, r"^seqused_k: .*int32"),
        (dict(seqused_k=[1, 1]), TypeError, r"^seqused_k: "),
        (dict(alibi_slopes=torch.ones(3, 4)), ValueError, r"^alibi_slopes: "),
        (dict(window=(0, -2)), ValueError, r"^window: "),
        (dict(softcap=-0.5), ValueError, r"^softcap: "),
    ]
    for change, error, match in cases:
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        kwargs = {name: change.pop(name) for name in list(change) if name not in args}
        args.update(change)
        with pytest.raises(error, match=match):
            reference.attention_varlen(*args.values(), **kwargs)
    empty = torch.zeros(1, **i32)  # no sequence at all still checks the keywords
    with pytest.raises(ValueError, match=r"^window: "):
        reference.attention_varlen(q, k, v, empty, empty, window=(-3, 0))

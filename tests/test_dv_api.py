"""A v head dim that differs from q's and k's (d_v != d), without a GPU: which calls the
argument checks accept (those a compiled Hopper-path kernel runs: forward on a head dim pair
kernel at least as large in both, backward on a kernel at least as large as both), the
shapes of out, dout and the gradients, the dispatch (the Hopper path on sm90 only, a
ValueError naming v elsewhere) and the float64 reference.

The build is a stand-in (``build`` below), so the results do not depend on the head dims this
extension was compiled with; GPU results are in tests/test_gpu_dv.py.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("flashcute._C")
torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import _dispatch, reference  # noqa: E402
from flashcute._validate_varlen import validate_varlen, validate_varlen_backward  # noqa: E402
from dispatch_stand_in import stand_in_extension  # noqa: E402

DEVICE_ERROR = r"^q: expected a CUDA tensor, got a CPU tensor"
AMPERE, HOPPER = 1, 2


@pytest.fixture
def build(monkeypatch):
    """Dispatch and checks against a stand-in build: the defaults' head dims, bf16 and fp16,
    and the Hopper-path forward pair (192, 128). The dict's entries may be changed."""
    built = {
        ("ampere", False): [32, 64, 96, 128, 192, 256],
        ("ampere", True): [32, 64, 96, 128, 192, 256],
        ("hopper", False): [64, 96, 128, 192, 256],
        ("hopper", True): [64, 128, 256],
        "pairs": [[192, 128]],
    }

    def backend_support(backend, *, backward=False):
        dims = built[(backend, backward)]
        return list(dims), ["float16", "bfloat16"] if dims else []

    def head_dim_pairs(backend):
        return [list(pair) for pair in built["pairs"]] if backend == "hopper" else []

    monkeypatch.setattr(_dispatch, "backend_support", backend_support)
    monkeypatch.setattr(_dispatch, "head_dim_pairs", head_dim_pairs)
    monkeypatch.setattr(_dispatch, "load_extension",
                        lambda: stand_in_extension(built, ["float16", "bfloat16"]))
    return built


def qkv(headdim=192, headdim_v=128, batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_kv=2):
    q = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.bfloat16)
    k = torch.zeros(batch, seqlen_k, nheads_kv, headdim, dtype=torch.bfloat16)
    v = torch.zeros(batch, seqlen_k, nheads_kv, headdim_v, dtype=torch.bfloat16)
    return q, k, v


def bwd_args(headdim=192, headdim_v=128):
    q, k, v = qkv(headdim, headdim_v)
    out = torch.zeros(*q.shape[:3], headdim_v, dtype=q.dtype)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    return torch.zeros_like(out), q, k, v, out, lse


def packed(headdim=192, headdim_v=128):
    q = torch.zeros(9, 4, headdim, dtype=torch.bfloat16)
    k = torch.zeros(11, 2, headdim, dtype=torch.bfloat16)
    v = torch.zeros(11, 2, headdim_v, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 11], dtype=torch.int32)
    return q, k, v, cu_q, cu_k, 5, 6


# ---------------------------------------------------------------------------------------------
# Argument checks


@pytest.mark.parametrize("headdim, headdim_v", [(192, 128), (136, 120), (192, 64), (144, 8), (64, 128)])
def test_a_compiled_pair_passes_the_checks(build, headdim, headdim_v):
    """(192, 128) and calls it covers (both head dims at most the pair's, multiples of 8) pass
    every check that CPU tensors can reach, forward, backward and variable-length; the backward
    takes a v head dim below q's only."""
    q, k, v = qkv(headdim, headdim_v)
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        flashcute.attention(q, k, v)
    backward_error = DEVICE_ERROR if headdim_v < headdim else rf"^v: head dim {headdim_v} is larger than q's"
    with pytest.raises(ValueError, match=backward_error):
        flashcute.attention_backward(*bwd_args(headdim, headdim_v))
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        validate_varlen(*packed(headdim, headdim_v))


@pytest.mark.parametrize("headdim, headdim_v", [(200, 128), (192, 136), (64, 192), (256, 128)])
def test_no_forward_kernel_names_v(build, headdim, headdim_v):
    """A call that no pair covers (a head dim above the pair's): a ValueError naming v."""
    q, k, v = qkv(headdim, headdim_v)
    match = rf"^v: head dim {headdim_v} differs from q's and k's {headdim}, and this build has no forward"
    with pytest.raises(ValueError, match=match):
        flashcute.attention(q, k, v)
    with pytest.raises(ValueError, match=match):
        validate_varlen(*packed(headdim, headdim_v))


def test_a_build_without_pairs_names_v(build):
    build["pairs"] = []
    with pytest.raises(ValueError, match=r"^v: head dim 128 differs .* compiled: pairs none\)"):
        flashcute.attention(*qkv(192, 128))


def test_backward_needs_a_kernel_as_wide_as_both(build):
    """The backward runs on a Hopper-path backward kernel at least as large as both head dims:
    without one, a ValueError naming v; any pair it covers passes (no forward pair needed).
    A v head dim above q's is refused, naming v."""
    with pytest.raises(ValueError, match=r"^v: head dim 128 is larger than q's and k's 64"):
        flashcute.attention_backward(*bwd_args(64, 128))
    build[("hopper", True)] = [64, 128]
    match = r"^v: head dim 128 differs from q's and k's 192, and this build has no backward"
    with pytest.raises(ValueError, match=match):
        flashcute.attention_backward(*bwd_args(192, 128))
    dout, q, k, v, out, lse = bwd_args(192, 128)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    flat = [x.reshape(-1, *x.shape[2:]) for x in (dout, q, k, v, out)]
    lse_packed = torch.zeros(q.shape[2], 10, dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        validate_varlen_backward(*flat, lse_packed, cu_q, cu_k, 3, 4)


@pytest.mark.parametrize("headdim_v", [100, 264, 0])
def test_v_head_dim_must_be_a_multiple_of_8_up_to_256(build, headdim_v):
    with pytest.raises(ValueError, match=rf"^v: head dim {headdim_v} is not supported"):
        flashcute.attention(*qkv(192, headdim_v))


def test_v_other_dims_still_match_k(build):
    q, k, _ = qkv()
    v = torch.zeros(2, 8, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^v: shape \(2, 8, 2, 128\) does not match k's shape "
                                         r"\(2, 7, 2, 192\) \(only the head dim may differ\)"):
        flashcute.attention(q, k, v)


def test_out_takes_v_head_dim(build):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 5, 4, 128\)"):
        flashcute.attention(q, k, v, out=torch.zeros_like(q))
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        flashcute.attention(q, k, v, out=torch.zeros(2, 5, 4, 128, dtype=q.dtype))
    pq, pk, pv, cu_q, cu_k, max_q, max_k = packed()
    with pytest.raises(ValueError, match=r"^out: expected shape \(9, 4, 128\)"):
        validate_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k, out=torch.zeros_like(pq))


def test_backward_shapes(build):
    """dout and out have v's head dim, dq q's, dk k's and dv v's."""
    dout, q, k, v, out, lse = bwd_args()
    with pytest.raises(ValueError, match=r"^dout: expected shape \(2, 5, 4, 128\)"):
        flashcute.attention_backward(torch.zeros_like(q), q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 5, 4, 128\)"):
        flashcute.attention_backward(dout, q, k, v, torch.zeros_like(q), lse)
    with pytest.raises(ValueError, match=r"^dq: expected shape \(2, 5, 4, 192\)"):
        flashcute.attention_backward(dout, q, k, v, out, lse, dq=torch.zeros_like(out))
    with pytest.raises(ValueError, match=r"^dk: expected shape \(2, 7, 2, 192\)"):
        flashcute.attention_backward(dout, q, k, v, out, lse, dk=torch.zeros_like(v))
    with pytest.raises(ValueError, match=r"^dv: expected shape \(2, 7, 2, 128\)"):
        flashcute.attention_backward(dout, q, k, v, out, lse, dv=torch.zeros_like(k))
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        flashcute.attention_backward(dout, q, k, v, out, lse, dq=torch.zeros_like(q),
                                     dk=torch.zeros_like(k), dv=torch.zeros_like(v))


def test_deterministic_backward_names_v(build):
    """deterministic=True runs the Ampere path, which has no kernel for such calls."""
    with pytest.raises(ValueError, match=r"^v: head dim 128 differs .*deterministic=True"):
        _dispatch.choose_backward_backend(None, 90, headdim=192, dtype="bfloat16",
                                          deterministic=True, headdim_v=128)


# ---------------------------------------------------------------------------------------------
# Dispatch


def test_sm90_runs_the_hopper_path(build):
    assert _dispatch.choose_backend(None, 90, headdim=192, dtype="bfloat16", headdim_v=128) == HOPPER
    assert _dispatch.choose_backend("hopper", 90, headdim=136, dtype="float16", headdim_v=64) == HOPPER
    assert _dispatch.choose_backward_backend(None, 90, headdim=192, dtype="bfloat16",
                                             headdim_v=128) == HOPPER
    # Equal head dims keep their usual choice (hd 32: the Hopper path's hd 64 kernel, at most
    # twice the Ampere path's 32; hd 32 beside a Hopper path of hd 256 only: the Ampere path).
    assert _dispatch.choose_backend(None, 90, headdim=32, dtype="bfloat16", headdim_v=32) == HOPPER
    build[("hopper", False)] = [256]
    assert _dispatch.choose_backend(None, 90, headdim=32, dtype="bfloat16", headdim_v=32) == AMPERE


@pytest.mark.parametrize("requested, capability, reason", [
    (None, 80, r"on an sm90 GPU; this is sm80"),
    (None, 89, r"on an sm90 GPU; this is sm89"),
    ("hopper", 86, r"on an sm90 GPU; this is sm86"),
    ("ampere", 90, r"not backend='ampere'"),
    ("ampere", 80, r"not backend='ampere'"),
])
def test_other_gpus_and_the_ampere_path_name_v(build, requested, capability, reason):
    match = r"^v: head dim 128 differs from q's and k's 192; only the Hopper path runs such calls.*" + reason
    with pytest.raises(ValueError, match=match):
        _dispatch.choose_backend(requested, capability, headdim=192, dtype="bfloat16", headdim_v=128)
    with pytest.raises(ValueError, match=match):
        _dispatch.choose_backward_backend(requested, capability, headdim=192, dtype="bfloat16",
                                          headdim_v=128)


def test_kernel_pairs(build):
    assert _dispatch.kernel_head_dim_pair("hopper", 192, 128) == (192, 128)
    assert _dispatch.kernel_head_dim_pair("hopper", 136, 72) == (192, 128)
    assert _dispatch.kernel_head_dim_pair("hopper", 200, 128) is None
    assert _dispatch.kernel_head_dim_pair("hopper", 192, 128, backward=True) == (256, 256)
    assert _dispatch.kernel_head_dim_pair("hopper", 64, 128, backward=True) == (128, 128)
    assert _dispatch.kernel_head_dim_pair("ampere", 192, 128) is None


def test_build_info_lists_pairs():
    info = flashcute.build_info()
    for support in info["backends"].values():
        assert isinstance(support["head_dim_pairs"], list)
        assert all(len(pair) == 2 and pair[0] != pair[1] for pair in support["head_dim_pairs"])
    assert info["backends"]["ampere"]["head_dim_pairs"] == []


# ---------------------------------------------------------------------------------------------
# The float64 reference


def _naive(q, k, v, *, causal=False):
    """softmax(q·kᵀ/√d)·v per head, in float64 loops over heads (GQA by index)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    out = torch.zeros(batch, seqlen_q, nheads, v.shape[-1], dtype=torch.float64)
    for h in range(nheads):
        kh = h // (nheads // nheads_kv)
        s = torch.einsum("bid,bjd->bij", q[:, :, h].double(), k[:, :, kh].double()) / math.sqrt(headdim)
        if causal:
            i = torch.arange(seqlen_q)[:, None]
            j = torch.arange(seqlen_k)[None, :]
            s = s.masked_fill(j > i + seqlen_k - seqlen_q, float("-inf"))
        out[:, :, h] = torch.einsum("bij,bjd->bid", torch.softmax(s, dim=-1), v[:, :, kh].double())
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_reference_with_its_own_v_head_dim(causal):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 4, 24, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 9, 2, 24, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 9, 2, 16, generator=gen, dtype=torch.float64)
    out, lse = reference.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, 6, 4, 16) and lse.shape == (2, 4, 6)
    torch.testing.assert_close(out, _naive(q, k, v, causal=causal), rtol=1e-12, atol=1e-12)
    # The lse does not depend on v.
    _, lse_same = reference.attention(q, k, k, causal=causal, return_lse=True)
    torch.testing.assert_close(lse, lse_same, rtol=0, atol=0)


def test_reference_varlen_with_its_own_v_head_dim():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(7, 2, 24, generator=gen, dtype=torch.float64)
    k = torch.randn(9, 1, 24, generator=gen, dtype=torch.float64)
    v = torch.randn(9, 1, 8, generator=gen, dtype=torch.float64)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert out.shape == (7, 2, 8)
    for b in range(2):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = _naive(q[None, rows], k[None, keys], v[None, keys], causal=True)[0]
        torch.testing.assert_close(out[rows], one, rtol=1e-12, atol=1e-12)


def test_reference_refuses_other_v_shapes():
    q = torch.zeros(1, 3, 2, 16)
    k = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match=r"^v: shape"):
        reference.attention(q, k, torch.zeros(1, 5, 2, 8))

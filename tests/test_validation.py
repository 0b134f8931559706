"""Argument checks of flashcute.attention, exercised with CPU tensors (no GPU needed)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("flashcute._C")
torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute._validate import validate_forward  # noqa: E402


def qkv(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_kv=2, headdim=64, dtype=torch.float16):
    q = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=dtype)
    k = torch.zeros(batch, seqlen_k, nheads_kv, headdim, dtype=dtype)
    v = torch.zeros(batch, seqlen_k, nheads_kv, headdim, dtype=dtype)
    return q, k, v


def raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        flashcute.attention(*args, **kwargs)


def test_valid_cpu_inputs_fail_only_on_device():
    raises(ValueError, r"^q: expected a CUDA tensor, got a CPU tensor", *qkv())


def test_validate_forward_checks_device_last():
    q, k, v = qkv(headdim=128)
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor"):
        validate_forward(q, k, v, causal=True, softmax_scale=0.1, backend="hopper")


@pytest.mark.parametrize("position", ["q", "k", "v"])
def test_not_dlpack(position):
    args = dict(zip("qkv", qkv()))
    args[position] = [[1.0, 2.0]]
    raises(TypeError, rf"^{position}: expected a DLPack tensor.*got list", args["q"], args["k"],
           args["v"])


def test_numpy_is_dlpack_but_cpu():
    np = pytest.importorskip("numpy")
    q, k, v = (np.zeros(tuple(x.shape), dtype=np.float16) for x in qkv())
    raises(ValueError, r"^q: expected a CUDA tensor, got a CPU tensor", q, k, v, out=q.copy())


def test_generic_dlpack_without_out_cannot_allocate():
    np = pytest.importorskip("numpy")
    from flashcute.attention import _allocator

    q = np.zeros((1, 2, 1, 64), dtype=np.float16)
    with pytest.raises(TypeError, match=r"^q: flashcute can allocate the output only for a torch"):
        _allocator(q, None, False)
    with pytest.raises(TypeError, match=r"^q, out: return_lse=True needs"):
        _allocator(q, q.copy(), True)
    assert _allocator(q, q.copy(), False) == (None, q)


@pytest.mark.parametrize("position", ["q", "k", "v"])
def test_wrong_rank(position):
    args = dict(zip("qkv", qkv()))
    args[position] = args[position][0]
    raises(ValueError, rf"^{position}: expected a 4-d tensor \(batch, seqlen, nheads, headdim\), "
           r"got shape \(", args["q"], args["k"], args["v"])


def test_float32_rejected():
    raises(TypeError, r"^q: expected float16 or bfloat16, got float32", *qkv(dtype=torch.float32))


def test_dtype_mismatch():
    q, k, v = qkv()
    raises(TypeError, r"^v: dtype bfloat16 does not match q's dtype float16", q, k,
           v.to(torch.bfloat16))


def test_batch_mismatch():
    q, _, _ = qkv(batch=2)
    _, k, v = qkv(batch=3)
    raises(ValueError, r"^k: batch size 3 does not match q's 2", q, k, v)


def test_headdim_mismatch():
    q, _, _ = qkv(headdim=64)
    _, k, v = qkv(headdim=128)
    raises(ValueError, r"^k: head dim 128 does not match q's 64", q, k, v)


def test_k_v_shape_mismatch():
    q, k, _ = qkv(seqlen_k=7)
    _, _, v = qkv(seqlen_k=8)
    raises(ValueError, r"^v: shape \(2, 8, 2, 64\) does not match k's shape \(2, 7, 2, 64\)",
           q, k, v)


def test_heads_not_divisible():
    raises(ValueError, r"^q, k: q's 4 heads are not a multiple of k/v's 3 heads",
           *qkv(nheads=4, nheads_kv=3))


@pytest.mark.parametrize("headdim", [4, 100, 264])
def test_unsupported_headdim(headdim):
    raises(ValueError, rf"^q: head dim {headdim} is not supported; supported head dims are the "
           r"multiples of 8 from 8 to 256", *qkv(headdim=headdim))


@pytest.mark.parametrize("position", ["q", "k", "v"])
def test_non_unit_last_stride(position):
    args = dict(zip("qkv", qkv()))
    x = args[position]
    args[position] = torch.zeros(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)[..., ::2]
    raises(ValueError, rf"^{position}: expected unit stride in the last \(headdim\) dimension, "
           r"got strides \(", args["q"], args["k"], args["v"])


def test_zero_stride_rejected():
    q, k, v = qkv()
    k = k[:1].expand(2, -1, -1, -1)
    raises(ValueError, r"^k: expected positive strides", q, k, v)


def test_sdpa_layout_transpose_is_accepted_up_to_device():
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv())
    raises(ValueError, r"^q: expected a CUDA tensor", q, k, v)


def test_backend_bogus():
    raises(ValueError, r"^backend: expected None, 'ampere' or 'hopper', got 'bogus'", *qkv(),
           backend="bogus")


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, 0.0, -0.5])
def test_softmax_scale_not_finite_positive(scale):
    raises(ValueError, r"^softmax_scale: expected a finite positive float", *qkv(),
           softmax_scale=scale)


def test_softmax_scale_wrong_type():
    raises(TypeError, r"^softmax_scale: expected a float", *qkv(), softmax_scale="0.5")


def test_causal_must_be_bool():
    raises(TypeError, r"^causal: expected a bool, got int", *qkv(), causal=1)


def test_return_lse_must_be_bool():
    raises(TypeError, r"^return_lse: expected a bool", *qkv(), return_lse=None)


def test_out_wrong_shape():
    q, k, v = qkv()
    raises(ValueError, r"^out: expected shape \(2, 5, 4, 64\).*got \(2, 5, 4, 32\)", q, k, v,
           out=torch.zeros(2, 5, 4, 32, dtype=q.dtype))


def test_out_wrong_dtype():
    q, k, v = qkv()
    raises(TypeError, r"^out: dtype bfloat16 does not match q's dtype float16", q, k, v,
           out=torch.zeros_like(q, dtype=torch.bfloat16))


def test_out_non_unit_last_stride():
    q, k, v = qkv()
    out = torch.zeros(2, 5, 4, 128, dtype=q.dtype)[..., ::2]
    raises(ValueError, r"^out: expected unit stride", q, k, v, out=out)


def test_out_not_dlpack():
    raises(TypeError, r"^out: expected a DLPack tensor", *qkv(), out=object())


def test_requires_grad_with_out_not_implemented():
    q, k, v = qkv()
    q.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="q require grad.*out= is not differentiable"):
        flashcute.attention(q, k, v, out=torch.empty_like(q))
    with torch.no_grad():  # no autograd wanted: only the device is wrong
        raises(ValueError, r"^q: expected a CUDA tensor", q, k, v, out=torch.empty_like(q))


def test_requires_grad_goes_through_the_custom_op_and_checks_device():
    q, k, v = qkv()
    q.requires_grad_(True)
    raises(ValueError, r"^q: expected a CUDA tensor", q, k, v)


def test_empty_sizes_pass_shape_checks():
    for sizes in (dict(batch=0), dict(seqlen_q=0), dict(seqlen_k=0), dict(nheads=0)):
        raises(ValueError, r"^q: expected a CUDA tensor", *qkv(**sizes))


def test_window_and_softcap_are_checked_before_the_tensors():
    q, k, v = qkv(dtype=torch.float32)  # a dtype error, reported after them
    raises(ValueError, r"^window: each side must be -1 \(unbounded\) or >= 0, got \(-2, 0\)",
           q, k, v, window=(-2, 0))
    raises(TypeError, r"^window: expected a pair \(left, right\) of ints", q, k, v,
           window=(1.5, 0))
    raises(ValueError, r"^softcap: expected a finite float >= 0", q, k, v, softcap=-3.0)
    raises(TypeError, r"^softcap: expected a float, got bool", q, k, v, softcap=True)


def test_softcap_against_the_scale_is_checked_before_the_device():
    q, k, v = qkv()
    raises(ValueError, r"^softcap: 1e\+20 does not work with softmax_scale 1e-30", q, k, v,
           softcap=1e20, softmax_scale=1e-30)
    raises(ValueError, r"^softcap: 1e-50 does not work with softmax_scale 0.125", q, k, v,
           softcap=1e-50)  # the default scale of head dim 64
    for good in (dict(softcap=50.0), dict(softcap=1e-30, softmax_scale=1e-30),
                 dict(window=(3, 0), causal=True), dict(window=(0, 0), softcap=0.0)):
        raises(ValueError, r"^q: expected a CUDA tensor", q, k, v, **good)


# ---------------------------------------------------------------------------------------
# attention_backward


def bwd_args(headdim=64, **sizes):
    q, k, v = qkv(headdim=headdim, **sizes)
    batch, seqlen_q, nheads, _ = q.shape
    lse = torch.zeros(batch, nheads, seqlen_q, dtype=torch.float32)
    return torch.zeros_like(q), q, k, v, torch.zeros_like(q), lse


def bwd_raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        flashcute.attention_backward(*args, **kwargs)


def test_backward_valid_cpu_inputs_fail_only_on_device():
    bwd_raises(ValueError, r"^q: expected a CUDA tensor", *bwd_args())


@pytest.mark.parametrize("name, index", [("dout", 0), ("out", 4)])
def test_backward_q_shaped_args(name, index):
    args = list(bwd_args())
    args[index] = args[index][:, :-1]
    which = "out" if name == "out" else "dout"
    bwd_raises(ValueError, rf"^{which}: expected shape", *args)


def test_backward_lse_checked():
    args = list(bwd_args())
    args[5] = args[5].to(torch.float16)
    bwd_raises(ValueError, r"^lse: expected the forward's float32", *args)
    args[5] = torch.zeros(2, 4, 6)
    bwd_raises(ValueError, r"^lse: expected the forward's float32", *args)


def test_backward_dout_dtype():
    args = list(bwd_args())
    args[0] = args[0].to(torch.bfloat16)
    bwd_raises(TypeError, r"^dout: dtype bfloat16 does not match q's dtype float16", *args)


@pytest.mark.parametrize("name", ["dq", "dk", "dv"])
def test_backward_grad_buffers_checked(name):
    args = bwd_args()
    like = args[1] if name == "dq" else args[2]
    bwd_raises(ValueError, rf"^{name}: expected shape", *args, **{name: like[:, :1]})
    bwd_raises(TypeError, rf"^{name}: dtype", *args, **{name: like.to(torch.bfloat16)})


def test_backward_scalars():
    bwd_raises(TypeError, r"^deterministic: expected a bool", *bwd_args(), deterministic=1)
    bwd_raises(TypeError, r"^causal: expected a bool", *bwd_args(), causal=None)
    bwd_raises(ValueError, r"^softmax_scale: expected a finite positive", *bwd_args(),
               softmax_scale=-1.0)
    bwd_raises(ValueError, r"^backend: expected None, 'ampere' or 'hopper'", *bwd_args(),
               backend="cuda")


def test_backward_window_and_softcap():
    bwd_raises(ValueError, r"^window: ", *bwd_args(), window=(0, -2))
    bwd_raises(TypeError, r"^window: ", *bwd_args(), window=(0, True))
    bwd_raises(ValueError, r"^softcap: ", *bwd_args(), softcap=float("nan"))
    bwd_raises(ValueError, r"^softcap: .*softmax_scale", *bwd_args(), softcap=2.0**127,
               softmax_scale=1.0)
    bwd_raises(ValueError, r"^q: expected a CUDA tensor", *bwd_args(), window=(4, 0),
               softcap=30.0)


def test_backward_needs_allocating_framework():
    np = pytest.importorskip("numpy")
    args = [np.zeros(tuple(x.shape), dtype=np.float32) for x in bwd_args()]
    bwd_raises(TypeError, r"^q: flashcute can allocate gradients", *args)


def test_backward_hopper_refuses_deterministic():
    from flashcute._dispatch import choose_backward_backend

    with pytest.raises(ValueError, match=r"^backend='hopper': .*deterministic=True"):
        choose_backward_backend("hopper", 90, headdim=128, dtype="bfloat16", deterministic=True)


def test_backward_hopper_needs_sm90():
    from flashcute._dispatch import choose_backward_backend

    with pytest.raises(ValueError, match=r"^backend='hopper': requires an sm90 GPU, this is sm80"):
        choose_backward_backend("hopper", 80, headdim=128, dtype="bfloat16")

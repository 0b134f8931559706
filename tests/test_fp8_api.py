"""FP8 attention's argument checks, without a GPU: the checks that run before the extension
(dtypes, training, dropout, ``dtype=``) through ``flashcute.attention``, and the descale, out
and dtype checks of ``_validate_fp8`` on described tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute._validate import _Info  # noqa: E402
from flashcute._validate_fp8 import (  # noqa: E402
    FP8_BLOCK,
    check_descales,
    check_dtype_arg,
    check_input_dtypes,
    check_out,
    fp8_dtype_name,
)
from flashcute.fp8 import is_fp8_call  # noqa: E402


def _fp8(*shape, dtype=torch.float8_e4m3fn):
    return torch.zeros(*shape).to(dtype)


def _info(name, shape, dtype="float32"):
    strides = []
    step = 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return _Info(name, 2, 0, dtype, tuple(shape), tuple(strides))


def test_fp8_block_is_128_everywhere():
    from flashcute import reference_fp8

    assert FP8_BLOCK == reference_fp8.FP8_BLOCK == 128


def test_route_is_taken_for_float8_or_dtype_only():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    assert not is_fp8_call(q, q, q, None)
    assert is_fp8_call(_fp8(1, 4, 2, 64), q, q, None)
    assert is_fp8_call(q, q, q, "float8_e4m3fn")
    assert fp8_dtype_name(_fp8(2)) == "float8_e4m3fn"
    assert fp8_dtype_name(torch.zeros(2)) is None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"deterministic": True}, NotImplementedError, "deterministic: FP8"),
        ({"dropout_p": 0.1}, ValueError, "dropout_p: FP8"),
        ({"dtype": "float8_e5m2"}, ValueError, "dtype: expected None or 'float8_e4m3fn'"),
        ({"dtype": 8}, TypeError, "dtype: expected None"),
    ],
)
def test_refusals_before_the_extension(kwargs, error, match):
    q = _fp8(1, 4, 2, 64)
    with pytest.raises(error, match=match):
        flashcute.attention(q, q, q, **kwargs)


def test_autograd_is_refused():
    q8 = _fp8(1, 4, 2, 64)
    with pytest.raises(NotImplementedError, match="no backward yet"):
        flashcute.attention(q8, q8, _fp8(1, 4, 2, 64).requires_grad_(True))
    with torch.no_grad():  # past the refusal: the next check is the extension's
        try:
            flashcute.attention(q8, q8, _fp8(1, 4, 2, 64).requires_grad_(True))
        except NotImplementedError:
            pytest.fail("no_grad calls are not training")
        except Exception:
            pass


def test_mixed_and_e5m2_inputs_name_the_argument():
    q = _fp8(1, 4, 2, 64)
    with pytest.raises(TypeError, match="k: expected float8_e4m3fn"):
        flashcute.attention(q, q.to(torch.bfloat16), q)
    with pytest.raises(TypeError, match="v: float8_e5m2 is unsupported"):
        flashcute.attention(q, q, _fp8(1, 4, 2, 64, dtype=torch.float8_e5m2))


def test_descales_need_fp8_inputs():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="k_descale: only float8_e4m3fn inputs take descales"):
        flashcute.attention(q, q, q, k_descale=torch.ones(1, 2))


def test_dtype_arg():
    assert check_dtype_arg(None) is None
    assert check_dtype_arg("float8_e4m3fn") == "float8_e4m3fn"


def test_input_dtypes():
    ok = [_info(n, (1, 4, 2, 64), "float8_e4m3fn") for n in "qkv"]
    check_input_dtypes(ok, uint8_bytes=False)
    check_input_dtypes([_info(n, (1, 4, 2, 64), "uint8") for n in "qkv"], uint8_bytes=True)
    with pytest.raises(TypeError, match="v: expected uint8"):
        check_input_dtypes([_info("q", (1,), "uint8"), _info("k", (1,), "uint8"), _info("v", (1,), "bfloat16")], True)
    with pytest.raises(TypeError, match="k: float8_e5m2 is unsupported"):
        check_input_dtypes([ok[0], _info("k", (1,), "float8_e5m2"), ok[2]], False)


def test_out():
    assert check_out(_info("out", (1, 4, 2, 64), "float16"), (1, 4, 2, 64)) == "float16"
    with pytest.raises(TypeError, match="out: expected bfloat16 or float16"):
        check_out(_info("out", (1, 4, 2, 64), "float32"), (1, 4, 2, 64))
    with pytest.raises(ValueError, match="out: expected shape"):
        check_out(_info("out", (1, 4, 2, 32), "bfloat16"), (1, 4, 2, 64))


def _descales(q=None, k=None, v=None, varlen=False, **sizes):
    call = dict(batch=2, nheads=8, nheads_kv=2, seqlen_q=300, seqlen_k=129, varlen=varlen)
    call.update(sizes)
    return check_descales(lambda name, x: x, q, k, v, **call)


def test_descale_modes():
    modes, infos = _descales(_info("q_descale", (2, 8)), _info("k_descale", (2, 2)), None)
    assert (modes.q, modes.k, modes.v) == ("head", "head", None) and len(infos) == 2
    modes, _ = _descales(_info("q_descale", (2, 2)))  # FlashAttention-3's (batch, nheads_kv)
    assert modes.q == "head"
    modes, _ = _descales(_info("q_descale", (2, 8, 3)), _info("k_descale", (2, 2, 2)), _info("v_descale", (2, 2, 2)))
    assert (modes.q, modes.k, modes.v) == ("block", "block", "block")


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((_info("q_descale", (2, 8), "float16"),), TypeError, "q_descale: expected float32"),
        ((_info("q_descale", (2, 3)),), ValueError, r"q_descale: expected shape \(2, 8\) or \(2, 2\)"),
        ((_info("q_descale", (3, 8)),), ValueError, "q_descale: expected shape"),
        ((None, _info("k_descale", (2, 8))), ValueError, "k_descale: expected shape"),
        ((None, _info("k_descale", (2, 2, 1))), ValueError, r"k_descale: expected shape .*\(2, 2, 2\)"),
        ((_info("q_descale", (2, 8, 3)), _info("k_descale", (2, 2, 2))), ValueError, "v_descale: missing"),
        ((_info("q_descale", (2, 8, 3)),), ValueError, "k_descale, v_descale: missing"),
    ],
)
def test_descale_errors(args, error, match):
    with pytest.raises(error, match=match):
        _descales(*args)


def test_block_descale_offsets_fit_32_bits():
    """K's and V's block descales are addressed with 32-bit products: a view whose last block
    lies 2**31 elements or more from its head's start is refused; the same shape, contiguous, and
    a q descale with the same stride are not."""
    k = _info("k_descale", (2, 2, 2))
    q = _info("q_descale", (2, 8, 3))
    v = _info("v_descale", (2, 2, 2))
    _descales(q, k, v)
    wide = _Info("v_descale", 2, 0, "float32", (2, 2, 2), (4, 2, 2**31))
    with pytest.raises(ValueError, match=r"v_descale: block stride 2147483648 puts block 1 at element"):
        _descales(q, k, wide)
    edge = _Info("k_descale", 2, 0, "float32", (2, 2, 2), (4, 2, 2**31 - 1))
    _descales(q, edge, v)
    _descales(_Info("q_descale", 2, 0, "float32", (2, 8, 3), (24, 3, 2**31)), k, v)


def test_varlen_descales_are_per_head():
    modes, _ = _descales(_info("k_descale", (2, 2)), varlen=True)
    with pytest.raises(ValueError, match="variable-length batches take per-head descales"):
        _descales(_info("q_descale", (2, 8, 3)), _info("k_descale", (2, 2, 2)), _info("v_descale", (2, 2, 2)),
                  varlen=True)

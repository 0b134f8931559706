"""Dropout on the CPU: ``flashcute.testing``'s Philox against the Random123 known-answer vectors
and the keep rate, the binding's keep bits against ``dropout_keep_mask``, the argument checks on
every route, and what each route hands the extension (the seed and offset, or the rng state
drawn from torch's generator, the same in the forward and its backward).

As in test_window_softcap_api.py, a recording extension stands in for the compiled one and CPU
tensors pass the device check: no kernel runs. What the kernels compute with dropout is checked
on a GPU (tests/test_gpu_dropout.py).
"""

from __future__ import annotations

import inspect
import math
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
import flashcute.testing  # noqa: E402
from flashcute import _build_info, _torch_direct, _torch_ops, _torch_varlen  # noqa: E402
from flashcute import _validate, _validate_backward  # noqa: E402
from flashcute._dropout import SEED_LIMIT, check_dropout  # noqa: E402
from flashcute.testing import dropout_keep_mask, dropout_threshold, philox4x32_10  # noqa: E402

from test_varlen_api import VarlenRecordingExtension, _packed, _values, installed  # noqa: E402
from test_window_softcap_api import _bwd_args, _qkv  # noqa: E402

# ---------------------------------------------------------------------------------------------
# flashcute.testing: Philox4x32-10 and the keep mask.

# Random123's known-answer vectors for philox4x32_10: (counter, key) -> output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT, ids=["zeros", "ones", "pi"])
def test_philox_known_answers(counter, key, expected):
    words = philox4x32_10(tuple(torch.tensor([c], dtype=torch.int64) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


def test_philox_on_many_counters_matches_one_at_a_time():
    gen = torch.Generator().manual_seed(0)
    counters = [torch.randint(0, 2**32, (64,), generator=gen) for _ in range(4)]
    key = (0x12345678, 0x9ABCDEF0)
    batched = philox4x32_10(tuple(counters), key)
    for i in (0, 17, 63):
        single = philox4x32_10(tuple(c[i:i + 1] for c in counters), key)
        assert [int(w[i]) for w in batched] == [int(w) for w in single]


def test_exported_as_a_module():
    assert flashcute.testing is __import__("flashcute.testing").testing
    assert "testing" in flashcute.__all__ and "dropout_rng_state" in flashcute.__all__
    assert callable(flashcute.testing.dropout_keep_mask)


def test_testing_attribute_without_importing_it():
    """After a plain ``import flashcute``, ``flashcute.testing`` is the testing module (not the
    reference), imported on first use."""
    import subprocess
    import sys

    code = ("import flashcute; t = flashcute.testing; "
            "assert t.__name__ == 'flashcute.testing', t.__name__; "
            "assert callable(t.dropout_keep_mask); "
            "assert flashcute.reference.__name__ == 'flashcute.reference'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_keep_rate_is_binomial(p):
    """The fraction kept over 2·3·96·80 weights is 1 - threshold / 65536 within 5 standard
    deviations, for several seeds; each (batch, head) slice keeps its own share."""
    keep = 1.0 - dropout_threshold(p) / 65536.0
    for seed, offset in ((0, 0), (2**40 + 7, 3), (12345, 2**33 + 1)):
        mask = dropout_keep_mask(2, 3, 96, 80, p, seed, offset)
        n = mask.numel()
        sigma = math.sqrt(keep * (1 - keep) / n)
        assert abs(mask.float().mean().item() - keep) < 5 * sigma
        per_slice = mask.flatten(2).float().mean(-1)
        sigma_slice = math.sqrt(keep * (1 - keep) / (96 * 80))
        assert (per_slice - keep).abs().max().item() < 5 * sigma_slice


def test_mask_depends_on_every_input():
    base = dropout_keep_mask(2, 2, 24, 40, 0.5, 1, 2)
    assert torch.equal(base, dropout_keep_mask(2, 2, 24, 40, 0.5, 1, 2))  # a function
    for seed, offset in ((2, 2), (1, 3), (1 + 2**32, 2), (1, 2 + 2**32)):
        other = dropout_keep_mask(2, 2, 24, 40, 0.5, seed, offset)
        assert (other != base).float().mean().item() > 0.3
    # Slices differ, and a sub-problem's mask is the whole problem's corner.
    assert (base[0, 0] != base[1, 1]).float().mean().item() > 0.3
    assert torch.equal(dropout_keep_mask(1, 2, 10, 17, 0.5, 1, 2)[0], base[0, :, :10, :17])
    assert dropout_keep_mask(1, 1, 4, 4, 0.0, 5, 6).all()
    assert dropout_threshold(2.0**-18) == 0 and dropout_threshold(0.99999999) == 65535


def test_keep_mask_argument_checks():
    with pytest.raises(ValueError, match=r"^dropout_p: "):
        dropout_keep_mask(1, 1, 4, 4, 1.0, 0, 0)
    with pytest.raises(ValueError, match=r"^seed: "):
        dropout_keep_mask(1, 1, 4, 4, 0.5, -1, 0)
    with pytest.raises(ValueError, match=r"^offset: "):
        dropout_keep_mask(1, 1, 4, 4, 0.5, 0, 2**64)
    with pytest.raises(ValueError, match=r"^seqlen_k: "):
        dropout_keep_mask(1, 1, 4, -4, 0.5, 0, 0)


@pytest.mark.parametrize("args, error, match", [
    ((2**63, 0), ValueError, r"^seed: expected an int in \[0, 2\*\*63\)"),
    ((0, 2**63), ValueError, r"^offset: expected an int in \[0, 2\*\*63\)"),
    ((-1, 0), ValueError, r"^seed: "),
    ((1.0, 0), TypeError, r"^seed: "),
    ((True, 0), TypeError, r"^seed: "),
    ((None, 0), TypeError, r"^seed: "),
    ((0, "1"), TypeError, r"^offset: "),
])
def test_keep_mask_takes_the_front_doors_seed_range(args, error, match):
    """seed and offset as dropout_seed and dropout_offset: ints in [0, 2**63), named."""
    with pytest.raises(error, match=match):
        dropout_keep_mask(1, 1, 4, 4, 0.5, *args)
    with pytest.raises(error, match=match):
        flashcute.testing.keep_mask_slices([0], 4, 4, 0.5, *args)
    for seed, offset in ((SEED_LIMIT - 1, SEED_LIMIT - 1), (np.int64(5), np.uint32(6))):
        check_dropout(0.5, seed, offset, None, draws=False)  # the front doors take these too
        assert dropout_keep_mask(1, 1, 4, 4, 0.5, seed, offset).shape == (1, 1, 4, 4)


def test_keep_mask_names_bad_sizes_and_p():
    with pytest.raises(TypeError, match=r"^batch: "):
        dropout_keep_mask(2.0, 1, 4, 4, 0.5, 0, 0)
    with pytest.raises(TypeError, match=r"^dropout_p: "):
        dropout_keep_mask(1, 1, 4, 4, "0.5", 0, 0)
    with pytest.raises(TypeError, match=r"^dropout_p: "):
        dropout_threshold(None)


def test_keep_mask_slices_match_the_whole_mask(monkeypatch):
    """Any (batch, head) slices, computed a few rows at a time, are the whole mask's."""
    whole = dropout_keep_mask(2, 3, 21, 35, 0.3, 2**62 + 9, 2**40 + 1)
    monkeypatch.setattr(flashcute.testing, "_BLOCK_CELLS", 40)  # blocks of one row
    got = flashcute.testing.keep_mask_slices([5, 0, 3], 21, 35, 0.3, 2**62 + 9, 2**40 + 1)
    assert torch.equal(got, whole.view(6, 21, 35)[[5, 0, 3]])
    assert torch.equal(dropout_keep_mask(2, 3, 21, 35, 0.3, 2**62 + 9, 2**40 + 1), whole)
    assert flashcute.testing.keep_mask_slices([1], 3, 5, 0.0, 1, 2).all()


# ---------------------------------------------------------------------------------------------
# The binding's keep bits (flashcute::Dropout, as the kernels build it) against the mask.


def _keep_bits_hook():
    ext = pytest.importorskip("flashcute._C")
    if not hasattr(ext, "_dropout_keep_bits"):
        pytest.skip("this build of flashcute._C predates dropout")
    return ext._dropout_keep_bits


def _bit(row: int, key: int) -> int:
    """The bit of weight (row, key) in its group's keep bits (cpp/dropout.h)."""
    return 4 * (row >> 3 & 1) + 2 * (key >> 3 & 1) + (key & 1)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.875])
def test_binding_keep_bits_match_the_mask(p):
    keep_bits = _keep_bits_hook()
    rng = random.Random(7)
    batch, nheads, seqlen_q, seqlen_k = 2, 3, 37, 45
    for _ in range(3):
        seed, offset = rng.randrange(SEED_LIMIT), rng.randrange(SEED_LIMIT)
        mask = dropout_keep_mask(batch, nheads, seqlen_q, seqlen_k, p, seed, offset)
        got = torch.tensor([
            [[keep_bits(i, j, bh, seed, offset, p) >> _bit(i, j) & 1 for j in range(seqlen_k)]
             for i in range(seqlen_q)] for bh in range(batch * nheads)
        ], dtype=torch.bool)
        assert torch.equal(got, mask.view(batch * nheads, seqlen_q, seqlen_k))


def test_binding_keep_bits_at_random_coordinates():
    """Far coordinates (rows and keys past 2^16, large slices), against the mask of a window
    around them built from the same Philox words: each group's 8 bits at once."""
    keep_bits = _keep_bits_hook()
    rng = random.Random(11)
    for _ in range(40):
        row, key, bh = rng.randrange(2**20), rng.randrange(2**20), rng.randrange(2**16)
        seed, offset, p = rng.randrange(2**64), rng.randrange(2**64), rng.choice([0.05, 0.3, 0.7])
        key_group = (key >> 4 << 2) | (key >> 1 & 3)
        row_group = (row >> 4 << 3) | (row & 7)
        words = philox4x32_10(
            tuple(torch.tensor([c], dtype=torch.int64) for c in (key_group, row_group, bh, offset & 0xFFFFFFFF)),
            (seed & 0xFFFFFFFF, ((seed >> 32) ^ (offset >> 32)) & 0xFFFFFFFF),
        )
        threshold = dropout_threshold(p)
        expected = 0
        for e in range(8):
            word = int(words[e >> 1])
            value = word >> 16 if e & 1 else word & 0xFFFF
            expected |= int(value >= threshold) << e
        assert keep_bits(row, key, bh, seed, offset, p) == expected
    assert keep_bits(5, 9, 3, 1, 2, 0.0) == 0xFF  # p = 0 keeps everything


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dropout_p=1.5), ValueError, r"^dropout_p: expected a value in \[0, 1\)"),
    (dict(dropout_p=math.nan), ValueError, r"^dropout_p: "),
    (dict(dropout_p=0.1, dropout_rng_state=torch.zeros(2, dtype=torch.int32)), TypeError,
     r"^dropout_rng_state: expected int64"),
    (dict(dropout_p=0.1, dropout_rng_state=torch.zeros(3, dtype=torch.int64)), ValueError,
     r"^dropout_rng_state: expected a contiguous tensor of shape \(2,\)"),
], ids=["p>1", "nan", "int32", "shape"])
def test_binding_refuses_bad_dropout(kwargs, error, match):
    """The binding and the C++ layer check dropout again (for callers of the extension)."""
    from torch.utils.dlpack import to_dlpack

    _keep_bits_hook()  # a build with dropout
    ext = pytest.importorskip("flashcute._C")
    kwargs = {k: to_dlpack(x) if isinstance(x, torch.Tensor) else x for k, x in kwargs.items()}
    q, k, v = _qkv()
    out = torch.empty_like(q)
    with pytest.raises(error, match=match):
        ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), None, 0.125, False,
                    ext.BACKEND_AMPERE, 0, None, -1, -1, 0.0, None, **kwargs)


# ---------------------------------------------------------------------------------------------
# A recording extension with the binding's dropout keywords.


class DropoutRecordingExtension(VarlenRecordingExtension):
    """VarlenRecordingExtension that records the dropout keywords of each launch."""

    def forward(self, *args, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
                dropout_rng_state=None, **kwargs):
        """forward(..., cu_seqlens_q, ..., dropout_p, dropout_seed, dropout_offset, dropout_rng_state)"""
        super().forward(*args, **kwargs)
        self.calls[-1][1].update(_dropout_record(dropout_p, dropout_seed, dropout_offset,
                                                 dropout_rng_state))

    def forward_workspace_size(self, *args, dropout=False, **kwargs):
        """forward_workspace_size(..., dropout): records whether the query says dropout is on."""
        size = super().forward_workspace_size(*args, **kwargs)
        self.calls[-1][1]["dropout"] = dropout
        return size

    def backward(self, *args, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
                 dropout_rng_state=None, **kwargs):
        super().backward(*args, **kwargs)
        self.calls[-1][1].update(_dropout_record(dropout_p, dropout_seed, dropout_offset,
                                                 dropout_rng_state))


def _dropout_record(p, seed, offset, state) -> dict:
    tensor = None if state is None else torch.from_dlpack(state)
    return dict(dropout_p=p, seed=seed, offset=offset,
                state=None if tensor is None else tensor.tolist(),
                state_ptr=None if tensor is None else tensor.data_ptr())


class _OldExtension(DropoutRecordingExtension):
    def forward(self, *args, **kwargs):
        """forward(q, k, v, out, lse, ..., cu_seqlens_q, ...): a build without dropout."""
        return super().forward(*args, **kwargs)


@pytest.fixture
def ext(monkeypatch):
    """A DropoutRecordingExtension in place of flashcute._C (test_varlen_api.installed)."""
    yield from installed(monkeypatch, DropoutRecordingExtension())


def _state(seed=3, offset=4):
    return torch.tensor([seed, offset], dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# Signatures


FUNCTIONS = [flashcute.attention, flashcute.attention_backward, flashcute.attention_varlen,
             flashcute.attention_varlen_backward]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_keywords_and_defaults(fn):
    params = inspect.signature(fn).parameters
    for name, default in (("dropout_p", 0.0), ("dropout_seed", None), ("dropout_offset", None),
                          ("dropout_rng_state", None)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default == default


def test_custom_op_schemas():
    for op in ("attention_forward", "attention_forward_out", "attention_backward",
               "attention_varlen_forward", "attention_varlen_forward_out",
               "attention_varlen_backward"):
        schema = str(getattr(torch.ops.flashcute, op).default._schema)
        for arg in ("float dropout_p=0.", "SymInt? dropout_seed=None", "SymInt? dropout_offset=None",
                    "Tensor? dropout_rng_state=None"):
            assert arg in schema, (op, schema)
    for op in ("attention_forward", "attention_varlen_forward"):
        schema = str(getattr(torch.ops.flashcute, op).default._schema)
        assert schema.endswith("-> (Tensor, Tensor, Tensor)"), schema
        assert torch.Tag.nondeterministic_seeded in getattr(torch.ops.flashcute, op).default.tags


# ---------------------------------------------------------------------------------------------
# Bad values on every route, named before anything else is looked at.

BAD_DROPOUT = [
    (dict(dropout_p=1.0), ValueError, r"^dropout_p: "),
    (dict(dropout_p=-0.1), ValueError, r"^dropout_p: "),
    (dict(dropout_p=math.nan), ValueError, r"^dropout_p: "),
    (dict(dropout_p=math.inf), ValueError, r"^dropout_p: "),
    (dict(dropout_p=10**400), ValueError, r"^dropout_p: "),
    (dict(dropout_p=True), TypeError, r"^dropout_p: "),
    (dict(dropout_p="0.1"), TypeError, r"^dropout_p: "),
    (dict(dropout_p=None), TypeError, r"^dropout_p: "),
    (dict(dropout_p=0.1, dropout_seed=-1, dropout_offset=0), ValueError, r"^dropout_seed: "),
    (dict(dropout_p=0.1, dropout_seed=2**63, dropout_offset=0), ValueError, r"^dropout_seed: "),
    (dict(dropout_p=0.1, dropout_seed=1.0, dropout_offset=0), TypeError, r"^dropout_seed: "),
    (dict(dropout_p=0.1, dropout_seed=True, dropout_offset=0), TypeError, r"^dropout_seed: "),
    (dict(dropout_p=0.1, dropout_seed=1, dropout_offset=-5), ValueError, r"^dropout_offset: "),
    (dict(dropout_p=0.1, dropout_seed=1, dropout_offset="2"), TypeError, r"^dropout_offset: "),
    (dict(dropout_p=0.1, dropout_seed=1), ValueError, r"^dropout_offset: "),
    (dict(dropout_p=0.1, dropout_offset=1), ValueError, r"^dropout_seed: "),
    (dict(dropout_p=0.1, dropout_seed=1, dropout_offset=2, dropout_rng_state=_state()), ValueError,
     r"^dropout_rng_state: "),
    (dict(dropout_p=0.1, dropout_rng_state=_state().int()), TypeError, r"^dropout_rng_state: expected int64"),
    (dict(dropout_p=0.1, dropout_rng_state=_state().double()), TypeError, r"^dropout_rng_state: expected int64"),
    (dict(dropout_p=0.1, dropout_rng_state=torch.zeros(3, dtype=torch.int64)), ValueError,
     r"^dropout_rng_state: expected shape \(2,\)"),
    (dict(dropout_p=0.1, dropout_rng_state=torch.zeros(2, 1, dtype=torch.int64)), ValueError,
     r"^dropout_rng_state: expected shape \(2,\)"),
    (dict(dropout_p=0.1, dropout_rng_state=torch.zeros(4, dtype=torch.int64)[::2]), ValueError,
     r"^dropout_rng_state: expected a contiguous"),
    (dict(dropout_p=0.1, dropout_rng_state=np.zeros(2, dtype=np.int64)), TypeError,
     r"^dropout_rng_state: expected a torch.Tensor"),
]
_BAD_IDS = [f"{i}-" + ",".join(f"{k}" for k in c[0] if k != "dropout_p") for i, c in enumerate(BAD_DROPOUT)]


def _routes(bad):
    """Every call that takes dropout arguments on torch tensors, with ``bad`` added; the
    routes that cannot draw a seed (backward, DLPack) get one unless ``bad`` says otherwise."""
    from flashcute.attention import attention_dlpack
    from flashcute.backward import attention_backward_dlpack

    q, k, v = _qkv()
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    grads = _bwd_args()
    packed_lse = torch.zeros(4, 8)
    keyed = ("dropout_seed", "dropout_offset", "dropout_rng_state")
    told = bad if any(key in bad for key in keyed) else {"dropout_seed": 1, "dropout_offset": 2, **bad}
    return {
        "direct": lambda: flashcute.attention(q, k, v, **bad),
        "out": lambda: flashcute.attention(q, k, v, out=torch.empty_like(q), **bad),
        "autograd": lambda: flashcute.attention(*_qkv(requires_grad=True), **bad),
        "backward": lambda: flashcute.attention_backward(*grads, **told),
        "varlen": lambda: flashcute.attention_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k, **bad),
        "varlen-autograd": lambda: flashcute.attention_varlen(*_packed(requires_grad=True), **bad),
        "varlen-backward": lambda: flashcute.attention_varlen_backward(
            torch.randn_like(pq), pq, pk, pv, torch.randn_like(pq), packed_lse, cu_q, cu_k, max_q,
            max_k, **told),
        "dlpack": lambda: attention_dlpack(q, k, v, **told),
        "backward-dlpack": lambda: attention_backward_dlpack(*grads, **told),
    }


@pytest.mark.parametrize("bad, error, match", BAD_DROPOUT, ids=_BAD_IDS)
def test_bad_dropout_arguments_are_named_on_every_route(ext, bad, error, match):
    for name, call in _routes(bad).items():
        if "rng_state: expected a torch" in match and "dlpack" in name:
            continue  # the DLPack routes take any framework's state
        with pytest.raises(error, match=match):
            call()
    assert ext.of("forward") == [] and ext.of("backward") == []


@pytest.mark.parametrize("bad, match", [
    (dict(dropout_p=1.0), "dropout_p: expected a float in"),
    (dict(dropout_p=0.5, dropout_seed=4), "dropout_offset: expected an int beside"),
    (dict(dropout_p=0.5, dropout_rng_state=torch.zeros(3, dtype=torch.int64)),
     r"dropout_rng_state: expected shape \(2,\)"),
])
def test_bad_dropout_arguments_are_named_while_compiling(ext, bad, match):
    q, k, v = _qkv()
    compiled = torch.compile(lambda q, k, v: flashcute.attention(q, k, v, **bad), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match=match):  # inside dynamo's own error
        compiled(q, k, v)
    assert ext.of("forward") == []


def test_bad_dropout_p_on_other_entry_points(ext):
    q, k, v = _qkv()
    for call in (
        lambda: _validate.validate_forward(q, k, v, dropout_p=1.5),
        lambda: _validate_backward.validate_backward(*_bwd_args(), dropout_p=-1.0),
        lambda: torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None, False, -1, -1,
                                                      0.0, None, 1.0),
        lambda: flashcute.flash_attn_func(q, k, v, 1.0),
        lambda: flashcute.flash_attn_varlen_func(*_packed(), dropout_p=-0.5),
    ):
        with pytest.raises(ValueError, match=r"^dropout_p: "):
            call()
    with pytest.raises(ValueError, match=r"^dropout_seed: "):
        torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None, False, -1, -1, 0.0, None,
                                              0.5, -3, 0)
    assert ext.of("forward") == []


def test_dlpack_and_backward_calls_need_the_seed(ext):
    """Only torch forwards draw a seed; DLPack forwards and every backward must be told."""
    from flashcute.attention import attention_dlpack

    q, k, v = _qkv()
    x = np.zeros((1, 4, 2, 64), dtype=np.float16)
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    for call in (
        lambda: attention_dlpack(q, k, v, dropout_p=0.1),
        lambda: flashcute.attention(x, x, x, out=x.copy(), dropout_p=0.1),
        lambda: flashcute.attention_backward(*_bwd_args(), dropout_p=0.1),
        lambda: flashcute.attention_varlen_backward(
            torch.randn_like(pq), pq, pk, pv, torch.randn_like(pq), torch.zeros(4, 8), cu_q, cu_k,
            max_q, max_k, dropout_p=0.1),
        lambda: torch.ops.flashcute.attention_backward(
            *_bwd_args(), False, 0.125, False, None, -1, -1, 0.0, None, 0.1),
    ):
        with pytest.raises(ValueError, match=r"^dropout_seed: dropout_p = 0.1 needs"):
            call()
    assert ext.of("forward") == [] and ext.of("backward") == []


def test_seed_range_and_unused_arguments():
    assert check_dropout(0.5, 0, SEED_LIMIT - 1, None, draws=False).offset == SEED_LIMIT - 1
    assert check_dropout(0.5, np.int64(5), np.uint32(6), None, draws=False).seed == 5
    # With dropout off the seed, offset and state are not needed, and unused.
    assert not check_dropout(0.0, None, None, None, draws=False).active
    assert check_dropout(0, 1, 2, None, draws=False).p == 0.0


def test_old_extension_is_named_only_with_dropout(monkeypatch, ext):
    old = _OldExtension()
    monkeypatch.setattr(_build_info, "_extension", old)
    q, k, v = _qkv()
    flashcute.attention(q, k, v)
    with pytest.raises(ImportError, match="no dropout"):
        flashcute.attention(q, k, v, dropout_p=0.1)


# ---------------------------------------------------------------------------------------------
# Plumbing: what reaches the extension.


def _dropout_of(call):
    return {k: call[k] for k in ("dropout_p", "seed", "offset", "state")}


def test_off_passes_no_dropout_keywords(ext):
    q, k, v = _qkv()
    flashcute.attention(q, k, v, dropout_p=0.0, dropout_seed=1, dropout_offset=2)
    assert _dropout_of(ext.of("forward")[0]) == dict(dropout_p=0.0, seed=0, offset=0, state=None)


def test_direct_route_draws_from_torchs_generator(ext):
    """No grad, nothing watching: each call draws a fresh (2,) int64 state in [0, 2**63) on
    q's device; torch.manual_seed reproduces the draws."""
    q, k, v = _qkv()
    torch.manual_seed(123)
    for _ in range(3):
        flashcute.attention(q, k, v, dropout_p=0.25)
    states = [c["state"] for c in ext.of("forward")]
    assert all(c["dropout_p"] == 0.25 for c in ext.of("forward"))
    assert len({tuple(s) for s in states}) == 3
    assert all(0 <= x < SEED_LIMIT for s in states for x in s)
    ext.calls.clear()
    torch.manual_seed(123)
    flashcute.attention(q, k, v, dropout_p=0.25)
    assert ext.of("forward")[0]["state"] == states[0]
    torch.manual_seed(123)
    assert flashcute.dropout_rng_state(q.device).tolist() == states[0]  # dropout_rng_state() draws the same


def test_explicit_seed_and_state_are_used_as_given(ext):
    q, k, v = _qkv()
    flashcute.attention(q, k, v, dropout_p=0.5, dropout_seed=2**62 + 1, dropout_offset=7)
    state = _state(11, 12)
    flashcute.attention(q, k, v, dropout_p=0.5, dropout_rng_state=state)
    first, second = ext.of("forward")
    assert _dropout_of(first) == dict(dropout_p=0.5, seed=2**62 + 1, offset=7, state=None)
    assert second["state"] == [11, 12] and second["state_ptr"] == state.data_ptr()


def test_autograd_backward_sees_the_forwards_state(ext):
    q, k, v = _qkv(requires_grad=True)
    flashcute.attention(q, k, v, dropout_p=0.2, causal=True).float().sum().backward()
    flashcute.attention(q, k, v, dropout_p=0.2, deterministic=True).float().sum().backward()
    (f1, f2), (b1, b2) = ext.of("forward"), ext.of("backward")
    assert f1["state"] != f2["state"]
    assert _dropout_of(b1) == _dropout_of(f1) and _dropout_of(b2) == _dropout_of(f2)
    assert b1["state_ptr"] == f1["state_ptr"] and b2["deterministic"]
    # Explicit seeds reach the backward too.
    ext.calls.clear()
    flashcute.attention(q, k, v, dropout_p=0.2, dropout_seed=5, dropout_offset=6).sum().backward()
    assert _dropout_of(ext.of("backward")[0]) == dict(dropout_p=0.2, seed=5, offset=6, state=None)


def test_backward_by_hand_with_a_drawn_state(ext):
    q, k, v = _qkv()
    state = flashcute.dropout_rng_state(q.device)
    out, lse = flashcute.attention(q, k, v, dropout_p=0.3, dropout_rng_state=state, return_lse=True)
    flashcute.attention_backward(torch.randn_like(q), q, k, v, out, lse, dropout_p=0.3,
                                 dropout_rng_state=state)
    (fwd,), (bwd,) = ext.of("forward"), ext.of("backward")
    assert fwd["state_ptr"] == bwd["state_ptr"] == state.data_ptr()
    assert state.dtype == torch.int64 and state.shape == (2,)


def test_custom_op_returns_the_drawn_state(ext):
    q, k, v = _qkv()
    out, lse, state = torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None, False,
                                                            -1, -1, 0.0, None, 0.5)
    assert state.shape == (2,) and state.dtype == torch.int64
    assert ext.of("forward")[0]["state"] == state.tolist()
    for extra in ((), (0.5, 3, 4), (0.5, None, None, _state())):
        _, _, none = torch.ops.flashcute.attention_forward(q, k, v, False, 0.125, None, False, -1,
                                                           -1, 0.0, None, *extra)
        assert none.shape == (0,)


def test_compiled_training_step_passes_one_state_per_step(ext):
    """torch.compile(fullgraph=True): the forward op draws the state, the backward op gets it;
    each step draws a new one; the out= op draws its own."""
    def step(q, k, v):
        return flashcute.attention(q, k, v, dropout_p=0.1, causal=True).float().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q, k, v = _qkv(requires_grad=True)
    for _ in range(2):
        compiled(q, k, v).backward()
    f1, f2 = ext.of("forward")
    b1, b2 = ext.of("backward")
    assert f1["state"] != f2["state"]
    assert (b1["state"], b2["state"]) == (f1["state"], f2["state"])
    assert b1["dropout_p"] == 0.1

    def with_out(q, k, v, out):
        return flashcute.attention(q, k, v, out=out, dropout_p=0.1, dropout_seed=8, dropout_offset=9)

    ext.calls.clear()
    q, k, v = _qkv()
    torch.compile(with_out, fullgraph=True, backend="eager")(q, k, v, torch.empty_like(q))
    assert _dropout_of(ext.of("forward")[0]) == dict(dropout_p=0.1, seed=8, offset=9, state=None)


def test_custom_ops_pass_opcheck_with_dropout(ext):
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    leaves = _qkv(requires_grad=True)
    for extra in ((0.3,), (0.3, 4, 5), (0.3, None, None, _state())):
        torch.library.opcheck(torch.ops.flashcute.attention_forward.default,
                              (*leaves, True, 0.125, None, False, -1, -1, 0.0, None, *extra),
                              test_utils=utils)
    grads = _bwd_args()
    torch.library.opcheck(torch.ops.flashcute.attention_backward.default,
                          (*grads, False, 0.125, False, None, -1, -1, 0.0, None, 0.3, None, None,
                           _state()), test_utils=("test_schema", "test_faketensor"))


def test_compiled_fakes_give_the_state_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in (q, k, v))
        _, _, drawn = torch.ops.flashcute.attention_forward(fq, fk, fv, False, 0.125, None, False,
                                                            -1, -1, 0.0, None, 0.5)
        _, _, none = torch.ops.flashcute.attention_forward(fq, fk, fv, False, 0.125, None)
    assert drawn.shape == (2,) and none.shape == (0,) and drawn.dtype == torch.int64


def test_varlen_routes(ext):
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    flashcute.attention_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k, dropout_p=0.4)
    flashcute.attention_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k, dropout_p=0.4,
                               dropout_seed=1, dropout_offset=2)
    d1, d2 = ext.of("forward")
    assert d1["dropout_p"] == 0.4 and len(d1["state"]) == 2
    assert _dropout_of(d2) == dict(dropout_p=0.4, seed=1, offset=2, state=None)
    ext.calls.clear()
    leaves = _packed(requires_grad=True)
    flashcute.attention_varlen(*leaves, dropout_p=0.4).float().sum().backward()
    (fwd,), (bwd,) = ext.of("forward"), ext.of("backward")
    assert bwd["state_ptr"] == fwd["state_ptr"] and bwd["dropout_p"] == 0.4
    assert fwd["cu_seqlens_q"] == bwd["cu_seqlens_q"] == _values(torch.utils.dlpack.to_dlpack(cu_q))

    ext.calls.clear()
    compiled = torch.compile(
        lambda q, k, v, cu_q, cu_k: flashcute.attention_varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.4).float().sum(),
        fullgraph=True, backend="aot_eager")
    compiled(*leaves[:5]).backward()
    (fwd,), (bwd,) = ext.of("forward"), ext.of("backward")
    assert bwd["state"] == fwd["state"] and len(fwd["state"]) == 2


def test_dlpack_route_takes_the_seed(ext):
    """numpy arrays (with out=) go through DLPack with the explicit seed and offset."""
    x = np.zeros((1, 4, 2, 64), dtype=np.float16)
    flashcute.attention(x, x, x, out=x.copy(), dropout_p=0.125, dropout_seed=3, dropout_offset=2**40)
    assert _dropout_of(ext.of("forward")[0]) == dict(dropout_p=0.125, seed=3, offset=2**40, state=None)


def test_flash_attn_funcs_pass_dropout(ext):
    q, k, v = _qkv(requires_grad=True)
    flashcute.flash_attn_func(q, k, v, 0.3, causal=True).float().sum().backward()
    (fwd,), (bwd,) = ext.of("forward"), ext.of("backward")
    assert fwd["dropout_p"] == bwd["dropout_p"] == 0.3 and fwd["state"] == bwd["state"]
    ext.calls.clear()
    flashcute.flash_attn_varlen_func(*_packed(), dropout_p=0.2)
    assert ext.of("forward")[0]["dropout_p"] == 0.2


# ---------------------------------------------------------------------------------------------
# The float64 reference with a dropout mask.


def test_reference_applies_the_mask_after_the_softmax():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, s, 4, 16, generator=gen, dtype=torch.float64) for s in (9, 13, 13))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: 4 query heads on 2
    p = 0.3
    mask = dropout_keep_mask(2, 4, 9, 13, p, 5, 6)
    out, lse = flashcute.reference.attention(q, k, v, causal=True, dropout_p=p, dropout_mask=mask,
                                             return_lse=True)
    plain, plain_lse = flashcute.reference.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(lse, plain_lse)  # lse is the softmax's, before dropout
    kr, vr = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
    scores = q.transpose(1, 2) @ kr.transpose(-1, -2) / 4.0
    causal = torch.ones(9, 13, dtype=torch.bool).tril(13 - 9)
    weights = scores.masked_fill(~causal, -math.inf).softmax(-1) * mask / (1 - p)
    torch.testing.assert_close(out, (weights @ vr).transpose(1, 2), rtol=1e-12, atol=1e-12)
    # A larger mask is cut to the lengths; all-kept scales by 1 / (1 - p).
    big = dropout_keep_mask(2, 4, 20, 30, p, 5, 6)
    assert torch.equal(flashcute.reference.attention(q, k, v, causal=True, dropout_p=p,
                                                     dropout_mask=big), out)
    ones = torch.ones(2, 4, 9, 13, dtype=torch.bool)
    torch.testing.assert_close(flashcute.reference.attention(q, k, v, dropout_p=0.5, dropout_mask=ones),
                               2 * flashcute.reference.attention(q, k, v))


def test_reference_varlen_takes_each_sequences_corner():
    gen = torch.Generator().manual_seed(4)
    lengths_q, lengths_k = [3, 0, 5], [4, 2, 6]
    q = torch.randn(8, 2, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(12, 2, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(12, 2, 16, generator=gen, dtype=torch.float64)
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12], dtype=torch.int32)
    mask = dropout_keep_mask(3, 2, 5, 6, 0.5, 9, 10)
    out = flashcute.reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True, dropout_p=0.5,
                                               dropout_mask=mask)
    for b in (0, 2):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        expected = flashcute.reference.attention(
            q[None, rows], k[None, keys], v[None, keys], causal=True, dropout_p=0.5,
            dropout_mask=mask[b:b + 1, :, :lengths_q[b], :lengths_k[b]])
        assert torch.equal(out[rows], expected[0])
    assert not torch.equal(out, flashcute.reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True))


def test_reference_refuses_bad_masks():
    q = torch.zeros(1, 4, 2, 8)
    for mask, error in ((torch.ones(1, 2, 4, 4), TypeError), (torch.ones(1, 2, 3, 4, dtype=torch.bool), ValueError),
                        (torch.ones(2, 4, 4, dtype=torch.bool), ValueError), ([[True]], TypeError)):
        with pytest.raises(error, match=r"^dropout_mask: "):
            flashcute.reference.attention(q, q, q, dropout_p=0.5, dropout_mask=mask)
    with pytest.raises(ValueError, match=r"^dropout_p: "):
        flashcute.reference.attention(q, q, q, dropout_p=1.0)


# ---------------------------------------------------------------------------------------------
# The benchmark's --dropout


def test_bench_dropout_feature_names_and_configs():
    import dataclasses

    from flashcute.bench import BenchConfig, BenchRow, feature_name, with_feature
    from flashcute.bench.grid import feature_label

    assert feature_name(dropout=0.1) == "dropout"
    assert feature_name((128, 0), 30.0, True, 0.1) == "window+softcap+alibi+dropout"
    assert feature_label(softcap=30.0, dropout=0.125) == "softcap=30+dropout=0.125"
    base = [BenchConfig("bf16", 128, True, 4096, 4, 16)]
    cfgs = with_feature(base, dropout=0.1, with_dense=True)
    assert [c.feature for c in cfgs] == ["dense", "dropout"]
    assert cfgs[1].dense() == base[0] and cfgs[1].key != base[0].key and "dropout=0.1" in cfgs[1].label
    for bad in (1.0, -0.5, True, "0.1"):
        with pytest.raises(ValueError, match="dropout"):
            with_feature(base, dropout=bad)
    rows = [BenchRow.from_config("flashcute-hopper", base[0], 500.0),
            BenchRow.from_config("flashcute-hopper", dataclasses.replace(base[0], dropout=0.1),
                                 450.0, bwd_tflops=300.0)]
    dicts = [r.to_dict() for r in rows]
    assert [d["feature"] for d in dicts] == ["dense", "dropout"]
    assert "dropout" not in dicts[0] and dicts[1]["dropout"] == 0.1


def test_bench_parse_dropout():
    from flashcute.bench import feature_skip_reason, parse_args

    assert parse_args([]).dropout == 0.0
    args = parse_args(["--dropout", "0.1", "--with-dense"])
    assert args.dropout == 0.1 and args.with_dense
    for bad in ("1", "-0.1", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--dropout", bad])
    with pytest.raises(SystemExit):
        parse_args(["--varlen", "equal", "--dropout", "0.1"])
    assert feature_skip_reason("flashcute-ampere", dropout=0.1) is None
    reason = feature_skip_reason("sdpa-cudnn", dropout=0.1)
    assert reason is not None and "dropout" in reason


def test_bench_forward_fn_passes_dropout(monkeypatch):
    import types

    from flashcute.bench import impls
    from flashcute.bench.grid import DROPOUT_SEED

    calls: list[dict] = []
    fake = types.SimpleNamespace(attention=lambda q, k, v, **kw: calls.append(kw) or q)
    monkeypatch.setattr(impls, "_import_flashcute", lambda: fake)
    q = k = v = torch.zeros(1, 4, 8, 16)
    impls.make_forward_fn("flashcute-hopper", q, k, v, True, dropout=0.2)()
    impls.make_forward_fn("flashcute-hopper", q, k, v, True)()
    seed, offset = DROPOUT_SEED
    assert calls == [dict(causal=True, backend="hopper", dropout_p=0.2, dropout_seed=seed,
                          dropout_offset=offset), dict(causal=True, backend="hopper")]
    with pytest.raises(ValueError, match="not timed with dropout"):
        impls.make_forward_fn("sdpa-flash", q, k, v, True, dropout=0.2)


def test_bench_reference_with_dropout_slices_like_the_whole():
    from flashcute.bench.grid import DROPOUT_SEED
    from flashcute.bench.timing import feature_reference, reference_output

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 9, 6, 16, generator=gen)
    k = torch.randn(2, 13, 2, 16, generator=gen)
    v = torch.randn(2, 13, 2, 16, generator=gen)
    mask = dropout_keep_mask(2, 6, 9, 13, 0.3, *DROPOUT_SEED)
    expected = flashcute.reference.attention(q, k, v, causal=True, dropout_p=0.3,
                                             dropout_mask=mask).float()
    for chunk_bytes in (1, 1 << 30):
        got = feature_reference(q, k, v, True, dropout=0.3, chunk_bytes=chunk_bytes)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reference_output(q, k, v, True, dropout=0.3), expected,
                               atol=1e-5, rtol=1e-5)
    plain = reference_output(q, k, v, True)
    assert (plain - expected).abs().max() > 1e-2


def test_flash_attn_functions_take_dropout_on_torch_tensors_only():
    """flash_attn_func and flash_attn_varlen_func take no seed: with dropout, other arrays (a
    numpy array here) get a ValueError naming dropout_p before anything else is checked."""
    np = pytest.importorskip("numpy")
    q = np.zeros((1, 8, 2, 64), dtype=np.float16)
    with pytest.raises(ValueError, match=r"^dropout_p: 0\.1 needs torch tensors here"):
        flashcute.flash_attn_func(q, q, q, 0.1)
    packed = np.zeros((8, 2, 64), dtype=np.float16)
    cu = np.array([0, 8], dtype=np.int32)
    with pytest.raises(ValueError, match=r"^dropout_p: 0\.1 needs torch tensors here"):
        flashcute.flash_attn_varlen_func(packed, packed, packed, cu, cu, 8, 8, 0.1)


# ---------------------------------------------------------------------------------------------
# Drawing after the checks, once per call; the backward's dropout checks, once per call.


class _PassThrough(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that changes nothing: calls under it take the custom-op route."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _bad_forward_calls():
    """Forward calls with dropout_p > 0 and no seed whose tensors fail a check (k's head dim),
    on each torch route; (name, call, expected message)."""
    q, k, v = _qkv()
    bad_k = torch.zeros(2, 8, 2, 32, dtype=torch.bfloat16)
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    bad_pk = torch.zeros(pk.shape[0], pk.shape[1], 32, dtype=torch.bfloat16)

    def under_mode():
        with _PassThrough():
            flashcute.attention(q, bad_k, v, dropout_p=0.5)

    def varlen_under_mode():
        with _PassThrough():
            flashcute.attention_varlen(pq, bad_pk, pv, cu_q, cu_k, max_q, max_k, dropout_p=0.5)

    gq, gk, gv = _qkv(requires_grad=True)
    vq, vk, vv, *rest = _packed(requires_grad=True)
    return [
        ("direct", lambda: flashcute.attention(q, bad_k, v, dropout_p=0.5)),
        ("out", lambda: flashcute.attention(q, bad_k, v, out=torch.empty_like(q), dropout_p=0.5)),
        ("out-bad", lambda: flashcute.attention(q, k, v, out=torch.empty(1), dropout_p=0.5)),
        ("autograd", lambda: flashcute.attention(gq, bad_k, gv, dropout_p=0.5)),
        ("custom-op", under_mode),
        ("varlen", lambda: flashcute.attention_varlen(pq, bad_pk, pv, cu_q, cu_k, max_q, max_k,
                                                      dropout_p=0.5)),
        ("varlen-autograd", lambda: flashcute.attention_varlen(vq, bad_pk, vv, *rest,
                                                               dropout_p=0.5)),
        ("varlen-custom-op", varlen_under_mode),
    ]


@pytest.mark.parametrize("index", range(8), ids=[c[0] for c in _bad_forward_calls()])
def test_a_call_that_fails_a_check_draws_nothing(ext, index):
    """Bad tensors with dropout_p > 0 raise before the rng state is drawn: torch's generator
    is left as it was (the draw would be on q's device, the CPU here)."""
    _, call = _bad_forward_calls()[index]
    before = torch.random.get_rng_state()
    with pytest.raises((TypeError, ValueError)):
        call()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert ext.of("forward") == []


def test_a_good_call_draws_once_and_keeps_one_plan(ext):
    """A call that passes its checks draws one state (as dropout_rng_state() does after the
    same seed), and the signature checked before the draw is the one the launch finds."""
    q, k, v = _qkv()
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    for call in (lambda: flashcute.attention(q, k, v, dropout_p=0.5),
                 lambda: flashcute.attention_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k,
                                                    dropout_p=0.5)):
        _torch_direct._plans.clear()
        ext.calls.clear()
        torch.manual_seed(9)
        call()
        call()
        after = torch.random.get_rng_state()
        torch.manual_seed(9)
        first = flashcute.dropout_rng_state(q.device).tolist()
        flashcute.dropout_rng_state(q.device)
        assert torch.equal(torch.random.get_rng_state(), after)
        assert ext.of("forward")[0]["state"] == first
        assert len(_torch_direct._plans) == 1


def test_each_route_looks_for_a_state_at_most_once(ext, monkeypatch):
    """The routes draw in the front door: ``rng_state_for`` runs at most once a call (in a
    custom op, which then finds the state given)."""
    from flashcute import _dropout, _torch_autograd

    counted = []

    def counting(q, dropout, given):
        counted.append(given)
        return _dropout.rng_state_for(q, dropout, given)

    for module in (_torch_ops, _torch_varlen, _torch_autograd):
        monkeypatch.setattr(module, "rng_state_for", counting, raising=False)
    q, k, v = _qkv()
    gq, gk, gv = _qkv(requires_grad=True)
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()

    def under_mode():
        with _PassThrough():
            flashcute.attention(q, k, v, dropout_p=0.5)

    for call in (lambda: flashcute.attention(q, k, v, dropout_p=0.5),
                 lambda: flashcute.attention(gq, gk, gv, dropout_p=0.5),
                 lambda: flashcute.attention(q, k, v, out=torch.empty_like(q), dropout_p=0.5),
                 under_mode,
                 lambda: flashcute.attention_varlen(pq, pk, pv, cu_q, cu_k, max_q, max_k,
                                                    dropout_p=0.5),
                 lambda: flashcute.attention_varlen(*_packed(requires_grad=True), dropout_p=0.5)):
        counted.clear()
        call()
        assert len(counted) <= 1 and all(given is not None for given in counted)


def test_backward_checks_dropout_once(ext, monkeypatch):
    """attention_backward and attention_varlen_backward check their dropout arguments once,
    on the direct route and on the DLPack route (a dispatch mode watching)."""
    from flashcute import backward, varlen

    counted = []

    def counting(*args, **kwargs):
        counted.append(args)
        return check_dropout(*args, **kwargs)

    for module in (backward, varlen):
        monkeypatch.setattr(module, "check_dropout", counting)
    state = _state()
    grads = _bwd_args()
    pq, pk, pv, cu_q, cu_k, max_q, max_k = _packed()
    packed = (torch.randn_like(pq), pq, pk, pv, torch.randn_like(pq),
              torch.zeros(pq.shape[1], pq.shape[0]), cu_q, cu_k, max_q, max_k)
    for call in (lambda: flashcute.attention_backward(*grads, dropout_p=0.5,
                                                      dropout_rng_state=state),
                 lambda: flashcute.attention_varlen_backward(*packed, dropout_p=0.5,
                                                             dropout_rng_state=state)):
        for watched in (False, True):
            counted.clear()
            if watched:
                with _PassThrough():
                    call()
            else:
                call()
            assert len(counted) == 1
    assert len(ext.of("backward")) == 4


# ---------------------------------------------------------------------------------------------
# The forward's workspace query


def test_workspace_query_knows_dropout(ext):
    """Dropout turns off packed query heads, whose split plan (and workspace) differs: the
    query says whether dropout is on, on the torch and DLPack routes."""
    from flashcute.attention import attention_dlpack

    q, k, v = _qkv()
    flashcute.attention(q, k, v)
    flashcute.attention(q, k, v, dropout_p=0.1, dropout_seed=1, dropout_offset=2)
    attention_dlpack(q, k, v, dropout_p=0.3, dropout_seed=1, dropout_offset=2)
    attention_dlpack(q, k, v)
    assert [c["dropout"] for c in ext.of("forward_workspace_size")] == [False, True, True, False]

"""Which torch calls go through the custom op and which launch the kernel directly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashcute._C")

from flashcute import _torch_ops  # noqa: E402


def _qkv(requires_grad: bool = False):
    return [torch.zeros(1, 4, 2, 64, requires_grad=requires_grad) for _ in range(3)]


def test_plain_tensors_skip_the_custom_op():
    assert not _torch_ops._needs_custom_op(*_qkv())


def test_inputs_that_require_grad_use_the_custom_op():
    q, k, v = _qkv()
    v.requires_grad_(True)
    assert _torch_ops._needs_custom_op(q, k, v)
    with torch.no_grad():
        assert not _torch_ops._needs_custom_op(q, k, v)


def test_dispatch_modes_use_the_custom_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    with FakeTensorMode():
        assert _torch_ops._needs_custom_op(q, k, v)


def test_tensor_subclasses_use_the_custom_op():
    class Tagged(torch.Tensor):
        pass

    q, k, v = _qkv()
    assert _torch_ops._needs_custom_op(q.as_subclass(Tagged), k, v)


def test_functorch_transforms_use_the_custom_op():
    seen = []

    def f(q):
        seen.append(_torch_ops._needs_custom_op(q, q, q))
        return q.sum()

    torch.func.grad(f)(torch.zeros(1, 4, 2, 64))
    assert seen == [True]


def test_jit_tracing_uses_the_custom_op():
    seen = []

    def f(q):
        seen.append(_torch_ops._needs_custom_op(q, q, q))
        return q + 1

    torch.jit.trace(f, torch.zeros(1, 4, 2, 64), check_trace=False)
    assert seen == [True]


def test_calls_that_fail_a_check_keep_no_plan():
    """The direct route keeps a call signature's checks only once they passed, so a bad call
    raises every time it is made."""
    import flashcute
    from flashcute import _torch_direct

    _torch_direct._plans.clear()
    q, k, v = (torch.zeros(1, 4, 2, 64, dtype=torch.float16) for _ in range(3))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a CPU tensor"):
            flashcute.attention(q, k, v)
        with pytest.raises(ValueError, match=r"^out: expected shape \(1, 4, 2, 64\)"):
            flashcute.attention(q, k, v, out=torch.zeros(1, 4, 2, 32, dtype=torch.float16))
    assert not _torch_direct._plans

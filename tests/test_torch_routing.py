"""Which torch calls go through the custom op and which launch the kernel directly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashcute._C")

from flashcute import _torch_ops  # noqa: E402


def _qkv(requires_grad: bool = False):
    return [torch.zeros(1, 4, 2, 64, requires_grad=requires_grad) for _ in range(3)]


def test_plain_tensors_skip_the_custom_op():
    assert _torch_ops.route(*_qkv()) == "direct"


def test_inputs_that_require_grad_take_the_autograd_route():
    q, k, v = _qkv()
    v.requires_grad_(True)
    assert _torch_ops.route(q, k, v) == "autograd"
    with torch.no_grad():
        assert _torch_ops.route(q, k, v) == "direct"


def test_dispatch_modes_use_the_custom_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    with FakeTensorMode():
        assert _torch_ops.route(q, k, v) == "custom_op"
    v.requires_grad_(True)
    with FakeTensorMode():
        assert _torch_ops.route(q, k, v) == "custom_op"


def test_tensor_subclasses_use_the_custom_op():
    class Tagged(torch.Tensor):
        pass

    q, k, v = _qkv()
    assert _torch_ops.route(q.as_subclass(Tagged), k, v) == "custom_op"


def test_functorch_transforms_use_the_custom_op():
    seen = []

    def f(q):
        seen.append(_torch_ops.route(q, q, q))
        return q.sum()

    torch.func.grad(f)(torch.zeros(1, 4, 2, 64))
    assert seen == ["custom_op"]


def test_jit_tracing_uses_the_custom_op():
    seen = []

    def f(q):
        seen.append(_torch_ops.route(q, q, q))
        return q + 1

    torch.jit.trace(f, torch.zeros(1, 4, 2, 64), check_trace=False)
    assert seen == ["custom_op"]


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


def test_backward_calls_that_fail_a_check_keep_no_plan():
    """The same for the backward's torch route, which also checks its flags first."""
    import flashcute
    from flashcute import _torch_direct

    _torch_direct._plans.clear()
    q, k, v = (torch.zeros(1, 4, 2, 64, dtype=torch.float16) for _ in range(3))
    lse = torch.zeros(1, 2, 4)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor, got a CPU tensor"):
            flashcute.attention_backward(q, q, k, v, q, lse)
        with pytest.raises(TypeError, match=r"^deterministic: expected a bool"):
            flashcute.attention_backward(q, q, k, v, q, lse, deterministic=1)
        with pytest.raises(TypeError, match=r"^causal: expected a bool"):
            flashcute.attention_backward(q, q, k, v, q, lse, causal=None)
    assert not _torch_direct._plans


def test_backward_takes_the_direct_route_unless_watched(monkeypatch):
    """Plain torch tensors take the backward's direct route; under a dispatch mode the call
    takes the DLPack route, which reads the (fake, CPU) tensors and refuses them."""
    import flashcute
    from flashcute import _torch_direct
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(_torch_direct, "attention_backward", lambda *args, **kwargs: "direct")
    q, k, v = (torch.zeros(1, 4, 2, 64, dtype=torch.float16) for _ in range(3))
    assert flashcute.attention_backward(q, q, k, v, q, torch.zeros(1, 2, 4)) == "direct"
    with FakeTensorMode():
        q, k, v = (torch.zeros(1, 4, 2, 64, dtype=torch.float16) for _ in range(3))
        assert _torch_ops.watched(q, k, v)
        with pytest.raises(ValueError, match=r"^q: expected a CUDA tensor"):
            flashcute.attention_backward(q, q, k, v, q, torch.zeros(1, 2, 4))

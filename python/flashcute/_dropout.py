"""Dropout on the attention weights: the checks every route shares, the keyword arguments the
extension takes, and the {seed, offset} pair that torch calls draw from torch's generator.

A call's keep mask is a function of (dropout_seed, dropout_offset) and the weight's position
(cpp/dropout.h; ``flashcute.testing.dropout_keep_mask``), so the backward regenerates the
forward's mask from the same pair. The pair comes from ``dropout_seed`` / ``dropout_offset``
(plain ints), or from ``dropout_rng_state``, an int64 (2,) tensor {seed, offset} on q's device
that the kernels read: torch calls draw one from torch's CUDA generator, which works in CUDA
graphs (every replay draws fresh values on the device).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional, Protocol

#: Seeds and offsets are in [0, SEED_LIMIT): int64 on the custom ops and in dropout_rng_state.
SEED_LIMIT = 2**63


@dataclass(frozen=True)
class Dropout:
    """A call's checked dropout arguments: ``p`` in [0, 1), and the explicit seed and offset
    (both None when the call takes them from a rng state, given or drawn)."""

    p: float = 0.0
    seed: Optional[int] = None
    offset: Optional[int] = None

    @property
    def active(self) -> bool:
        return self.p > 0.0


NO_DROPOUT = Dropout()


def _type_name(x: Any) -> str:
    from ._validate import type_name  # _validate imports this module

    return type_name(x)


def check_dropout_p(dropout_p: Any) -> float:
    """``dropout_p`` as a float in [0, 1) (bools, NaN and non-reals are refused); TypeError or
    ValueError naming ``dropout_p`` otherwise."""
    if type(dropout_p) is not float and (
        isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real)
    ):
        raise TypeError(f"dropout_p: expected a float in [0, 1), got {_type_name(dropout_p)}")
    try:
        value = float(dropout_p)
    except OverflowError:  # an int beyond float range
        value = math.inf
    if not 0.0 <= value < 1.0:  # NaN fails too; comparisons trace under torch.compile
        raise ValueError(f"dropout_p: expected a float in [0, 1), got {value}")
    return value


def _check_seed(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral)
    ):
        raise TypeError(f"{name}: expected an int in [0, 2**63) or None, got {_type_name(value)}")
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(f"{name}: expected an int in [0, 2**63), got {value}")
    return int(value)


def check_dropout(
    dropout_p: Any, dropout_seed: Any, dropout_offset: Any, dropout_rng_state: Any, *,
    draws: bool, backward: bool = False,
) -> Dropout:
    """The scalar dropout arguments of a call, checked: ``dropout_seed`` and ``dropout_offset``
    are given together (ints in [0, 2**63)) or not at all, never beside ``dropout_rng_state``.
    ``draws``: the route draws a rng state when neither is given (torch forwards); elsewhere
    (other frameworks, backward calls) ``dropout_p > 0`` needs one of them. With
    ``dropout_p = 0`` the seed, offset and state are checked and unused."""
    if type(dropout_p) is float and dropout_p == 0.0 and dropout_seed is None \
            and dropout_offset is None:
        return NO_DROPOUT  # the common call, at the cost of a few comparisons
    p = check_dropout_p(dropout_p)
    seed = _check_seed("dropout_seed", dropout_seed)
    offset = _check_seed("dropout_offset", dropout_offset)
    if (seed is None) != (offset is None):
        given, missing = ("dropout_seed", "dropout_offset")
        if seed is None:
            given, missing = missing, given
        raise ValueError(
            f"{missing}: expected an int beside {given} (the pair keys the dropout mask), got None"
        )
    if seed is not None and dropout_rng_state is not None:
        raise ValueError(
            "dropout_rng_state: the seed and offset come from dropout_seed and dropout_offset or "
            "from dropout_rng_state, not both"
        )
    if p > 0.0 and seed is None and dropout_rng_state is None and not draws:
        need = (
            "the forward's dropout_seed and dropout_offset (or its dropout_rng_state)"
            if backward else
            "dropout_seed and dropout_offset (or a dropout_rng_state); only calls on torch "
            "tensors draw them from torch's generator"
        )
        raise ValueError(f"dropout_seed: dropout_p = {p} needs {need}")
    return Dropout(p, seed, offset)


class _TensorInfo(Protocol):
    name: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def check_rng_state_info(info: _TensorInfo) -> None:
    """``dropout_rng_state``: a contiguous int64 (2,) tensor {seed, offset}; TypeError or
    ValueError naming it otherwise (its device is checked with the other tensors')."""
    if info.dtype != "int64":
        raise TypeError(f"dropout_rng_state: expected int64, got {info.dtype}")
    if info.shape != (2,):
        raise ValueError(
            f"dropout_rng_state: expected shape (2,), {{seed, offset}}, got "
            f"({', '.join(map(str, info.shape))}{',' if len(info.shape) == 1 else ''})"
        )
    if info.strides[0] != 1:
        raise ValueError(
            f"dropout_rng_state: expected a contiguous tensor, got stride {info.strides[0]}"
        )


def require_dropout(ext: Any) -> None:
    """ImportError for a build of ``flashcute._C`` whose binding predates dropout."""
    if "dropout_p" not in (getattr(ext.forward, "__doc__", None) or ""):
        raise ImportError(
            "flashcute: this build of flashcute._C has no dropout; reinstall the package with "
            "`pip install .`"
        )


def launch_kwargs(ext: Any, dropout: Dropout, rng_state: Any) -> dict[str, Any]:
    """The extension's dropout keywords for a launch (none when dropout is off, so that the
    call is what it is without dropout); ``rng_state`` is what the extension reads (None:
    the explicit seed and offset)."""
    if not dropout.active:
        return {}
    require_dropout(ext)
    if rng_state is None and dropout.seed is None:
        raise ValueError(
            f"dropout_seed: dropout_p = {dropout.p} needs a seed and offset or a rng state"
        )
    return {
        "dropout_p": dropout.p,
        "dropout_seed": dropout.seed or 0,
        "dropout_offset": dropout.offset or 0,
        "dropout_rng_state": rng_state,
    }


def dropout_rng_state(device: Any = None, *, generator: Any = None) -> Any:
    """A fresh dropout state: an int64 tensor ``(2,)`` holding {seed, offset}, each in
    [0, 2**63), drawn on ``device`` (default: the current CUDA device) from ``generator``
    (default: torch's default generator of that device), as the torch routes draw one for
    every call with ``dropout_p > 0`` and no explicit seed.

    Pass it as ``dropout_rng_state=`` to a forward and then to its backward (e.g.
    ``flashcute.attention_backward`` called by hand): both see the same dropout mask. The
    draw runs on the device and is captured by CUDA graphs: each replay draws new values,
    so replays see different masks, and ``torch.manual_seed`` reproduces a sequence of
    calls."""
    import torch

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return torch.randint(SEED_LIMIT - 1, (2,), dtype=torch.int64, device=device,
                         generator=generator)


def rng_state_for(q: Any, dropout: Dropout, given: Any) -> Any:
    """The rng state a torch forward hands the kernels: the caller's, else (``dropout_p > 0``
    and no explicit seed) one drawn on q's device; None when the call needs none."""
    if not dropout.active:
        return None
    if given is not None or dropout.seed is not None:
        return given
    return dropout_rng_state(q.device)

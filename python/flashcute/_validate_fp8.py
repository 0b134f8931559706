"""Argument checks of FP8 (float8_e4m3fn) attention calls: dtypes, the out buffer and descales.

The checks the FP8 call shares with the 16-bit one (ranks, shapes, head dims, strides, the
window, softcap, ALiBi, devices) are ``_validate.forward_problem``'s; this module adds what is
FP8's own. Descales are data: their values are never read on the host (that would cost a sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ._validate import _Info, _fmt

#: The FP8 element type attention takes (e4m3, no infinities).
FP8_DTYPE = "float8_e4m3fn"
#: Output dtypes of FP8 calls; the first is the default.
FP8_OUT_DTYPES = ("bfloat16", "float16")
#: Rows (queries or keys) per block of block descales (attention's and ``quantize_fp8``'s),
#: for every head dim: the kernels' too (cpp/kernel_params.h, cpp/quantize_fp8.h), and
#: ``reference_fp8.FP8_BLOCK``, which stays numpy-only.
FP8_BLOCK = 128
#: The largest element offset of a K or V block descale from its (batch, head) start.
_MAX_BLOCK_OFFSET = 2**31 - 1


def fp8_dtype_name(x: Any) -> Optional[str]:
    """The float8 dtype name of an array (``"float8_e4m3fn"``, ``"float8_e5m2"``, ...), or None
    for any other dtype, from its ``dtype`` attribute only (no import, no DLPack export)."""
    name = str(getattr(x, "dtype", "")).rpartition(".")[2]
    return name if name.startswith("float8") else None


def check_dtype_arg(dtype: Any) -> Optional[str]:
    """``dtype=``: None, or ``"float8_e4m3fn"``, which reads uint8 inputs as e4m3 bytes (for
    frameworks that cannot export float8 through DLPack)."""
    if dtype is None:
        return None
    if not isinstance(dtype, str):
        raise TypeError(f"dtype: expected None or 'float8_e4m3fn', got {type(dtype).__name__}")
    if dtype != FP8_DTYPE:
        raise ValueError(f"dtype: expected None or 'float8_e4m3fn', got {dtype!r}")
    return dtype


def check_input_dtypes(infos: list[_Info], uint8_bytes: bool) -> None:
    """q, k and v: all float8_e4m3fn, or all uint8 where ``dtype='float8_e4m3fn'`` says so.

    Raises:
        TypeError: another dtype (float8_e5m2 is named as unsupported), or a mix with q's.
    """
    expected = "uint8" if uint8_bytes else FP8_DTYPE
    for info in infos:
        if info.dtype == "float8_e5m2":
            raise TypeError(f"{info.name}: float8_e5m2 is unsupported; FP8 attention takes float8_e4m3fn")
        if info.dtype != expected:
            how = " (dtype='float8_e4m3fn' reads uint8 bytes)" if uint8_bytes else ""
            raise TypeError(
                f"{info.name}: expected {expected}{how} like q, got {info.dtype}; FP8 calls take "
                "float8_e4m3fn q, k and v together"
            )


def check_out(out: _Info, shape: tuple[int, ...]) -> str:
    """out of an FP8 call: bfloat16 or float16 of the output's shape; returns its dtype."""
    if out.dtype not in FP8_OUT_DTYPES:
        raise TypeError(f"out: expected bfloat16 or float16 for float8_e4m3fn inputs, got {out.dtype}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {_fmt(shape)}, got {_fmt(out.shape)}")
    return out.dtype


@dataclass(frozen=True)
class DescaleModes:
    """Which descales a call has and how (``"head"`` or ``"block"``; None: not given, 1.0)."""

    q: Optional[str]
    k: Optional[str]
    v: Optional[str]


def _check_descale(
    info: _Info, batch: int, heads: tuple[int, ...], rows: int, varlen: bool, batch_name: str
) -> str:
    """One descale: float32, (batch, heads) or (batch, heads, ceil(rows / 128)); returns its mode."""
    if info.dtype != "float32":
        raise TypeError(f"{info.name}: expected float32, got {info.dtype}")
    blocks = -(-rows // FP8_BLOCK)
    head_text = " or ".join(str(h) for h in dict.fromkeys(heads))
    per_head = [f"({batch}, {h})" for h in dict.fromkeys(heads)]
    per_block = [f"({batch}, {h}, {blocks})" for h in dict.fromkeys(heads)]
    shapes = per_head if varlen else per_head + per_block
    ok = (
        len(info.shape) in ((2,) if varlen else (2, 3))
        and info.shape[0] == batch
        and info.shape[1] in heads
        and (len(info.shape) == 2 or info.shape[2] == blocks)
    )
    if not ok:
        where = " (variable-length batches take per-head descales)" if varlen else ""
        raise ValueError(
            f"{info.name}: expected shape {' or '.join(shapes)} ({batch_name}, heads ({head_text})"
            f"{'' if varlen else ', blocks of 128 rows'}){where}, got {_fmt(info.shape)}"
        )
    if len(info.shape) == 3 and info.name != "q_descale":
        # The kernels address K's and V's block descales with 32-bit products (block · stride).
        last = (info.shape[2] - 1) * info.strides[2]
        if last > _MAX_BLOCK_OFFSET:
            raise ValueError(
                f"{info.name}: block stride {info.strides[2]} puts block {info.shape[2] - 1} at element "
                f"{last}, past the kernels' 32-bit offsets ({_MAX_BLOCK_OFFSET}); pass a contiguous descale"
            )
    return "block" if len(info.shape) == 3 else "head"


def check_descales(
    inspect: Callable[[str, Any], _Info],
    q_descale: Any,
    k_descale: Any,
    v_descale: Any,
    *,
    batch: int,
    nheads: int,
    nheads_kv: int,
    seqlen_q: int,
    seqlen_k: int,
    varlen: bool = False,
) -> tuple[DescaleModes, list[_Info]]:
    """The descales' modes and infos (for the device check), checked against the call.

    q's heads are nheads, or nheads_kv (FlashAttention-3's convention); k's and v's nheads_kv.
    Where any descale is per block, all three must be given.

    Raises:
        TypeError: a descale that is not float32.
        ValueError: a wrong shape, or a block descale beside a missing one.
    """
    batch_name = "num_sequences" if varlen else "batch"
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    heads = {"q_descale": (nheads, nheads_kv), "k_descale": (nheads_kv,), "v_descale": (nheads_kv,)}
    rows = {"q_descale": seqlen_q, "k_descale": seqlen_k, "v_descale": seqlen_k}
    infos: dict[str, _Info] = {}
    modes: dict[str, Optional[str]] = {}
    for name, x in given.items():
        if x is None:
            modes[name] = None
            continue
        info = inspect(name, x)
        infos[name] = info
        modes[name] = _check_descale(info, batch, heads[name], rows[name], varlen, batch_name)
    if "block" in modes.values():
        missing = [name for name, mode in modes.items() if mode is None]
        if missing:
            raise ValueError(
                f"{', '.join(missing)}: missing; block descales (3-d) were given, so every one of "
                "q_descale, k_descale and v_descale is needed"
            )
    return DescaleModes(modes["q_descale"], modes["k_descale"], modes["v_descale"]), list(infos.values())

"""Small flashcute calls of one kernel family, for compute-sanitizer (``run.sh`` beside this).

    python tests/sanitize/calls.py FAMILY [--forward-from PATH]

FAMILY is one of ampere-fwd, hopper-fwd, ampere-bwd, ampere-bwd-deterministic, hopper-bwd,
kvcache (``attention_with_kvcache`` and ``merge_attention_states``: kvcache_calls.py),
hopper-fp8 (float8_e4m3fn inputs: the shapes and masks below without dropout, per-head and block
descales, head dims 64, 128, 256 and 80, and the variable-length corpus with per-head descales).
The backward families take out and lse from a forward on the given path (``--forward-from``,
default: the same path), so that a report can be told apart from the forward's own writes.
Shapes: bf16 and fp16, head dims 64 and 128 and, on the next larger kernels (which read and
write only their columns), 40 and 72; GQA 2:1, causal and not, each without and with a sliding
window and softcap, with both and ALiBi ((batch, nheads) slopes), and with dropout (alone, and
beside the window and softcap; a given seed and offset, or a rng state on the device), odd lengths
with seqlen_q != seqlen_k. Then variable-length batches (``attention_varlen``): mixed lengths with
and without seqused_k, dropout on some of them, many short sequences (more tiles than SMs), and a fuzzed corpus of offsets and used-key counts that break the rules
(decreasing, negative, beyond the rows, near 2^31, max_seqlen below the real lengths), which
the kernels must clamp without touching memory outside the tensors (the values are not checked
on the host). On the Hopper path, V's own head dim too: the built (head dim, v head dim)
pairs and a smaller pair that runs on them, and windows over enough query tiles that the CTAs
claim them.
"""

from __future__ import annotations

import argparse
import random

import torch

import flashcute

FAMILIES = ("ampere-fwd", "hopper-fwd", "ampere-bwd", "ampere-bwd-deterministic", "hopper-bwd",
            "kvcache", "hopper-fp8")
SHAPES = ((1, 129, 129), (2, 333, 129), (1, 65, 333))  # (batch, seqlen_q, seqlen_k)
# Dense, both mask features, both with ALiBi (its slopes are made per call), dropout with a
# seed and offset, and dropout beside the mask features with a rng state on the device (made
# per call).
MASKS = ({}, {"window": (40, 17), "softcap": 20.0}, {"window": (40, 17), "softcap": 20.0, "alibi": True},
         {"dropout_p": 0.2, "dropout_seed": 5, "dropout_offset": 2**33 + 1},
         {"window": (40, 17), "softcap": 20.0, "dropout_p": 0.5, "rng_state": True})

# Variable-length batches: 3 sequences over 300 query and 400 key rows.
VARLEN_TOTAL_Q, VARLEN_TOTAL_K = 300, 400
VARLEN_GOOD = ([0, 1, 130, 300], [0, 0, 257, 400])  # empty and one-row sequences, odd lengths
_BIG = 2**31 - 1


def varlen_corpus(seed: int = 0) -> list[tuple[list[int], list[int], list[int] | None, int, int]]:
    """(cu_seqlens_q, cu_seqlens_k, seqused_k or None, max_seqlen_q, max_seqlen_k) cases: the
    well-formed batch, then offsets and counts that break the rules, some drawn at random."""
    good_q, good_k = VARLEN_GOOD
    cases = [
        (good_q, good_k, None, 170, 257),
        (good_q, good_k, [0, 200, 100], 170, 257),
        ([0, 200, 100, 300], [0, 300, 100, 400], None, 200, 300),          # decreasing
        ([0, 100, 250, 1000], [0, 50, 700, 5000], None, 750, 4950),        # beyond total
        ([-50, 100, 200, 300], [-400, -1, 200, 400], None, 150, 401),      # negative
        ([0, _BIG, _BIG, _BIG], [0, _BIG, -_BIG - 1, _BIG], None, 300, 400),  # near 2^31
        ([-_BIG - 1, 0, 100, 300], [0, 100, 200, 400], None, 300, 400),
        (good_q, good_k, None, 37, 50),                                    # max_seqlen too small
        (good_q, good_k, [-5, 10, _BIG], 170, 257),                         # seqused_k out of range
        (good_q, good_k, [1000, 1000, 1000], 170, 1000),
        ([0, 300, 300, 300], [0, 400, 400, 400], [-_BIG - 1, 0, 3], 300, 400),
        # Many short sequences: more query tiles than SMs, so Hopper-path CTAs claim several.
        (list(range(0, VARLEN_TOTAL_Q + 1, 2)), [i * VARLEN_TOTAL_K // 150 for i in range(151)], None, 2, 3),
    ]
    rng = random.Random(seed)
    for _ in range(6):
        pick = lambda: rng.choice([rng.randint(-500, 1500), rng.randint(0, 400), _BIG, -_BIG - 1])  # noqa: E731
        used = [pick() for _ in range(3)] if rng.random() < 0.5 else None
        cases.append(([pick() for _ in range(4)], [pick() for _ in range(4)], used,
                      rng.randint(0, 500), rng.randint(0, 500)))
    return cases


def _features(mask: dict, batch: int, gen: torch.Generator) -> dict:
    """A MASKS entry as keywords: ALiBi slopes of 4 heads and a dropout rng state made here
    (the backward takes the forward's keywords, hence the same seed and offset or state)."""
    mask = dict(mask)
    if mask.pop("alibi", False):
        mask["alibi_slopes"] = torch.rand(batch, 4, device="cuda", generator=gen)
    if mask.pop("rng_state", False):
        mask["dropout_rng_state"] = flashcute.dropout_rng_state("cuda", generator=gen)
    return mask


def _calls(family: str, forward_from: str | None) -> int:
    if family == "kvcache":
        from kvcache_calls import kvcache_calls  # beside this file

        return kvcache_calls()
    path = family.split("-")[0]
    built = flashcute.build_info()["backends"][path]
    head_dims = built["backward_head_dims" if "bwd" in family else "head_dims"]
    count = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        if str(dtype).removeprefix("torch.") not in built["dtypes"]:
            continue
        for headdim in (40, 64, 72, 128):
            if not any(built_dim >= headdim for built_dim in head_dims):
                continue
            for batch, seqlen_q, seqlen_k in SHAPES:
                for causal, mask in ((c, m) for c in (False, True) for m in MASKS):
                    def rand(s: int, h: int) -> torch.Tensor:
                        return torch.randn(batch, s, h, headdim, device="cuda", dtype=dtype,
                                           generator=gen)

                    q, k, v = rand(seqlen_q, 4), rand(seqlen_k, 2), rand(seqlen_k, 2)
                    mask = _features(mask, batch, gen)
                    if "fwd" in family:
                        flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=path, **mask)
                    else:
                        out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                                       backend=forward_from or path, **mask)
                        flashcute.attention_backward(
                            rand(seqlen_q, 4), q, k, v, out, lse, causal=causal, backend=path,
                            deterministic=family.endswith("deterministic"), **mask,
                        )
                    count += 1
    count += _varlen_calls(family, forward_from, path, built, head_dims, gen)
    count += _dv_calls(family, forward_from, path, built, gen)
    if family == "hopper-fwd":
        count += _claimed_window_calls(built, head_dims, gen)
    torch.cuda.synchronize()
    return count


def _claimed_window_calls(built: dict, head_dims: list[int], gen: torch.Generator) -> int:
    """Windows with a left side over more than two waves of query tiles, which the Hopper path
    claims from its workspace's counter, last unit first: one per built head dim, causal and
    not."""
    dtype = torch.bfloat16 if "bfloat16" in built["dtypes"] else torch.float16
    count = 0
    for headdim in head_dims:
        for causal, window in ((True, (300, 0)), (False, (250, 90))):
            q, k, v = (torch.randn(3, s, h, headdim, device="cuda", dtype=dtype, generator=gen)
                       for s, h in ((1100, 32), (1150, 8), (1150, 8)))
            flashcute.attention(q, k, v, causal=causal, window=window, return_lse=True, backend="hopper")
            count += 1
    return count


def _dv_calls(family: str, forward_from: str | None, path: str, built: dict,
              gen: torch.Generator) -> int:
    """V's own head dim on the built (head dim, v head dim) pairs of the Hopper path, and on
    (176, 120), which runs on the next larger pair: the odd shapes with every MASKS entry,
    causal and not; the backward takes each forward's out and lse (the Hopper path's, as only
    it has the pairs' forward kernels)."""
    if path != "hopper":
        return 0
    dtype = torch.bfloat16 if "bfloat16" in built["dtypes"] else torch.float16
    pairs = [tuple(pair) for pair in built.get("head_dim_pairs", [])]
    if not pairs:
        return 0
    if any(d >= 176 and d_v >= 120 for d, d_v in pairs):
        pairs.append((176, 120))
    count = 0
    for headdim, headdim_v in sorted(set(pairs)):
        if "bwd" in family and not any(d >= headdim for d in built["backward_head_dims"]):
            continue
        for batch, seqlen_q, seqlen_k in SHAPES:
            for causal, mask in ((c, m) for c in (False, True) for m in MASKS):
                def rand(s: int, h: int, d: int) -> torch.Tensor:
                    return torch.randn(batch, s, h, d, device="cuda", dtype=dtype, generator=gen)

                q, k, v = rand(seqlen_q, 4, headdim), rand(seqlen_k, 2, headdim), rand(seqlen_k, 2, headdim_v)
                mask = _features(mask, batch, gen)
                if forward_from == "ampere":
                    # initcheck (run.sh): the Ampere path has no such forward, and a Hopper-path
                    # forward's TMA stores count as unwritten there; any finite out and lse
                    # serve, written by plain stores.
                    out = rand(seqlen_q, 4, headdim_v)
                    lse = torch.zeros(batch, 4, seqlen_q, device="cuda", dtype=torch.float32)
                else:
                    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                                   backend="hopper", **mask)
                if "bwd" in family:
                    flashcute.attention_backward(rand(seqlen_q, 4, headdim_v), q, k, v, out, lse,
                                                 causal=causal, backend=path, **mask)
                count += 1
    return count


def _varlen_calls(family: str, forward_from: str | None, path: str, built: dict,
                  head_dims: list[int], gen: torch.Generator) -> int:
    """The variable-length corpus on one dtype and the head dims 64, 72 and 200 (the latter
    two on the next larger kernels; 200 on a two-consumer tile where the Hopper path runs one),
    causal and not, with and without window and softcap, and with both and ALiBi."""
    dtype = torch.bfloat16 if "bfloat16" in built["dtypes"] else torch.float16
    count = 0
    for headdim in (64, 72, 200):
        if not any(built_dim >= headdim for built_dim in head_dims):
            continue
        for i, (cu_q, cu_k, used, max_q, max_k) in enumerate(varlen_corpus()):
            causal, mask = bool(i % 2), dict(MASKS[(i // 2) % len(MASKS)])

            def rand(rows: int, heads: int) -> torch.Tensor:
                return torch.randn(rows, heads, headdim, device="cuda", dtype=dtype, generator=gen)

            q, k, v = rand(VARLEN_TOTAL_Q, 4), rand(VARLEN_TOTAL_K, 2), rand(VARLEN_TOTAL_K, 2)
            offsets = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in (cu_q, cu_k)]
            seqused_k = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
            mask = _features(mask, len(cu_q) - 1, gen)
            args = (q, k, v, *offsets, max_q, max_k)
            if "fwd" in family:
                flashcute.attention_varlen(*args, seqused_k=seqused_k, causal=causal,
                                           return_lse=True, backend=path, **mask)
            else:
                out, lse = flashcute.attention_varlen(*args, seqused_k=seqused_k, causal=causal,
                                                      return_lse=True, backend=forward_from or path,
                                                      **mask)
                flashcute.attention_varlen_backward(
                    rand(VARLEN_TOTAL_Q, 4), q, k, v, out, lse, *offsets, max_q, max_k,
                    seqused_k=seqused_k, causal=causal, backend=path,
                    deterministic=family.endswith("deterministic"), **mask,
                )
            count += 1
    return count


def _fp8_calls(gen: torch.Generator) -> int:
    """FP8 calls (family hopper-fp8): fixed lengths with no, per-head and block descales, then
    the variable-length corpus."""
    dims = flashcute.build_info()["backends"]["hopper"].get("fp8_head_dims", [])
    count = 0

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=gen).to(torch.float8_e4m3fn)

    def descales(batch: int, heads: int, rows: int, mode: str) -> torch.Tensor | None:
        if mode == "none":
            return None
        shape = (batch, heads) if mode == "head" else (batch, heads, -(-rows // flashcute.FP8_BLOCK))
        return torch.rand(*shape, device="cuda", generator=gen) + 0.5

    for headdim in (64, 128, 256, 80):  # 80 on the next kernel (8-bit rows: 16-byte multiples)
        if not any(d >= headdim for d in dims):
            continue
        for batch, seqlen_q, seqlen_k in SHAPES:
            for i, mask in enumerate(m for m in MASKS if "dropout_p" not in m):
                for causal in (False, True):
                    mode = ("none", "head", "block")[(i + int(causal)) % 3]
                    q, k, v = rand(batch, seqlen_q, 4, headdim), rand(batch, seqlen_k, 2, headdim), rand(batch, seqlen_k, 2, headdim)
                    flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                        q_descale=descales(batch, 4, seqlen_q, mode),
                                        k_descale=descales(batch, 2, seqlen_k, mode),
                                        v_descale=descales(batch, 2, seqlen_k, mode), **_features(mask, batch, gen))
                    count += 1
    if dims:
        for i, (cu_q, cu_k, used, max_q, max_k) in enumerate(varlen_corpus()):
            q, k, v = rand(VARLEN_TOTAL_Q, 4, 128), rand(VARLEN_TOTAL_K, 2, 128), rand(VARLEN_TOTAL_K, 2, 128)
            offsets = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in (cu_q, cu_k)]
            seqused_k = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
            batch = len(cu_q) - 1
            flashcute.attention_varlen(q, k, v, *offsets, max_q, max_k, seqused_k=seqused_k, causal=bool(i % 2),
                                       return_lse=True, q_descale=descales(batch, 4, 0, "head"),
                                       k_descale=descales(batch, 2, 0, "head"), v_descale=descales(batch, 2, 0, "head"))
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("--forward-from", choices=("ampere", "hopper"), default=None)
    args = parser.parse_args()
    n = _fp8_calls(torch.Generator(device="cuda").manual_seed(0)) if args.family == "hopper-fp8" \
        else _calls(args.family, args.forward_from)
    print(f"{args.family}: {n} calls")
    if n == 0:
        raise SystemExit(f"{args.family}: this build or GPU has no kernel of this family")


if __name__ == "__main__":
    main()

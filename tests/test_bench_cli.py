"""CPU-only tests of the ``flashcute.bench`` command line and pure helpers.

None of these tests needs a GPU or the compiled flashcute extension.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from flashcute.bench import (  # noqa: E402
    CHECK_ATOL,
    DEFAULT_HDIMS,
    DEFAULT_SEQLENS,
    IMPLS,
    NO_WINDOW,
    QUICK_HDIMS,
    QUICK_SEQLENS,
    TOTAL_HIDDEN,
    TOTAL_TOKENS,
    BenchConfig,
    BenchError,
    BenchRow,
    CheckError,
    Shape,
    attention_flops,
    build_grid,
    build_shapes,
    causal_pairs,
    causal_values,
    config_flops,
    feature_name,
    feature_skip_reason,
    format_table,
    impl_skip_reason,
    impl_unavailable_reason,
    make_progress,
    Notes,
    main,
    parse_args,
    parse_shape,
    parse_softcap,
    parse_window,
    plot_results,
    results_to_json,
    select_impls,
    tflops_from_ms,
    visible_pairs,
    with_feature,
    write_json,
)

BUILD_INFO = {
    "version": "0.1.0",
    "cuda_archs": ["80", "90a"],
    "cuda_runtime_version": "13.0",
    "backends": {
        "ampere": {"head_dims": [64, 128, 256], "dtypes": ["float16", "bfloat16"]},
        "hopper": {"head_dims": [64, 128], "dtypes": ["bfloat16"]},
    },
}


def _fake_rows() -> list[BenchRow]:
    """Rows for two configurations; sdpa-flash is missing for the second."""
    cfg1 = BenchConfig("bf16", 128, False, 512, 32, 16)
    cfg2 = BenchConfig("bf16", 128, True, 2048, 8, 16)
    return [
        BenchRow.from_config("flashcute-ampere", cfg1, 300.0),
        BenchRow.from_config("sdpa-cudnn", cfg1, 400.0, bwd_tflops=250.0),
        BenchRow.from_config("sdpa-flash", cfg1, 200.0, bwd_tflops=150.0),
        BenchRow.from_config("flashcute-ampere", cfg2, 150.0),
        BenchRow.from_config("sdpa-cudnn", cfg2, 300.0, bwd_tflops=200.0),
    ]


# ----------------------------------------------------------------- arguments


def test_parse_defaults() -> None:
    args = parse_args([])
    assert args.hdims == list(DEFAULT_HDIMS) == [64, 128, 256]
    assert args.seqlens == list(DEFAULT_SEQLENS) == [512, 1024, 2048, 4096, 8192, 16384]
    assert args.causals == [False, True]
    assert args.dtype == "bf16"
    assert args.impls is None
    assert not args.bwd and not args.check and not args.quick
    assert args.json is None and args.plot is None
    assert args.rounds == 3


def test_parse_explicit_values() -> None:
    args = parse_args([
        "--hdims", "64,256", "--seqlens", "1024,4096", "--causal", "yes",
        "--dtype", "fp16", "--impls", "sdpa-flash,flashcute-ampere",
        "--bwd", "--check", "--json", "out.json", "--plot", "out.png",
    ])
    assert args.hdims == [64, 256]
    assert args.seqlens == [1024, 4096]
    assert args.causals == [True]
    assert args.dtype == "fp16"
    # Canonical order regardless of the order given.
    assert args.impls == ["flashcute-ampere", "sdpa-flash"]
    assert args.bwd and args.check
    assert args.json == "out.json" and args.plot == "out.png"


def test_parse_quick() -> None:
    args = parse_args(["--quick"])
    assert args.hdims == list(QUICK_HDIMS) == [128]
    assert args.seqlens == list(QUICK_SEQLENS) == [512, 2048, 8192]
    default = parse_args([])
    assert args.rep < default.rep
    assert args.rounds == 1 and parse_args(["--quick", "--rounds", "5"]).rounds == 5
    # Explicit values win over --quick.
    assert parse_args(["--quick", "--hdims", "64"]).hdims == [64]


def test_parse_impls_all() -> None:
    assert parse_args(["--impls", "all"]).impls == list(IMPLS)


@pytest.mark.parametrize(
    "argv",
    [
        ["--impls", "bogus"],
        ["--hdims", "100"],  # not a multiple of 8
        ["--hdims", "264"],  # above 256
        ["--seqlens", "3000"],  # does not divide 16384
        ["--seqlens", "abc"],
        ["--hdims", "-64"],
        ["--causal", "maybe"],
        ["--dtype", "fp32"],
        ["--rounds", "0"],
    ],
)
def test_parse_rejects_bad_values(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        parse_args(argv)
    assert exc_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_median_row_of_rounds() -> None:
    from flashcute.bench.grid import BenchConfig, BenchRow
    from flashcute.bench.timing import median_row

    cfg = BenchConfig(dtype="bf16", hdim=128, causal=True, seqlen=2048, batch=8, nheads=16)
    rows = [BenchRow.from_config("sdpa-flash", cfg, f, b)
            for f, b in ((300.0, None), (100.0, 50.0), (200.0, 70.0))]
    row = median_row(rows)
    assert row.impl == "sdpa-flash" and row.key == rows[0].key
    assert row.fwd_tflops == 200.0 and row.bwd_tflops == 60.0


def test_causal_values() -> None:
    assert causal_values("both") == [False, True]
    assert causal_values("yes") == [True]
    assert causal_values("no") == [False]
    with pytest.raises(ValueError):
        causal_values("sometimes")


# ---------------------------------------------------------------------- grid


def test_grid_default_shapes() -> None:
    grid = build_grid()
    assert len(grid) == len(DEFAULT_HDIMS) * 2 * len(DEFAULT_SEQLENS)
    for cfg in grid:
        assert cfg.batch * cfg.seqlen == TOTAL_TOKENS == 16384
        assert cfg.nheads * cfg.hdim == TOTAL_HIDDEN == 2048
        assert cfg.dtype == "bf16"
    assert {c.hdim for c in grid} == {64, 128, 256}
    assert {c.causal for c in grid} == {False, True}
    assert {c.seqlen for c in grid} == set(DEFAULT_SEQLENS)
    # Unique configurations.
    assert len({c.key for c in grid}) == len(grid)


def test_grid_order_and_values() -> None:
    grid = build_grid([128], [512, 16384], [False, True], "fp16")
    assert [(c.hdim, c.causal, c.seqlen, c.batch, c.nheads) for c in grid] == [
        (128, False, 512, 32, 16),
        (128, False, 16384, 1, 16),
        (128, True, 512, 32, 16),
        (128, True, 16384, 1, 16),
    ]
    assert all(c.dtype == "fp16" for c in grid)


@pytest.mark.parametrize(
    "kwargs",
    [{"hdims": [100]}, {"hdims": [0]}, {"hdims": [264]}, {"seqlens": [3000]},
     {"seqlens": [0]}, {"dtype": "fp32"}],
)
def test_grid_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        build_grid(**kwargs)


# --------------------------------------------------------------------- flops


def test_flops_formula() -> None:
    b, h, s, d = 2, 16, 1024, 128
    fwd = attention_flops(b, h, s, s, d, causal=False)
    assert fwd == 4 * b * h * s * s * d
    assert attention_flops(b, h, s, s, d, causal=True) == fwd / 2
    assert attention_flops(b, h, s, s, d, causal=False, backward=True) == 2.5 * fwd
    assert attention_flops(b, h, s, s, d, causal=True, backward=True) == 2.5 * fwd / 2
    # Non-square shapes use s_q * s_k.
    assert attention_flops(1, 1, 128, 256, 64, causal=False) == 4 * 128 * 256 * 64


def test_config_flops_constant_across_grid() -> None:
    # With batch*seqlen and nheads*hdim fixed, FLOPs grow linearly in seqlen.
    for cfg in build_grid(causals=[False]):
        assert config_flops(cfg) == 4 * TOTAL_TOKENS * TOTAL_HIDDEN * cfg.seqlen


def test_tflops_from_ms() -> None:
    assert tflops_from_ms(1e12, 1000.0) == pytest.approx(1.0)
    assert tflops_from_ms(2e12, 1.0) == pytest.approx(2000.0)
    with pytest.raises(ValueError):
        tflops_from_ms(1e12, 0.0)


# ------------------------------------------------------------- availability


def test_hopper_needs_sm90() -> None:
    reason = impl_skip_reason("flashcute-hopper", 128, "bf16", BUILD_INFO, (8, 0))
    assert reason is not None and "sm90" in reason
    assert impl_skip_reason("flashcute-hopper", 128, "bf16", BUILD_INFO, (9, 0)) is None
    assert impl_unavailable_reason("flashcute-hopper", BUILD_INFO, (8, 9), None, True)
    assert impl_unavailable_reason("flashcute-hopper", BUILD_INFO, (9, 0), None, True) is None


def test_skip_by_head_dim_and_dtype() -> None:
    reason = impl_skip_reason("flashcute-hopper", 256, "bf16", BUILD_INFO, (9, 0))
    assert reason is not None and "hdim=256" in reason
    reason = impl_skip_reason("flashcute-hopper", 128, "fp16", BUILD_INFO, (9, 0))
    assert reason is not None and "fp16" in reason
    assert impl_skip_reason("flashcute-ampere", 256, "fp16", BUILD_INFO, (9, 0)) is None
    # SDPA implementations are never filtered up front.
    assert impl_skip_reason("sdpa-cudnn", 256, "fp16", {}, (8, 0)) is None


def test_unavailable_reasons() -> None:
    assert impl_unavailable_reason("flashcute-ampere", {}, (9, 0), "ImportError: x", True)
    assert impl_unavailable_reason("flashcute-ampere", {"backends": {}}, (9, 0), None, True)
    assert impl_unavailable_reason("sdpa-cudnn", {}, (9, 0), None, False)
    assert impl_unavailable_reason("sdpa-flash", {}, (9, 0), "ImportError: x", False) is None


def test_select_impls(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_fa3_module())
    notes = Notes()
    assert select_impls(None, BUILD_INFO, (9, 0), None, True, notes) == list(IMPLS)
    assert len(notes) == 0
    notes = Notes()
    assert select_impls(None, BUILD_INFO, (8, 0), None, False, notes) == [
        "flashcute-ampere", "sdpa-flash", "fa3"]
    assert len(notes) == 2
    notes = Notes()
    assert select_impls(["flashcute-ampere", "sdpa-flash"], {}, (9, 0),
                        "ImportError: no _C", True, notes) == ["sdpa-flash"]
    (note,) = notes.as_list()
    assert "no _C" in note and "flashcute-ampere" in note


# --------------------------------------------------------------------- table


def test_format_table_fake_rows() -> None:
    impls = ["flashcute-ampere", "sdpa-cudnn", "sdpa-flash"]
    table = format_table(_fake_rows(), impls)
    lines = table.splitlines()
    header = lines[0]
    for col in ("dtype", "hdim", "causal", "seqlen", "batch", "nheads",
                "flashcute-ampere", "sdpa-cudnn", "sdpa-flash",
                "ampere/cudnn", "ampere/flash", "sdpa-cudnn bwd", "sdpa-flash bwd"):
        assert col in header, col
    data = [ln for ln in lines[2:] if ln.strip()]
    assert len(data) == 2  # one line per (dtype, hdim, causal, seqlen)
    first = data[0].split()
    assert first[:6] == ["bf16", "128", "no", "512", "32", "16"]
    assert first[6:9] == ["300.0", "400.0", "200.0"]
    assert first[9:11] == ["0.75x", "1.50x"]
    assert first[11:13] == ["250.0", "150.0"]
    second = data[1].split()
    assert second[:4] == ["bf16", "128", "yes", "2048"]
    assert second[6:9] == ["150.0", "300.0", "-"]  # missing sdpa-flash
    assert second[9:11] == ["0.50x", "-"]
    # Columns are aligned: all lines of equal width up to trailing spaces.
    assert len({len(ln) for ln in [header] + data}) == 1


def test_format_table_backward_ratios() -> None:
    rows = _fake_rows()
    rows[0].bwd_tflops = 200.0  # flashcute-ampere, first config; sdpa-cudnn 250, sdpa-flash 150
    table = format_table(rows, ["flashcute-ampere", "sdpa-cudnn", "sdpa-flash"])
    header, _, first, *_ = table.splitlines()
    assert "ampere/cudnn bwd" in header and "ampere/flash bwd" in header
    assert first.split()[-2:] == ["0.80x", "1.33x"]


def test_format_table_without_bwd_and_derived_impls() -> None:
    rows = [r for r in _fake_rows() if r.impl != "sdpa-flash"]
    for r in rows:
        r.bwd_tflops = None
    table = format_table(rows)
    header = table.splitlines()[0]
    assert "bwd" not in header
    assert "sdpa-flash" not in header and "ampere/flash" not in header
    assert "ampere/cudnn" in header


def test_format_table_empty() -> None:
    assert "(no results)" in format_table([], ["sdpa-flash"])


# ---------------------------------------------------------------------- json


def test_write_json_schema(tmp_path) -> None:
    rows = _fake_rows()
    doc = results_to_json(rows, device="Fake GPU", torch_version="2.11.0",
                          flashcute_version="0.1.0", dtype="bf16", notes=["n1"])
    path = tmp_path / "sub" / "bench.json"
    write_json(path, doc)
    loaded = json.loads(path.read_text())
    assert loaded["device"] == "Fake GPU"
    assert loaded["torch"] == "2.11.0"
    assert loaded["flashcute"] == "0.1.0"
    assert loaded["dtype"] == "bf16"
    assert len(loaded["rows"]) == len(rows)
    required = {"impl", "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "fwd_tflops",
                "seqlen_q", "seqlen_k", "nheads_kv", "feature"}
    for row, src in zip(loaded["rows"], rows):
        assert required <= set(row)
        assert set(row) - required <= {"bwd_tflops"}
        assert row["feature"] == "dense"
        assert row["seqlen_q"] == row["seqlen_k"] == row["seqlen"]
        assert row["nheads_kv"] == row["nheads"]
        assert isinstance(row["impl"], str) and row["impl"] in IMPLS
        assert isinstance(row["hdim"], int) and isinstance(row["seqlen"], int)
        assert isinstance(row["batch"], int) and isinstance(row["nheads"], int)
        assert isinstance(row["causal"], bool)
        assert isinstance(row["fwd_tflops"], float)
        assert row["batch"] * row["seqlen"] == TOTAL_TOKENS
        assert row["nheads"] * row["hdim"] == TOTAL_HIDDEN
        if src.bwd_tflops is None:
            assert "bwd_tflops" not in row
        else:
            assert row["bwd_tflops"] == src.bwd_tflops


# ----------------------------------------------------------------- plotting


def test_plot_without_matplotlib_is_clear(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(BenchError, match="matplotlib"):
        plot_results(_fake_rows(), tmp_path / "p.png")


def test_plot_writes_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    plot_results(_fake_rows(), path, title="fake")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------- main


def _cuda_available() -> bool:
    try:
        import torch
    except Exception:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_available(), reason="needs a machine without CUDA")
def test_main_without_gpu_returns_2(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "flashcute.bench needs a CUDA GPU and PyTorch with CUDA" in err


def test_main_without_torch_returns_2(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "flashcute.bench needs a CUDA GPU and PyTorch with CUDA" in err


def test_check_tolerance() -> None:
    assert CHECK_ATOL == pytest.approx(2e-2)


# ----------------------------------------------------- head dims and --shape


def test_parse_hdims_any_multiple_of_8() -> None:
    assert parse_args(["--hdims", "96"]).hdims == [96]
    assert parse_args(["--hdims", "32,96,192,256"]).hdims == [32, 96, 192, 256]
    (cfg,) = build_grid([96], [1024], [False])
    assert (cfg.batch, cfg.nheads, cfg.nheads_kv, cfg.seqlen_k) == (16, 21, 21, 1024)
    assert config_flops(cfg) == 4 * 16 * 21 * 1024 * 1024 * 96


def test_parse_shape_values() -> None:
    args = parse_args(["--shape", "2,1000,3000,16,4,128"])
    assert args.shapes == [Shape(2, 1000, 3000, 16, 4, 128)]
    assert args.hdims is None and args.seqlens is None
    assert args.causals == [False, True]
    args = parse_args(["--shape", "1,64,64,8,8,64; 2,128,256,8,1,96", "--shape",
                       "1,16,8,4,2,32", "--causal", "yes", "--quick"])
    assert args.shapes == [Shape(1, 64, 64, 8, 8, 64), Shape(2, 128, 256, 8, 1, 96),
                           Shape(1, 16, 8, 4, 2, 32)]
    assert args.causals == [True]
    assert args.rep == parse_args(["--quick"]).rep  # --quick shortens the timing
    assert parse_shape(" 2, 1000,3000 ,16,4,128") == (2, 1000, 3000, 16, 4, 128)


@pytest.mark.parametrize(
    "value",
    [
        "2,1000,3000,16,4",  # five values
        "2,1000,3000,16,4,128,1",  # seven
        "2,1000,3000,16,5,128",  # nheads not a multiple of nheads_kv
        "2,0,3000,16,4,128",  # empty seqlen_q
        "2,1000,3000,16,4,100",  # head dim not a multiple of 8
        "2,1000,3000,16,4,512",  # head dim above 256
        "a,b,c,d,e,f",
        ";",
    ],
)
def test_parse_shape_rejects(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        parse_args(["--shape", value])
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape" in err


@pytest.mark.parametrize("flag,value", [("--hdims", "64"), ("--seqlens", "1024"),
                                        ("--plot", "p.png")])
def test_shape_refuses_grid_flags(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc_info:
        parse_args(["--shape", "1,64,64,8,8,64", flag, value])
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert "--shape" in err and flag in err


def test_build_shapes() -> None:
    shapes = [Shape(2, 1000, 3000, 16, 4, 128), Shape(1, 64, 64, 8, 8, 64),
              Shape(2, 1000, 3000, 16, 4, 128)]
    configs = build_shapes(shapes, [False, True], "bf16")
    assert [(c.causal, c.batch, c.seqlen, c.seqlen_k, c.nheads, c.nheads_kv, c.hdim)
            for c in configs] == [
        (False, 2, 1000, 3000, 16, 4, 128), (False, 1, 64, 64, 8, 8, 64),
        (True, 2, 1000, 3000, 16, 4, 128), (True, 1, 64, 64, 8, 8, 64),
    ]
    assert configs[0].seqlen_q == 1000
    assert "seqlen_k=3000" in configs[0].label and "nheads_kv=4" in configs[0].label
    assert configs[1].label == "bf16 hdim=64 non-causal seqlen=64 (batch=1, nheads=8)"
    assert len({c.key for c in configs}) == len(configs)


# --------------------------------------------------------------------- flops


def _brute_force_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """(query, key) pairs of the bottom-right causal mask, counted one by one."""
    return sum(1 for i in range(seqlen_q) for j in range(seqlen_k)
               if j <= i + seqlen_k - seqlen_q)


def test_causal_flops_count_bottom_right_pairs() -> None:
    for seqlen_q in range(1, 12):
        for seqlen_k in range(1, 12):
            pairs = _brute_force_pairs(seqlen_q, seqlen_k)
            assert causal_pairs(seqlen_q, seqlen_k) == pairs, (seqlen_q, seqlen_k)
            if seqlen_q != seqlen_k:
                b, h, d = 3, 5, 64
                assert attention_flops(b, h, seqlen_q, seqlen_k, d, causal=True) == (
                    4 * b * h * d * pairs)
                assert attention_flops(b, h, seqlen_q, seqlen_k, d, causal=True,
                                       backward=True) == 2.5 * 4 * b * h * d * pairs
    # Query 0 sees keys 0..2, query 1 all 4: 7 pairs, not half of 2 * 4.
    assert attention_flops(1, 1, 2, 4, 8, causal=True) == 4 * 8 * 7
    # Larger sizes: the closed form against a row-by-row sum.
    assert causal_pairs(1000, 3000) == sum(i + 2001 for i in range(1000))
    assert causal_pairs(3000, 1000) == 1000 * 1001 // 2
    cfg = build_shapes([Shape(2, 1000, 3000, 16, 4, 128)], [True])[0]
    assert config_flops(cfg) == 4 * 2 * 16 * 128 * causal_pairs(1000, 3000)


# -------------------------------------------------------------- FlashAttention-3


def _fake_fa3_module(result: str = "tuple") -> types.ModuleType:
    """A stand-in ``flash_attn_interface`` whose ``flash_attn_func`` records its calls."""
    module = types.ModuleType("flash_attn_interface")
    module.calls = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        module.calls.append({"shapes": (q.shape, k.shape, v.shape), "causal": causal})
        out = q * 2
        return (out, None) if result == "tuple" else out

    module.flash_attn_func = flash_attn_func
    return module


def test_fa3_unavailable_without_flash_attn_interface(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    reason = impl_unavailable_reason("fa3", BUILD_INFO, (9, 0), None, True)
    assert reason is not None and "fa3" in reason and "flash_attn_interface" in reason
    notes = Notes()
    assert "fa3" not in select_impls(None, BUILD_INFO, (9, 0), None, True, notes)
    assert any("fa3" in note for note in notes)
    assert parse_args(["--impls", "fa3"]).impls == ["fa3"]  # still a valid name


def test_fa3_available_with_flash_attn_interface(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_fa3_module())
    assert impl_unavailable_reason("fa3", {}, (9, 0), "ImportError: no _C", False) is None
    assert select_impls(["fa3"], {}, (9, 0), "ImportError: no _C", False, Notes()) == ["fa3"]
    assert impl_skip_reason("fa3", 128, "bf16", {}, (9, 0)) is None
    reason = impl_skip_reason("fa3", 96, "bf16", {}, (9, 0))
    assert reason is not None and "hdim=96" in reason
    reason = impl_skip_reason("fa3", 128, "fp16", {}, (9, 0))
    assert reason is not None and "fp16" in reason


@pytest.mark.parametrize("result", ["tuple", "tensor"])
def test_fa3_forward_fn(monkeypatch, result: str) -> None:
    torch = pytest.importorskip("torch")
    from flashcute.bench.impls import backward_supported, make_forward_fn

    module = _fake_fa3_module(result)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    q = torch.randn(1, 5, 4, 16)
    k = v = torch.randn(1, 9, 2, 16)
    out = make_forward_fn("fa3", q, k, v, True)()
    assert torch.equal(out, q * 2)
    assert module.calls == [{"shapes": (q.shape, k.shape, v.shape), "causal": True}]
    assert backward_supported("fa3")


# ---------------------------------------------------------------- SDPA masks


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 9), (9, 5), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_solves_flashcutes_problem(seqlen_q: int, seqlen_k: int, causal: bool) -> None:
    # GQA, seqlen_q != seqlen_k and bottom-right causal, against flashcute's reference.
    torch = pytest.importorskip("torch")
    import flashcute.reference
    from flashcute.bench.impls import make_forward_fn
    from flashcute.bench.timing import reference_output

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, seqlen_q, 4, 16, generator=gen)
    k = torch.randn(2, seqlen_k, 2, 16, generator=gen)
    v = torch.randn(2, seqlen_k, 2, 16, generator=gen)
    expected = flashcute.reference.attention(q, k, v, causal=causal).float()
    ref = reference_output(q, k, v, causal)
    torch.testing.assert_close(ref, expected, atol=1e-5, rtol=1e-5)
    if seqlen_q <= seqlen_k:  # rows with no key to see are SDPA's NaN; ref zeroes them
        out = make_forward_fn("sdpa-flash", q, k, v, causal)().transpose(1, 2)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_sdpa_mask_note() -> None:
    from flashcute.bench.impls import sdpa_mask_note

    note = sdpa_mask_note("sdpa-cudnn", True, 1000, 3000)
    assert note is not None and "causal_lower_right" in note
    assert sdpa_mask_note("sdpa-cudnn", True, 1000, 1000) is None
    assert sdpa_mask_note("sdpa-cudnn", False, 1000, 3000) is None
    assert sdpa_mask_note("flashcute-hopper", True, 1000, 3000) is None


# ------------------------------------------------------- run loop and --check


def _run_fake_benchmark(
    monkeypatch, mismatching: str, impls: list[str],
    reference=lambda q, k, v, causal, **features: q, configs: list | None = None,
) -> tuple[list, Notes]:
    """run_benchmark on CPU with the inputs, --check and timing stubbed out."""
    torch = pytest.importorskip("torch")
    from flashcute.bench import timing

    def fake_inputs(cfg, *, seed=0, device="cuda"):
        return (torch.zeros(1), torch.zeros(1), torch.zeros(1))

    def fake_check(impl, cfg, q, k, v, ref, *, atol=CHECK_ATOL):
        if impl == mismatching:
            raise CheckError(f"--check failed: {impl}", detail="max abs error 1.0")

    def fake_time(impl, cfg, q, k, v, *, warmup_ms, rep_ms, bwd, notes):
        return BenchRow.from_config(impl, cfg, 100.0)

    monkeypatch.setattr(timing, "make_inputs", fake_inputs)
    monkeypatch.setattr(timing, "reference_output", reference)
    monkeypatch.setattr(timing, "check_impl", fake_check)
    monkeypatch.setattr(timing, "time_impl", fake_time)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_fa3_module())
    notes = Notes()
    if configs is None:
        configs = build_shapes([Shape(1, 64, 128, 8, 2, 128)], [True])
    rows = timing.run_benchmark(
        configs, impls, build_info=BUILD_INFO, capability=(9, 0), warmup_ms=1.0, rep_ms=1.0,
        bwd=False, check=True, seed=0, notes=notes, progress=make_progress(1, enabled=False),
    )
    return rows, notes


def test_check_skips_mismatching_fa3(monkeypatch) -> None:
    rows, notes = _run_fake_benchmark(monkeypatch, "fa3",
                                      ["flashcute-hopper", "sdpa-cudnn", "fa3"])
    assert [r.impl for r in rows] == ["flashcute-hopper", "sdpa-cudnn"]
    assert (rows[0].seqlen, rows[0].seqlen_k, rows[0].nheads_kv) == (64, 128, 2)
    assert any(n.startswith("fa3 skipped") and "max abs error 1.0" in n for n in notes)
    assert any("causal_lower_right" in n for n in notes)  # sdpa-cudnn, seqlen_q != seqlen_k


def test_check_skips_when_the_reference_fails(monkeypatch) -> None:
    def failing_reference(q, k, v, causal, **features):
        raise RuntimeError("no kernel")

    rows, notes = _run_fake_benchmark(monkeypatch, "", ["flashcute-hopper", "sdpa-cudnn"],
                                      reference=failing_reference)
    assert [r.impl for r in rows] == ["sdpa-cudnn"]
    assert any("flashcute-hopper skipped" in n and "no kernel" in n for n in notes)


def test_check_aborts_on_mismatching_flashcute(monkeypatch) -> None:
    with pytest.raises(CheckError):
        _run_fake_benchmark(monkeypatch, "flashcute-hopper", ["flashcute-hopper", "fa3"])


# --------------------------------------------------------- table and json shapes


def test_format_table_shapes_and_fa3_ratio() -> None:
    cfg = build_shapes([Shape(2, 1000, 3000, 16, 4, 128)], [True])[0]
    rows = [BenchRow.from_config("flashcute-hopper", cfg, 300.0),
            BenchRow.from_config("sdpa-cudnn", cfg, 200.0),
            BenchRow.from_config("fa3", cfg, 250.0)]
    header, _, line = format_table(rows, ["flashcute-hopper", "sdpa-cudnn", "fa3"]).splitlines()
    assert header.split()[:8] == ["dtype", "hdim", "causal", "seqlen_q", "seqlen_k", "batch",
                                  "nheads", "nheads_kv"]
    assert "hopper/cudnn" in header and "hopper/fa3" in header
    assert line.split() == ["bf16", "128", "yes", "1000", "3000", "2", "16", "4",
                            "300.0", "200.0", "250.0", "1.50x", "1.20x"]
    doc = results_to_json(rows, device="d", torch_version="t", flashcute_version=None,
                          dtype="bf16")
    row = json.loads(json.dumps(doc))["rows"][0]
    assert {k: row[k] for k in ("batch", "seqlen_q", "seqlen_k", "nheads", "nheads_kv",
                                "hdim", "seqlen")} == {
        "batch": 2, "seqlen_q": 1000, "seqlen_k": 3000, "nheads": 16, "nheads_kv": 4,
        "hdim": 128, "seqlen": 1000}


# ------------------------------------------------------------------ progress


def test_progress_without_tqdm_draws_nothing(monkeypatch, capsys) -> None:
    from flashcute.bench import report

    assert not hasattr(report, "SimpleProgress")  # no hand-written bar
    monkeypatch.setitem(sys.modules, "tqdm", None)
    bar = make_progress(4)
    bar.set_postfix_str("x")
    bar.update(1)
    bar.close()
    assert capsys.readouterr().err == ""


def test_progress_uses_tqdm(monkeypatch) -> None:
    module = types.ModuleType("tqdm")

    class FakeTqdm:
        def __init__(self, **kwargs):
            self.kwargs, self.n = kwargs, 0

        def set_postfix_str(self, text):
            self.postfix = text

        def update(self, n=1):
            self.n += n

        def close(self):
            pass

    module.tqdm = FakeTqdm
    monkeypatch.setitem(sys.modules, "tqdm", module)
    bar = make_progress(4)
    assert isinstance(bar, FakeTqdm) and bar.kwargs["total"] == 4
    assert not isinstance(make_progress(4, enabled=False), FakeTqdm)


# ------------------------------------------------- sliding window and softcap


def test_parse_window_and_softcap() -> None:
    args = parse_args([])
    assert args.window == NO_WINDOW == (-1, -1) and args.softcap == 0.0
    assert not args.with_dense
    args = parse_args(["--window", "4096,0", "--softcap", "30", "--with-dense"])
    assert args.window == (4096, 0) and args.softcap == 30.0 and args.with_dense
    assert parse_args(["--window", "-1,128"]).window == (-1, 128)
    assert parse_args(["--window=-1,128"]).window == (-1, 128)
    assert parse_args(["--window", " -1, 128", "--causal", "yes"]).window == (-1, 128)
    assert parse_args(["--window", "0,0"]).window == (0, 0)
    assert parse_args(["--softcap", "0"]).softcap == 0.0
    assert parse_args(["--softcap", "2.5e1"]).softcap == 25.0
    # --with-dense with an explicit no-op window is still refused below; a real one is not.
    assert parse_args(["--window", "-1,-1", "--softcap", "1"]).window == (-1, -1)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--window", "4096"], "--window"),  # one side only
        (["--window", "1,2,3"], "--window"),
        (["--window", "-2,0"], "--window"),  # below -1
        (["--window", "0,-5"], "--window"),
        (["--window", "a,b"], "--window"),
        (["--window", "1.5,0"], "--window"),
        (["--window", ","], "--window"),
        (["--softcap", "-1"], "--softcap"),
        (["--softcap", "nan"], "--softcap"),
        (["--softcap", "inf"], "--softcap"),
        (["--softcap", "abc"], "--softcap"),
        (["--with-dense"], "--with-dense"),  # nothing to compare the dense problem with
        (["--with-dense", "--window", "-1,-1", "--softcap", "0"], "--with-dense"),
    ],
)
def test_parse_rejects_bad_window_and_softcap(argv: list[str], flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc_info:
        parse_args(argv)
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err and flag in err


def test_parse_window_and_softcap_helpers() -> None:
    assert parse_window("4096,0") == (4096, 0)
    for bad in ("4096", "-2,0", "x,1", "1,2,3"):
        with pytest.raises(ValueError, match="L,R"):
            parse_window(bad)
    assert parse_softcap("30") == 30.0
    for bad in ("-0.5", "nan", "-inf", "1e999", "cap"):
        with pytest.raises(ValueError):
            parse_softcap(bad)


def _brute_force_visible(seqlen_q: int, seqlen_k: int, causal: bool,
                         window: tuple[int, int]) -> int:
    """(query, key) pairs of the bottom-right window/causal mask, counted one by one."""
    left, right = window
    if causal:
        right = 0
    diag = seqlen_k - seqlen_q
    return sum(1 for i in range(seqlen_q) for j in range(seqlen_k)
               if (left < 0 or j >= i + diag - left) and (right < 0 or j <= i + diag + right))


def test_visible_pairs_match_brute_force() -> None:
    # sq < sk, sq > sk and sq == sk; sides from 0 up to beyond either sequence.
    sides = [-1, 0, 1, 2, 3, 5, 8, 13, 40]
    for seqlen_q in range(1, 10):
        for seqlen_k in range(1, 10):
            for left in sides:
                for right in sides:
                    for causal in (False, True):
                        expected = _brute_force_visible(seqlen_q, seqlen_k, causal,
                                                        (left, right))
                        got = visible_pairs(seqlen_q, seqlen_k, causal=causal,
                                            window=(left, right))
                        assert got == expected, (seqlen_q, seqlen_k, causal, left, right)
    assert visible_pairs(0, 5, window=(1, 1)) == visible_pairs(5, 0) == 0


def test_visible_pairs_special_cases() -> None:
    # No window: everything, or the causal count; windows wider than both sequences: the same.
    for sq, sk in ((7, 7), (5, 11), (11, 5), (300, 1000)):
        assert visible_pairs(sq, sk) == sq * sk
        assert visible_pairs(sq, sk, window=(10**6, 10**6)) == sq * sk
        assert visible_pairs(sq, sk, causal=True) == causal_pairs(sq, sk)
        assert visible_pairs(sq, sk, causal=True, window=(10**6, -1)) == causal_pairs(sq, sk)
        assert visible_pairs(sq, sk, causal=True, window=(-1, 7)) == causal_pairs(sq, sk)
        assert visible_pairs(sq, sk, window=(0, 0)) == sum(
            1 for i in range(sq) if 0 <= i + sk - sq < sk)
    # Sliding window w causal at s >> w: w + 1 keys per row but the first w rows.
    s, w = 16384, 4096
    assert visible_pairs(s, s, causal=True, window=(w, 0)) == (s - w) * (w + 1) + w * (w + 1) // 2
    assert visible_pairs(s, s, causal=True, window=(w, 0)) == sum(
        min(i, w) + 1 for i in range(s))


def test_window_flops_count_visible_pairs() -> None:
    b, h, d = 2, 16, 128
    for sq, sk in ((16384, 16384), (1000, 3000), (3000, 1000)):
        for causal in (False, True):
            for window in ((4096, 0), (100, 100), (0, -1), (-1, 50)):
                pairs = visible_pairs(sq, sk, causal=causal, window=window)
                fwd = attention_flops(b, h, sq, sk, d, causal, window=window)
                assert fwd == 4 * b * h * d * pairs
                assert attention_flops(b, h, sq, sk, d, causal, window=window,
                                       backward=True) == 2.5 * fwd
    # Without a window the published conventions stay: half of s^2 for causal sq == sk.
    s = 4096
    assert attention_flops(1, 1, s, s, 64, True) == 4 * 64 * s * s / 2
    assert attention_flops(1, 1, s, s, 64, True, window=NO_WINDOW) == 4 * 64 * s * s / 2
    cfg = BenchConfig("bf16", 128, True, 32768, 1, 16, window=(4096, 0), softcap=30.0)
    assert config_flops(cfg) == 4 * 16 * 128 * visible_pairs(32768, 32768, causal=True,
                                                             window=(4096, 0))
    assert config_flops(cfg, backward=True) == 2.5 * config_flops(cfg)
    # Softcap adds no FLOPs.
    plain = BenchConfig("bf16", 128, True, 4096, 4, 16)
    capped = BenchConfig("bf16", 128, True, 4096, 4, 16, softcap=30.0)
    assert config_flops(capped) == config_flops(plain)
    assert config_flops(capped, backward=True) == config_flops(plain, backward=True)


def test_feature_names() -> None:
    assert feature_name() == feature_name(NO_WINDOW, 0.0) == "dense"
    assert feature_name((4096, 0)) == feature_name((-1, 0)) == "window"
    assert feature_name(softcap=30.0) == "softcap"
    assert feature_name((128, 128), 50.0) == "window+softcap"
    assert BenchConfig("bf16", 64, True, 512, 32, 32).feature == "dense"
    cfg = BenchConfig("bf16", 64, True, 512, 32, 32, window=(256, 0), softcap=20.0)
    assert cfg.feature == "window+softcap"
    assert "window=256,0" in cfg.label and "softcap=20" in cfg.label
    assert cfg.dense() == BenchConfig("bf16", 64, True, 512, 32, 32)
    assert cfg.key != cfg.dense().key


def test_with_feature_and_dense() -> None:
    base = build_grid([128], [512, 1024], [True])
    assert with_feature(base) == base
    assert with_feature(base, with_dense=True) == base  # nothing to add
    featured = with_feature(base, (256, 0), 30.0)
    assert [(c.seqlen, c.window, c.softcap) for c in featured] == [
        (512, (256, 0), 30.0), (1024, (256, 0), 30.0)]
    paired = with_feature(base, (256, 0), with_dense=True)
    assert [(c.seqlen, c.feature) for c in paired] == [
        (512, "dense"), (512, "window"), (1024, "dense"), (1024, "window")]
    with pytest.raises(ValueError, match="window"):
        with_feature(base, (-2, 0))
    with pytest.raises(ValueError, match="softcap"):
        with_feature(base, softcap=-1.0)


def test_json_feature_key() -> None:
    dense = BenchConfig("bf16", 128, True, 4096, 4, 16)
    rows = [
        BenchRow.from_config("flashcute-hopper", dense, 500.0),
        BenchRow.from_config("flashcute-hopper", dataclasses.replace(dense, window=(1024, 0)),
                             400.0, bwd_tflops=300.0),
        BenchRow.from_config("flashcute-hopper", dataclasses.replace(dense, softcap=30.0),
                             450.0),
        BenchRow.from_config("flashcute-hopper",
                             dataclasses.replace(dense, window=(-1, 64), softcap=50.0), 420.0),
        BenchRow.from_config("sdpa-cudnn", dense, 480.0),
    ]
    doc = results_to_json(rows, device="d", torch_version="t", flashcute_version="v",
                          dtype="bf16")
    loaded = json.loads(json.dumps(doc))["rows"]
    assert [r["feature"] for r in loaded] == ["dense", "window", "softcap", "window+softcap",
                                              "dense"]
    assert [r.get("window") for r in loaded] == [None, [1024, 0], None, [-1, 64], None]
    assert [r.get("softcap") for r in loaded] == [None, None, 30.0, 50.0, None]
    base = {"impl", "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "seqlen_q",
            "seqlen_k", "nheads_kv", "fwd_tflops", "feature"}
    assert set(loaded[0]) == base  # dense rows: the same keys as before, plus the feature
    assert set(loaded[1]) == base | {"window", "bwd_tflops"}


def test_feature_skip_reason() -> None:
    for impl in ("sdpa-cudnn", "sdpa-flash", "fa3"):
        assert feature_skip_reason(impl) is None
        reason = feature_skip_reason(impl, (4096, 0), 0.0)
        assert reason is not None and impl in reason and "window=4096,0" in reason
        assert "dense" in reason
        reason = feature_skip_reason(impl, NO_WINDOW, 30.0)
        assert reason is not None and "softcap=30" in reason
    for impl in ("flashcute-ampere", "flashcute-hopper"):
        assert feature_skip_reason(impl, (4096, 0), 30.0) is None


def test_forward_fn_passes_window_and_softcap(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from flashcute.bench import impls

    calls: list[dict] = []
    fake = types.SimpleNamespace(attention=lambda q, k, v, **kw: calls.append(kw) or q)
    monkeypatch.setattr(impls, "_import_flashcute", lambda: fake)
    q = k = v = torch.zeros(1, 4, 2, 8)
    impls.make_forward_fn("flashcute-hopper", q, k, v, True)()
    impls.make_forward_fn("flashcute-ampere", q, k, v, False, window=(16, 0))()
    impls.make_forward_fn("flashcute-hopper", q, k, v, True, softcap=30.0)()
    impls.make_forward_fn("flashcute-hopper", q, k, v, True, window=[8, 8], softcap=5.0)()
    assert calls == [
        {"causal": True, "backend": "hopper"},  # dense: the call of a dense benchmark
        {"causal": False, "backend": "ampere", "window": (16, 0)},
        {"causal": True, "backend": "hopper", "softcap": 30.0},
        {"causal": True, "backend": "hopper", "window": (8, 8), "softcap": 5.0},
    ]
    for impl in ("sdpa-cudnn", "fa3"):
        with pytest.raises(ValueError, match="not timed with"):
            impls.make_forward_fn(impl, q, k, v, True, window=(16, 0))


def test_run_loop_times_features_on_flashcute_only(monkeypatch) -> None:
    seen: list[tuple] = []

    def reference(q, k, v, causal, *, window=NO_WINDOW, softcap=0.0, alibi=False, dropout=0.0):
        assert alibi is False and dropout == 0.0
        seen.append((causal, tuple(window), softcap))
        return q

    base = build_shapes([Shape(1, 64, 128, 8, 2, 128)], [True])
    configs = with_feature(base, (32, 0), 30.0, with_dense=True)
    rows, notes = _run_fake_benchmark(
        monkeypatch, "", ["flashcute-hopper", "sdpa-cudnn", "fa3"], reference=reference,
        configs=configs)
    assert [(r.impl, r.feature) for r in rows] == [
        ("flashcute-hopper", "dense"), ("sdpa-cudnn", "dense"), ("fa3", "dense"),
        ("flashcute-hopper", "window+softcap")]
    assert rows[-1].window == (32, 0) and rows[-1].softcap == 30.0
    # --check compared each problem against its own reference.
    assert seen == [(True, NO_WINDOW, 0.0), (True, (32, 0), 30.0)]
    assert any(n.startswith("sdpa-cudnn not timed with window=32,0+softcap=30") for n in notes)
    assert any(n.startswith("fa3 not timed with") for n in notes)


def test_format_table_features_and_dense_ratio() -> None:
    dense = BenchConfig("bf16", 128, True, 16384, 1, 16)
    window = dataclasses.replace(dense, window=(4096, 0))
    rows = [BenchRow.from_config("flashcute-hopper", dense, 500.0, bwd_tflops=400.0),
            BenchRow.from_config("sdpa-cudnn", dense, 400.0, bwd_tflops=320.0),
            BenchRow.from_config("flashcute-hopper", window, 450.0, bwd_tflops=300.0)]
    header, _, first, second = format_table(rows, ["flashcute-hopper", "sdpa-cudnn"]
                                            ).splitlines()
    assert header.split() == [
        "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "feature", "flashcute-hopper",
        "sdpa-cudnn", "hopper/cudnn", "hopper/dense", "flashcute-hopper", "bwd", "sdpa-cudnn",
        "bwd", "hopper/cudnn", "bwd", "hopper/dense", "bwd"]
    assert first.split() == ["bf16", "128", "yes", "16384", "1", "16", "dense", "500.0",
                             "400.0", "1.25x", "-", "400.0", "320.0", "1.25x", "-"]
    assert second.split() == ["bf16", "128", "yes", "16384", "1", "16", "window=4096,0",
                              "450.0", "-", "-", "0.90x", "300.0", "-", "-", "0.75x"]
    # A feature alone: the column, but no ratio to a dense line that is not there.
    header = format_table(rows[2:], ["flashcute-hopper"]).splitlines()[0]
    assert "feature" in header and "dense" not in header
    # Dense rows alone: the table of before.
    assert "feature" not in format_table(rows[:2]).splitlines()[0]


def test_plot_with_features(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = _fake_rows()
    rows.append(BenchRow.from_config(
        "flashcute-ampere", BenchConfig("bf16", 128, True, 2048, 8, 16, softcap=30.0), 120.0))
    path = tmp_path / "p.png"
    plot_results(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dropout_reference_builds_only_each_slices_mask(monkeypatch) -> None:
    """--check with --dropout: each (batch, head) slice of the reference gets its own part of
    the keep mask (the whole mask of a long problem would not fit in memory), and the result
    is the reference with the whole mask."""
    torch = pytest.importorskip("torch")
    import flashcute.reference
    import flashcute.testing
    from flashcute.bench.grid import DROPOUT_SEED
    from flashcute.bench.timing import feature_reference

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 9, 6, 16, generator=gen)
    k = torch.randn(3, 11, 2, 16, generator=gen)
    v = torch.randn(3, 11, 2, 16, generator=gen)
    mask = flashcute.testing.dropout_keep_mask(3, 6, 9, 11, 0.25, *DROPOUT_SEED)
    expected = flashcute.reference.attention(q, k, v, causal=True, dropout_p=0.25,
                                             dropout_mask=mask).float()
    built = []
    slices = flashcute.testing.keep_mask_slices

    def recording(indices, *args, **kwargs):
        built.append(list(indices))
        return slices(indices, *args, **kwargs)

    monkeypatch.setattr(flashcute.testing, "keep_mask_slices", recording)
    monkeypatch.setattr(flashcute.testing, "dropout_keep_mask", None)  # never the whole mask
    for chunk_bytes, most in ((1, 1), (4 * 9 * 11 * 3, 3), (1 << 30, 9)):
        built.clear()
        got = feature_reference(q, k, v, True, dropout=0.25, chunk_bytes=chunk_bytes)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert max(len(b) for b in built) == most
        assert sorted(i for b in built for i in b) == list(range(18))


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(7, 13), (13, 7), (9, 9)])
def test_feature_reference_slices_like_the_whole(seqlen_q: int, seqlen_k: int) -> None:
    # --check's window/softcap reference, forced to run one (batch, head) slice at a time.
    torch = pytest.importorskip("torch")
    import flashcute.reference
    from flashcute.bench.timing import feature_reference, reference_output

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, seqlen_q, 6, 16, generator=gen)
    k = torch.randn(3, seqlen_k, 2, 16, generator=gen)
    v = torch.randn(3, seqlen_k, 2, 16, generator=gen)
    for causal, window, softcap in ((True, (3, 0), 0.0), (False, (2, 1), 5.0),
                                    (False, NO_WINDOW, 2.0), (True, (40, 40), 1.0)):
        expected = flashcute.reference.attention(q, k, v, causal=causal, window=window,
                                                 softcap=softcap).float()
        for chunk_bytes in (1, 4 * seqlen_q * seqlen_k * 2, 1 << 30):
            got = feature_reference(q, k, v, causal, window=window, softcap=softcap,
                                    chunk_bytes=chunk_bytes)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        got = reference_output(q, k, v, causal, window=window, softcap=softcap)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _fake_main_run(monkeypatch, argv: list[str]) -> tuple[int, list, dict]:
    """main() on CPU: a fake CUDA torch, flashcute and FlashAttention-3; timing stubbed."""
    from flashcute.bench import cli, impls, timing

    cuda = types.SimpleNamespace(current_device=lambda: 0,
                                 get_device_name=lambda index: "Fake GPU",
                                 get_device_capability=lambda index: (9, 0))
    fake_torch = types.SimpleNamespace(cuda=cuda, __version__="2.13.0")
    monkeypatch.setattr(timing, "require_cuda", lambda: fake_torch)
    monkeypatch.setattr(impls, "load_flashcute", lambda: (None, BUILD_INFO, None))
    monkeypatch.setattr(impls, "has_cudnn_sdpa", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_fa3_module())
    seen: dict = {}

    def fake_run(configs, chosen, **kwargs):
        seen["configs"], seen["impls"] = list(configs), list(chosen)
        return [BenchRow.from_config(impl, cfg, 100.0) for cfg in configs for impl in chosen
                if feature_skip_reason(impl, cfg.window, cfg.softcap, cfg.alibi) is None]

    monkeypatch.setattr(cli.timing, "run_benchmark", fake_run)
    return main(argv + ["--no-progress"]), seen["configs"], seen


def test_main_with_window_times_flashcute_only(monkeypatch, tmp_path, capsys) -> None:
    path = tmp_path / "w.json"
    code, configs, seen = _fake_main_run(monkeypatch, [
        "--shape", "1,16384,16384,16,16,128", "--causal", "yes", "--window", "4096,0",
        "--json", str(path)])
    assert code == 0
    assert seen["impls"] == ["flashcute-ampere", "flashcute-hopper"]
    assert [(c.window, c.softcap, c.causal) for c in configs] == [((4096, 0), 0.0, True)]
    out, err = capsys.readouterr()
    assert "feature: window=4096,0" in out
    assert "note: sdpa-cudnn not timed with window=4096,0" in err
    rows = json.loads(path.read_text())["rows"]
    assert {(r["feature"], tuple(r["window"])) for r in rows} == {("window", (4096, 0))}


def test_main_with_alibi_times_flashcute_only(monkeypatch, tmp_path, capsys) -> None:
    path = tmp_path / "a.json"
    code, configs, seen = _fake_main_run(monkeypatch, [
        "--shape", "1,4096,4096,16,16,128", "--causal", "yes", "--alibi", "--json", str(path)])
    assert code == 0
    assert seen["impls"] == ["flashcute-ampere", "flashcute-hopper"]
    assert [(c.alibi, c.window, c.softcap) for c in configs] == [(True, NO_WINDOW, 0.0)]
    out, err = capsys.readouterr()
    assert "feature: alibi" in out and "note: sdpa-cudnn not timed with alibi" in err
    rows = json.loads(path.read_text())["rows"]
    assert {(r["feature"], r["alibi"]) for r in rows} == {("alibi", True)}
    code, configs, seen = _fake_main_run(monkeypatch, [
        "--shape", "1,4096,4096,16,16,128", "--causal", "no", "--alibi", "--window", "512,512",
        "--with-dense"])
    assert code == 0 and seen["impls"] == list(IMPLS)
    assert [c.feature for c in configs] == ["dense", "window+alibi"]


def test_main_with_dense_keeps_the_baselines(monkeypatch, tmp_path, capsys) -> None:
    path = tmp_path / "s.json"
    code, configs, seen = _fake_main_run(monkeypatch, [
        "--hdims", "64", "--seqlens", "4096", "--causal", "no", "--softcap", "30",
        "--with-dense", "--json", str(path)])
    assert code == 0
    assert seen["impls"] == list(IMPLS)
    assert [c.feature for c in configs] == ["dense", "softcap"]
    out = capsys.readouterr().out
    assert "ampere/dense" in out and "hopper/dense" in out
    rows = json.loads(path.read_text())["rows"]
    assert [(r["impl"], r["feature"]) for r in rows] == [
        *((impl, "dense") for impl in IMPLS),
        ("flashcute-ampere", "softcap"), ("flashcute-hopper", "softcap")]


def test_main_with_window_and_only_baselines_fails(monkeypatch, capsys) -> None:
    from flashcute.bench import impls, timing

    cuda = types.SimpleNamespace(current_device=lambda: 0, get_device_name=lambda i: "Fake",
                                 get_device_capability=lambda i: (9, 0))
    monkeypatch.setattr(timing, "require_cuda",
                        lambda: types.SimpleNamespace(cuda=cuda, __version__="x"))
    monkeypatch.setattr(impls, "has_cudnn_sdpa", lambda: True)
    assert main(["--impls", "sdpa-cudnn", "--softcap", "30", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "no implementation left" in err and "sdpa-cudnn not timed with softcap=30" in err


# ---------------------------------------------------------------------------------------------
# --varlen


def test_varlen_packed_lengths() -> None:
    from flashcute.bench import varlen

    for seed in range(20):
        lengths = varlen.packed_lengths(seed)
        assert sum(lengths) == 16384
        assert all(n <= varlen.PACKED_MAX for n in lengths)
        assert all(n >= varlen.PACKED_MIN for n in lengths[:-1])
    assert varlen.packed_lengths(3) == varlen.packed_lengths(3)
    assert varlen.packed_lengths(1) != varlen.packed_lengths(2)


def test_varlen_flops_count_real_pairs() -> None:
    from flashcute.bench import varlen

    assert varlen.pairs([3, 5], causal=False) == 9 + 25
    assert varlen.pairs([3, 5], causal=True) == 6 + 15
    assert varlen.flops([4], nheads=2, hdim=8, causal=False) == 4 * 2 * 8 * 16
    assert varlen.flops([4], 2, 8, False, backward=True) == 2.5 * 4 * 2 * 8 * 16


def test_varlen_cases_and_rows() -> None:
    from flashcute.bench import varlen

    cases = varlen.build_cases(("equal", "packed"), [128], [512, 16384, 1000], [False, True], "bf16")
    equal = [c for c in cases if c.mode == "equal"]
    assert [(c.causal, c.lengths[0], len(c.lengths)) for c in equal] == [(False, 512, 32), (True, 512, 32)]
    packed = [c for c in cases if c.mode == "packed"]
    assert len(packed) == 2 and sum(packed[0].lengths) == 16384
    assert packed[0].dense_seqlen == round(16384 / len(packed[0].lengths))
    row = varlen.VarlenRow("flashcute-ampere", packed[1], 100.0, 125.0, 50.0, None)
    varlen_row, dense_row = row.to_dicts()
    assert (varlen_row["feature"], dense_row["feature"]) == ("varlen", "dense")
    assert varlen_row["seqlens"] == list(packed[1].lengths) and varlen_row["bwd_tflops"] == 50.0
    assert "bwd_tflops" not in dense_row and dense_row["seqlen"] == packed[1].dense_seqlen
    table = varlen.format_varlen_table([row])
    assert "varlen/dense" in table and "0.80" in table and "varlen bwd" in table


def test_parse_varlen() -> None:
    from flashcute.bench import parse_args

    assert parse_args(["--varlen", "packed"]).varlen == "packed"
    assert parse_args([]).varlen is None


@pytest.mark.parametrize("extra", [["--shape", "1,128,128,4,4,64"], ["--window", "4,0"],
                                   ["--softcap", "3"], ["--plot", "x.png"], ["--check"]])
def test_parse_varlen_refuses_other_modes(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from flashcute.bench import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--varlen", "equal", *extra])
    assert "--varlen" in capsys.readouterr().err

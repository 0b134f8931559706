"""CPU-only tests of the ``flashcute.bench`` command line and pure helpers.

None of these tests needs a GPU or the compiled flashcute extension.
"""

from __future__ import annotations

import json
import sys

import pytest

from flashcute.bench import (  # noqa: E402
    CHECK_ATOL,
    DEFAULT_HDIMS,
    DEFAULT_SEQLENS,
    IMPLS,
    QUICK_HDIMS,
    QUICK_SEQLENS,
    TOTAL_HIDDEN,
    TOTAL_TOKENS,
    BenchConfig,
    BenchError,
    BenchRow,
    SimpleProgress,
    attention_flops,
    build_grid,
    causal_values,
    config_flops,
    format_table,
    impl_skip_reason,
    impl_unavailable_reason,
    Notes,
    main,
    parse_args,
    plot_results,
    results_to_json,
    select_impls,
    tflops_from_ms,
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
        ["--hdims", "96"],  # does not divide 2048
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
    [{"hdims": [96]}, {"seqlens": [3000]}, {"seqlens": [0]}, {"dtype": "fp32"}],
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


def test_select_impls() -> None:
    notes = Notes()
    assert select_impls(None, BUILD_INFO, (9, 0), None, True, notes) == list(IMPLS)
    assert len(notes) == 0
    notes = Notes()
    assert select_impls(None, BUILD_INFO, (8, 0), None, False, notes) == [
        "flashcute-ampere", "sdpa-flash"]
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
    required = {"impl", "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "fwd_tflops"}
    for row, src in zip(loaded["rows"], rows):
        assert required <= set(row)
        assert set(row) - required <= {"bwd_tflops"}
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


# ------------------------------------------------------------------ progress


def test_simple_progress(capsys) -> None:
    bar = SimpleProgress(4, desc="t", file=sys.stderr)
    bar.update(1)
    bar.set_postfix_str("x")
    bar.update(10)
    assert bar.n == 4
    bar.close()
    err = capsys.readouterr().err
    assert "\r" in err and "4/4" in err


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

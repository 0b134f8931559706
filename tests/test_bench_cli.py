"""CPU-only tests of the ``flashcute.bench`` command line and pure helpers.

None of these tests needs a GPU or the compiled flashcute extension.
"""

from __future__ import annotations

import json
import sys
import types

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
    CheckError,
    Shape,
    attention_flops,
    build_grid,
    build_shapes,
    causal_pairs,
    causal_values,
    config_flops,
    format_table,
    impl_skip_reason,
    impl_unavailable_reason,
    make_progress,
    Notes,
    main,
    parse_args,
    parse_shape,
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
                "seqlen_q", "seqlen_k", "nheads_kv"}
    for row, src in zip(loaded["rows"], rows):
        assert required <= set(row)
        assert set(row) - required <= {"bwd_tflops"}
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
    monkeypatch, mismatching: str, impls: list[str], reference=lambda q, k, v, causal: q,
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
    def failing_reference(q, k, v, causal):
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

"""Packaging: build options, the version, licenses, metadata, the torch floor, and CMake's
configure step (the CUDA arch mapping, the message without nvcc).

All of it runs without a GPU. The configure tests need cmake (and nvcc, where they configure
the whole project) and skip without them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from importlib import metadata
from pathlib import Path

import pytest

import flashcute
from flashcute import _torch_version

ROOT = Path(__file__).resolve().parent.parent
CMAKELISTS = (ROOT / "CMakeLists.txt").read_text()


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    with path.open("rb") as f:
        return tomllib.load(f)


PYPROJECT = _toml(ROOT / "pyproject.toml")
VERSION = PYPROJECT["project"]["version"]


def _cmake_options() -> dict[str, str]:
    """FLASHCUTE_* cache variables and options of CMakeLists.txt, with their defaults."""
    options = {name: default for name, default in
               re.findall(r'set\((FLASHCUTE_\w+) "([^"]*)" CACHE\b', CMAKELISTS)}
    options.update(re.findall(r'option\((FLASHCUTE_\w+) "[^"]*" ([^)\s]+)\)', CMAKELISTS))
    assert len(options) >= 12, f"the option patterns no longer match CMakeLists.txt: {options}"
    return options


def _readme_build_options() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Build options", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))


# Build options --------------------------------------------------------------------------------

def test_every_build_option_is_mapped_in_pyproject_with_cmakes_default():
    """`pip install .` passes each option from the environment variable of its name, and with
    the default CMakeLists.txt has (FLASHCUTE_BUILD_PYTHON is always on under pip)."""
    defines = PYPROJECT["tool"]["scikit-build"]["cmake"]["define"]
    for name, default in _cmake_options().items():
        if name == "FLASHCUTE_BUILD_PYTHON":
            assert defines[name] == "ON"
            continue
        assert name in defines, f"{name} is a CMake option but pyproject.toml does not pass it"
        assert defines[name] == {"env": name, "default": default}, (name, defines[name], default)


def test_scikit_build_core_reads_each_option_from_its_environment_variable(monkeypatch):
    """The same through scikit-build-core's own settings reader, where it is installed."""
    reader = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings")
    options = [name for name in _cmake_options() if name != "FLASHCUTE_BUILD_PYTHON"]
    for name in options:
        monkeypatch.setenv(name, f"value of {name}")
    defines = reader.SettingsReader.from_file(ROOT / "pyproject.toml").settings.cmake.define
    for name in options:
        assert defines.get(name) == f"value of {name}", name


def test_readme_lists_every_build_option():
    expected = (set(_cmake_options()) - {"FLASHCUTE_BUILD_PYTHON"}) | {"CUTLASS_DIR"}
    assert _readme_build_options() == expected


# Version --------------------------------------------------------------------------------------

def test_version_is_written_only_in_pyproject():
    sources = [ROOT / "CMakeLists.txt", ROOT / "cpp" / "build_config.h.in",
               *sorted((ROOT / "cmake").glob("*")), *sorted((ROOT / "python" / "flashcute").glob("*.py"))]
    for path in sources:
        assert VERSION not in path.read_text(), f"{path.relative_to(ROOT)} repeats the version {VERSION}"
    assert re.search(r"project\(flashcute VERSION \$\{FLASHCUTE_VERSION\}", CMAKELISTS)


def test_version_without_installed_metadata_comes_from_pyproject(monkeypatch):
    """A source tree on sys.path without an install: the module of this tree, not the
    installed copy (which has no pyproject.toml two folders up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "flashcute_source_version", ROOT / "python" / "flashcute" / "_version.py"
    )
    source_version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source_version)

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(source_version.metadata, "version", missing)
    assert source_version.package_version() == VERSION


def test_extension_and_metadata_agree_on_the_version():
    pytest.importorskip("flashcute._C")
    assert flashcute.build_info()["version"] == flashcute.__version__


# Licenses and metadata ------------------------------------------------------------------------

def test_license_files_exist_and_are_declared():
    project = PYPROJECT["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE", "THIRD_PARTY_NOTICES.md"]
    license_text = (ROOT / "LICENSE").read_text()
    assert "BSD 3-Clause License" in license_text and "The flashcute authors" in license_text
    notices = (ROOT / "THIRD_PARTY_NOTICES.md").read_text()
    for needle in ("NVIDIA CORPORATION", "Wenzel Jakob", "Thibaut Goetghebuer-Planchon",
                   "CUDA Runtime", "Redistribution and use in source and binary forms"):
        assert needle in notices, needle


def test_pyproject_declares_torch_floor_classifiers_and_test_extra():
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    assert extras["torch"] == ["torch>=2.4"]
    assert not any(req.startswith("torch") for req in extras["test"])  # the tests skip without it
    assert not any(req.startswith("torch") for req in project["dependencies"])
    classifiers = set(project["classifiers"])
    assert {"Environment :: GPU :: NVIDIA CUDA :: 13", "Programming Language :: Python :: 3",
            "Topic :: Scientific/Engineering :: Artificial Intelligence"} <= classifiers
    # PEP 639: the license is the SPDX expression; a License classifier beside it is an error.
    assert not any(c.startswith("License ::") for c in classifiers)


def _metadata_from_source(tmp_path: Path) -> tuple[str, list[str]]:
    """METADATA and the license files of a wheel of this tree, built without compiling."""
    build = pytest.importorskip("scikit_build_core.build")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "CMakeLists.txt", *PYPROJECT["project"]["license-files"]):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "python", src / "python")
    out = tmp_path / "out"
    out.mkdir()
    cwd = os.getcwd()
    os.chdir(src)
    try:
        dist_info = out / build.prepare_metadata_for_build_wheel(str(out))
    finally:
        os.chdir(cwd)
    licenses = sorted(p.name for p in (dist_info / "licenses").iterdir())
    return (dist_info / "METADATA").read_text(), licenses


def _metadata_installed_from_this_tree() -> tuple[str, list[str]] | None:
    """The installed distribution's METADATA and license files, if a non-editable install of
    this tree (as in CI); None otherwise."""
    try:
        dist = metadata.distribution("flashcute")
    except metadata.PackageNotFoundError:
        return None
    direct_url = dist.read_text("direct_url.json")
    if not direct_url:
        return None
    origin = json.loads(direct_url)
    url = urllib.parse.urlparse(origin.get("url", ""))
    if origin.get("dir_info", {}).get("editable") or url.scheme != "file":
        return None
    if Path(urllib.parse.unquote(url.path)).resolve() != ROOT:
        return None
    licenses = sorted(Path(f).name for f in dist.files or [] if "licenses" in Path(f).parts)
    return dist.read_text("METADATA") or "", licenses


def test_wheel_metadata_and_license_files(tmp_path):
    installed = _metadata_installed_from_this_tree()
    text, licenses = installed if installed is not None else _metadata_from_source(tmp_path)
    assert licenses == ["LICENSE", "THIRD_PARTY_NOTICES.md"]
    assert "License-Expression: BSD-3-Clause" in text
    assert 'Requires-Dist: torch>=2.4; extra == "torch"' in text
    assert f"Version: {VERSION}" in text
    assert "Classifier: Environment :: GPU :: NVIDIA CUDA :: 13" in text


# torch -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["2.3.1", "2.3.0+cu121", "1.13.1", "2.0.0a0+git1234"])
def test_torch_older_than_2_4_is_refused(version):
    with pytest.raises(ImportError, match=r"torch>=2\.4.*" + re.escape(version)):
        _torch_version.require_torch(version)


@pytest.mark.parametrize("version", ["2.4.0", "2.4.0a0+gitf70bd71", "2.10.1", "2.13.0+cpu", "3.0.0"])
def test_torch_2_4_and_newer_pass(version):
    _torch_version.require_torch(version)


def test_torch_route_refuses_old_torch(monkeypatch):
    """The first torch call imports flashcute._torch_ops; with torch < 2.4 that import says
    what is needed instead of failing on a missing torch.library API."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    monkeypatch.delitem(sys.modules, "flashcute._torch_ops", raising=False)
    with pytest.raises(ImportError, match=r"torch>=2\.4"):
        importlib.import_module("flashcute._torch_ops")


def test_suite_passes_without_torch():
    """`pip install .[test]` brings no torch: every other test must pass or skip without it."""
    script = ("import sys; sys.modules['torch'] = None; import pytest; "
              "sys.exit(pytest.main(sys.argv[1:]))")
    ignored = ["test_packaging.py", "test_cmake_consumer.py", "test_host_plans.py"]
    args = [sys.executable, "-c", script, str(ROOT / "tests"), "-q", "-p", "no:cacheprovider",
            *[f"--ignore={ROOT / 'tests' / name}" for name in ignored]]
    result = subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:]


# CMake configure -------------------------------------------------------------------------------

def _cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    return cmake


def _nvcc() -> str | None:
    candidates = [os.environ.get("CUDACXX", "").split(" ")[0], shutil.which("nvcc") or ""]
    candidates += [os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_PATH", "CUDA_HOME")
                   if os.environ.get(v)]
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str]:
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, timeout=timeout)
    return result.returncode, result.stdout


def _map_archs(tmp_path: Path, cases: list[tuple[str, str]]) -> tuple[int, str]:
    """Runs flashcute_map_archs in CMake's script mode on (request, native) pairs; each result
    is printed as `request => ampere | hopper`."""
    lines = ["cmake_minimum_required(VERSION 3.24)",
             f'include("{(ROOT / "cmake" / "FlashcuteArchs.cmake").as_posix()}")']
    for request, native in cases:
        lines.append(f'flashcute_map_archs("{request}" CUDAARCHS "{native}" ampere hopper)')
        lines.append(f'message(STATUS "{request} => ${{ampere}} | ${{hopper}}")')
    script = tmp_path / "map_archs.cmake"
    script.write_text("\n".join(lines) + "\n")
    return _run([_cmake(), "-P", str(script)])


def test_cuda_arch_request_maps_onto_the_two_paths(tmp_path):
    cases = {
        "86-real": "86-real | ",
        "80": "80 | ",
        "90": "90 | 90a-real",
        "90a-real": "90-real | 90a-real",
        "90-virtual": "90-virtual | ",
        "80-real;86-real;90a": "80-real;86-real;90 | 90a-real",
        "75;80-real": "80-real | ",
        "90-real;100": "90-real;90-virtual | 90a-real",
        "120f": "90-virtual | ",
        "all": "80;90-real | 90a-real",
        "all-major": "80;90-real | 90a-real",
    }
    code, out = _map_archs(tmp_path, [(request, "") for request in cases] + [("native", "89-real")])
    assert code == 0, out
    for request, expected in {**cases, "native": "89-real | "}.items():
        assert f"-- {request} => {expected}\n" in out, (request, out)
    assert "CUDAARCHS lists 75: flashcute needs sm80 or newer" in out
    assert "CUDAARCHS lists 100: flashcute has no kernels for them" in out


@pytest.mark.parametrize("ampere_archs, sm90_dims, expected", [
    ("80;90-real", "64;128;256", "32;96;192"),   # the default build
    ("80;90-real", "all", ""),
    ("80;90-real", "32;64;96;128;192;256", ""),
    ("90", "64;128;256", ""),          # compute_90 PTX, which newer GPUs compile, keeps them all
    ("80;90-real;90-virtual", "64;128;256", ""),
    ("80-real;86-real", "64;128;256", ""),  # no sm90 code at all
    ("80;90a-real", "128", "32;64;96;192;256"),
])
def test_ampere_head_dims_without_sm90_code(tmp_path, ampere_archs, sm90_dims, expected):
    """flashcute_ampere_sm80_only in CMake's script mode: the Ampere-path head dims whose
    kernels get empty sm90 bodies (FLASHCUTE_AMPERE_SM90_HEAD_DIMS)."""
    script = tmp_path / "sm80_only.cmake"
    script.write_text("\n".join([
        "cmake_minimum_required(VERSION 3.24)",
        f'include("{(ROOT / "cmake" / "FlashcuteArchs.cmake").as_posix()}")',
        f'set(FLASHCUTE_AMPERE_ARCHS "{ampere_archs}")',
        'set(FLASHCUTE_AMPERE_HEAD_DIMS "32;64;96;128;192;256")',
        f'set(FLASHCUTE_AMPERE_SM90_HEAD_DIMS "{sm90_dims}")',
        "flashcute_ampere_sm80_only(only)",
        'message(STATUS "only=[${only}]")',
    ]) + "\n")
    code, out = _run([_cmake(), "-P", str(script)])
    assert code == 0, out
    assert f"-- only=[{expected}]\n" in out, out


@pytest.mark.parametrize("request_, message", [
    ("sm_90", "'sm_90' is not a CUDA architecture"),
    ("70;75", "names no arch flashcute can run on"),
    ("native", "CMake found no GPU here"),
])
def test_cuda_arch_request_errors(tmp_path, request_, message):
    code, out = _map_archs(tmp_path, [(request_, "")])
    assert code != 0
    assert message in re.sub(r"\s+", " ", out), out


def _generate_kernels(tmp_path: Path, dtypes: str, head_dims: str, pairs: str = "") -> tuple[int, str]:
    """Runs flashcute_generate_kernels in CMake's script mode on the Hopper forward's template;
    prints the generated units and the registry's X-macros."""
    lines = ["cmake_minimum_required(VERSION 3.24)",
             f'set(CMAKE_CURRENT_BINARY_DIR "{tmp_path.as_posix()}")',
             f'include("{(ROOT / "cmake" / "FlashcuteKernels.cmake").as_posix()}")',
             "flashcute_generate_kernels(",
             f'  TEMPLATE "{(ROOT / "cpp" / "hopper" / "fwd_instance.inc.in").as_posix()}"',
             "  PREFIX hopper/fwd SUPPORTED 64 96 128 192 256 192,128",
             f'  HEAD_DIMS "{head_dims}" PAIRS "{pairs}" DTYPES "{dtypes}"',
             "  OUT_SOURCES units OUT_XMACRO xmacro OUT_PAIR_XMACRO pair_xmacro)",
             'message(STATUS "units: ${units}")',
             'message(STATUS "xmacro: ${xmacro}")',
             'message(STATUS "pairs: ${pair_xmacro}")']
    script = tmp_path / "generate_kernels.cmake"
    script.write_text("\n".join(lines) + "\n")
    return _run([_cmake(), "-P", str(script)])


def test_one_unit_per_head_dim_holds_every_dtype(tmp_path):
    code, out = _generate_kernels(tmp_path, "float16;bfloat16", "64;128", "192,128")
    assert code == 0, out
    gen = tmp_path / "generated" / "hopper"
    units = re.search(r"-- units: (.*)", out).group(1).split(";")
    assert [Path(u).name for u in units] == ["fwd_fp16_bf16_hd64.cu", "fwd_fp16_bf16_hd128.cu",
                                             "fwd_fp16_bf16_hd192_dv128.cu"]
    for unit, suffix in zip(units, ("hd64", "hd128", "hd192_dv128")):
        includes = re.findall(r'#include "(.*)"', Path(unit).read_text())
        assert includes == [f"hopper/fwd_fp16_{suffix}.inc", f"hopper/fwd_bf16_{suffix}.inc"]
    instance = (gen / "fwd_bf16_hd192_dv128.inc").read_text()
    assert "Status fwd_bf16_hd192_dv128(" in instance
    assert "run_fwd<cutlass::bfloat16_t, 192, 128>" in instance
    assert "run_fwd<cutlass::half_t, 128>" in (gen / "fwd_fp16_hd128.inc").read_text()
    assert "-- xmacro: X(fp16, kFloat16, 64) X(bf16, kBFloat16, 64) X(fp16, kFloat16, 128) " \
           "X(bf16, kBFloat16, 128) \n" in out
    assert "-- pairs: X(fp16, kFloat16, 192, 128) X(bf16, kBFloat16, 192, 128) \n" in out


def test_one_dtype_keeps_its_unit_name_and_bad_lists_stop(tmp_path):
    code, out = _generate_kernels(tmp_path, "float8_e4m3", "128")
    assert code == 0, out
    assert re.search(r"-- units: \S*/hopper/fwd_e4m3_hd128\.cu\n", out), out
    assert "-- xmacro: X(e4m3, kFloat8E4M3, 128) \n" in out
    code, out = _generate_kernels(tmp_path, "bfloat16", "72")
    assert code != 0 and "head dim 72 not supported" in out, out
    code, out = _generate_kernels(tmp_path, "float32", "128")
    assert code != 0 and "unknown dtype 'float32'" in out, out


def _fake_cutlass(tmp_path: Path) -> Path:
    """A CUTLASS_DIR that satisfies the configure step's header search (nothing is compiled)."""
    cute = tmp_path / "cutlass" / "include" / "cute"
    cute.mkdir(parents=True)
    (cute / "tensor.hpp").write_text("")
    return tmp_path / "cutlass"


def _build_config(build: Path) -> dict[str, str]:
    text = (build / "generated" / "build_config.h").read_text()
    return dict(re.findall(r'#define (FLASHCUTE_\w+) "([^"]*)"', text))


def test_configure_honours_cuda_architectures_and_reads_the_version(tmp_path):
    """A plain CMake configure (the C++ package's route): the version is pyproject.toml's; the
    archs follow CMAKE_CUDA_ARCHITECTURES or CUDAARCHS unless FLASHCUTE_*_ARCHS are given, and
    CUDAARCHS does not stick to the build tree."""
    cmake, nvcc = _cmake(), _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc: the configure step enables CUDA")
    build = tmp_path / "build"
    base = [cmake, "-S", str(ROOT), "-B", str(build), "-DFLASHCUTE_BUILD_PYTHON=OFF",
            f"-DCUTLASS_DIR={_fake_cutlass(tmp_path)}", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    if shutil.which("ninja"):
        base += ["-G", "Ninja"]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDAARCHS", "CUDACXX")}

    def configure(*extra: str, **extra_env: str) -> dict[str, str]:
        code, out = _run([*base, *extra], env={**env, **extra_env})
        assert code == 0, out
        return _build_config(build)

    config = configure()
    assert config["FLASHCUTE_VERSION"] == VERSION
    assert f'"{VERSION}"' in (build / "flashcuteConfigVersion.cmake").read_text()
    assert config["FLASHCUTE_CUDA_ARCHS"] == "80;90-real;90a-real"
    assert config["FLASHCUTE_HOPPER_HEAD_DIMS"] == "64;96;128;192;256"

    config = configure(CUDAARCHS="89-real")
    assert config["FLASHCUTE_CUDA_ARCHS"] == "89-real"
    assert config["FLASHCUTE_HOPPER_HEAD_DIMS"] == config["FLASHCUTE_HOPPER_BWD_HEAD_DIMS"] == ""

    assert configure()["FLASHCUTE_CUDA_ARCHS"] == "80;90-real;90a-real"

    config = configure("-DCMAKE_CUDA_ARCHITECTURES=90", "-DFLASHCUTE_AMPERE_ARCHS=80")
    assert config["FLASHCUTE_CUDA_ARCHS"] == "80;90a-real"


def test_configure_without_nvcc_says_what_to_install(tmp_path):
    cmake = _cmake()
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    ninja = shutil.which("ninja")
    if cxx is None or ninja is None:
        pytest.skip("needs c++ and ninja on PATH")
    # Every directory holding an nvcc is hidden from CMake's searches and from PATH; the C++
    # compiler and ninja are named by full path so that they need no search.
    dirs = [*os.environ.get("PATH", "").split(os.pathsep), "/usr/local/cuda/bin", "/usr/local/bin",
            "/usr/bin", "/bin", *[os.path.join(os.environ[v], "bin")
                                  for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]]
    hidden = sorted({d for d in dirs if d and os.path.exists(os.path.join(d, "nvcc"))})
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_PATH", "CUDA_HOME")}
    env["PATH"] = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                  if d not in hidden)
    base = [cmake, "-S", str(ROOT), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
            f"-DCMAKE_CXX_COMPILER={cxx}", "-DFLASHCUTE_BUILD_PYTHON=OFF",
            f"-DCUTLASS_DIR={_fake_cutlass(tmp_path)}", f"-DCMAKE_IGNORE_PATH={';'.join(hidden)}"]
    runs = {
        "no CUDA compiler: nvcc is not on PATH": env,
        "CUDACXX is '/nonexistent/nvcc', which is not a program": {**env, "CUDACXX": "/nonexistent/nvcc"},
    }
    for i, (why, run_env) in enumerate(runs.items()):
        code, out = _run([*base, "-B", str(tmp_path / f"build{i}")], env=run_env)
        flat = re.sub(r"\s+", " ", out)
        assert code != 0, out
        assert why in flat, out
        assert "needs the NVIDIA CUDA toolkit 12.1 or newer" in flat, out
        assert "CUDACXX=/usr/local/cuda/bin/nvcc pip install ." in flat, out

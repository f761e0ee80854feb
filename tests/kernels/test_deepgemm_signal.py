"""The patched-DeepGEMM producer's host side (kernels/deepgemm_signal.py), on the CPU: locating and
patching the installed headers, configs, the generated source (compiled with nvcc where it is
installed: no GPU needed), operand and layout checks.

The patch itself is checked against the release it names: an unpacked sgl-deep-gemm 0.1.4.post1
wheel from SGLANG_OVERLAP_DEEPGEMM_014 (.ci/run sets it), else downloaded once with pip into
~/.cache/sglang-overlap. The kernel itself runs in tests/gpu/test_deepgemm_signal.py.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from sglang_overlap.kernels import deepgemm_signal as ds
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from tests.conftest import prerequisite_missing

WHEEL_ENV = "SGLANG_OVERLAP_DEEPGEMM_014"


def _fetch_dg014(target: Path) -> str | None:
    """Download the sgl-deep-gemm 0.1.4.post1 wheel (4.7 MB, pure headers + a prebuilt
    extension we never load) and unpack its deep_gemm/ folder into `target`; None or why not."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", "--platform",
             "manylinux2014_x86_64", "-d", tmp, "sgl-deep-gemm==0.1.4.post1"],
            capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob("sgl_deep_gemm-0.1.4.post1-*.whl"))
        if proc.returncode or not wheels:
            return f"pip download sgl-deep-gemm==0.1.4.post1 failed: {proc.stderr.strip()[-300:]}"
        staging = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(staging, [n for n in zf.namelist() if n.startswith("deep_gemm/")
                                    and not n.endswith(".so")])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(target))
    return None


@pytest.fixture(scope="module")
def dg014() -> Path:
    """The unpacked sgl-deep-gemm 0.1.4.post1 wheel (a folder holding deep_gemm/): from
    SGLANG_OVERLAP_DEEPGEMM_014, else downloaded once into the user cache."""
    root = os.environ.get(WHEEL_ENV)
    if root:
        path = Path(root)
    else:
        path = Path(os.path.expanduser("~/.cache/sglang-overlap/sgl-deep-gemm-0.1.4.post1"))
        if not (path / "deep_gemm" / "include" / ds.KERNEL_HEADER).is_file():
            why = _fetch_dg014(path)
            if why is not None:
                prerequisite_missing(f"{why} (or set {WHEEL_ENV} to an unpacked wheel)")
    if not (path / "deep_gemm" / "include" / ds.KERNEL_HEADER).is_file():
        prerequisite_missing(f"{path} holds no sgl-deep-gemm 0.1.4.post1 headers ({WHEEL_ENV})")
    return path


# --- the patch ---------------------------------------------------------------------------------


def test_patch_applies_to_the_release_it_names(dg014: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    source = ds.locate([str(dg014)])
    assert source.version == "0.1.4.post1"
    header = source.include / ds.KERNEL_HEADER
    before = hashlib.sha256(header.read_bytes()).hexdigest()
    patched = ds.apply_patch(header.read_text(), ds.patch_text(source.spec))
    assert "int* signal" in patched and "kSignalMode" in patched and "red_add_rel" in patched
    if shutil.which("patch"):  # the strict applier agrees with GNU patch
        work = tmp_path / "gnu"
        shutil.copytree(dg014 / "deep_gemm" / "include", work / "deep_gemm" / "include")
        path = ds.PATCH_DIR / source.version / source.spec.patch
        subprocess.run(["patch", "-s", "-p1", "-d", str(work), "-i", str(path)], check=True)
        assert (work / "deep_gemm" / "include" / ds.KERNEL_HEADER).read_text() == patched
    monkeypatch.setenv(ds.CACHE_ENV, str(tmp_path / "cache"))
    include = ds.prepared_include(source)
    assert (include / ds.KERNEL_HEADER).read_text() == patched
    assert (include / "cute").is_dir() and (include / "cutlass").is_dir()
    assert hashlib.sha256(header.read_bytes()).hexdigest() == before, "the wheel was modified"
    assert ds.prepared_include(source) == include  # built once


def test_a_changed_header_is_refused(dg014: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(dg014 / "deep_gemm", site / "deep_gemm")
    header = site / "deep_gemm" / "include" / ds.KERNEL_HEADER
    text = header.read_text().replace("Scheduler<kGemmType", "Scheduler< kGemmType", 1)
    header.write_text(text)
    with pytest.raises(ds.DgSignalError, match="not the one the signal patch was made for"):
        ds.locate([str(site)])
    spec = ds.PATCHES["0.1.4.post1"]
    edited = text.replace("namespace deep_gemm {", "namespace deep_gemm  {", 1)  # hunk 1's context
    with pytest.raises(ValueError, match="patch hunk 1 does not match"):
        ds.apply_patch(edited, ds.patch_text(spec))


def test_the_installed_deep_gemm_is_named_when_not_covered() -> None:
    """Against whatever deep_gemm this environment has (sglang 0.5.23 installs 0.2.x)."""
    from sglang_overlap.kernels.capabilities import package_dir, package_version

    if package_dir("deep_gemm") is None:
        assert ds.probe() == "deep_gemm is not installed"
        return
    version = package_version("deep_gemm")
    if version in ds.PATCHES:
        pytest.skip(f"deep_gemm {version} is the patched release")
    why = ds.probe()
    assert why is not None and f"deep_gemm {version}" in why and "0.1.4.post1" in why


def test_apply_patch_is_strict() -> None:
    original = "a\nb\nc\nd\n"
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -4 +4,2 @@\n d\n+e\n"
    assert ds.apply_patch(original, patch) == "a\nB\nc\nd\ne\n"
    with pytest.raises(ValueError, match="hunk 1 does not match line 2"):
        ds.apply_patch("a\nx\nc\nd\n", patch)
    with pytest.raises(ValueError, match="no hunk"):
        ds.apply_patch(original, "just text\n")


# --- configs and source --------------------------------------------------------------------------


@pytest.mark.parametrize(("e", "m", "cap", "want"), [
    (8, 64, 256, (64, 160)),  # 360 tiles: 3 waves of 132, the fullest last wave
    (8, 128, 128, (128, 160)),
    (8, 128, 192, (64, 192)),  # 128-row tiles would cross into the next expert
    (32, 16, 64, (64, 192)),
])
def test_default_config_follows_the_wave_rule(e: int, m: int, cap: int,
                                              want: tuple[int, int]) -> None:
    cfg = ds.default_config(e, m, cap, 7168, 2048, 132)
    assert (cfg.block_m, cfg.block_n) == want
    assert cfg.num_stages == ds.max_stages(*want, 2048)


def test_smem_matches_the_kernel_layout() -> None:
    # 64x112, 9 stages, K 2048: D 14336 + 9 x (A 8192 + B 14336 + A scales 256) + B scales 128
    # (two rows: 112 does not divide 128) + 18 pipeline barriers + 4 signal barriers
    assert ds.smem_size(64, 112, 9, 2048, signals=False) == 14336 + 9 * 22784 + 128 + 144
    assert ds.smem_size(64, 112, 9, 2048) == ds.smem_size(64, 112, 9, 2048, False) + 32
    for bm in (64, 128):
        for bn in ds.block_n_candidates():
            stages = ds.max_stages(bm, bn, 2048)
            assert ds.smem_size(bm, bn, stages, 2048) <= ds.SMEM_CAPACITY
            assert ds.smem_size(bm, bn, stages + 1, 2048) > ds.SMEM_CAPACITY or stages == 32


def test_kernel_source_instantiates_the_patched_template() -> None:
    cfg = ds.DgSignalConfig(128, 192, 4, eager=True, multicast=2, multicast_on_a=True)
    text = ds.kernel_source(cfg, num_groups=16, n=7168, k=2048, num_sms=128, mode="block",
                            unit_m=64)
    assert f"#include <{ds.KERNEL_HEADER}>" in text
    assert ("cute::UMMA::Major::K, 0, 7168, 2048, 16, 128, 192, 128, 128, 128, 128, 4, 128, "
            "256, 2, true, 128,") in text
    assert text.rstrip().endswith("1, 64, true, false>);\n}".rstrip())
    plain = ds.kernel_source(ds.DgSignalConfig(64, 160, 7), num_groups=8, n=7168, k=2048,
                             num_sms=132, mode="none", unit_m=64)
    assert ", 64, 7, 128, 128, 1, false, 132," in plain and "0, 64, false, false>" in plain
    store = ds.DgSignalConfig(64, 160, 7, store_warp=True)
    assert "2, 64, false, true>" in ds.kernel_source(store, num_groups=8, n=7168, k=2048,
                                                      num_sms=132, mode="expert", unit_m=64)
    # signals off: no timing applies (no signalling lane to store from), so it is DeepGEMM's
    for timed in (store, ds.DgSignalConfig(64, 160, 7, eager=True)):
        assert ds.kernel_source(timed, num_groups=8, n=7168, k=2048, num_sms=132, mode="none",
                                unit_m=64) == plain
    with pytest.raises(ValueError, match="multiple of the signal's 128 rows"):
        ds.kernel_source(ds.DgSignalConfig(64, 128, 3), num_groups=1, n=256, k=128,
                         num_sms=2, mode="block", unit_m=128)


NVCC_CASES = [  # (config, mode): every signal timing, both forms, multicast, a 9-slab store
    (ds.DgSignalConfig(64, 160, 7), "none"),
    (ds.DgSignalConfig(64, 160, 7), "block"),
    (ds.DgSignalConfig(64, 112, 9, eager=True), "expert"),
    (ds.DgSignalConfig(64, 160, 7, store_warp=True), "block"),
    (ds.DgSignalConfig(128, 144, 5, store_warp=True, multicast=2), "expert"),
]


def test_every_signal_timing_compiles_with_nvcc(dg014: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched kernel builds with nvcc (no GPU needed) in every timing and form, and each
    instantiation is its own cubin."""
    try:
        ds.nvcc_path()
    except ds.DgSignalError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv(ds.CACHE_ENV, str(tmp_path / "cache"))
    include = ds.prepared_include(ds.locate([str(dg014)]))
    texts = [ds.kernel_source(cfg, num_groups=8, n=7168, k=2048, num_sms=132, mode=mode,
                              unit_m=64) for cfg, mode in NVCC_CASES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda t: ds.compile_cubin(t, include), texts))
    assert len(set(cubins)) == len(NVCC_CASES)
    for cubin in cubins:
        assert b"sm90_fp8_gemm_1d2d_impl" in cubin.read_bytes()
    assert ds.compile_cubin(texts[0], include) == cubins[0]  # cached


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block_m must be 64 or 128"):
        ds.DgSignalConfig(32, 128, 4)
    with pytest.raises(ValueError, match="block_n must be one of"):
        ds.DgSignalConfig(64, 176, 4)
    with pytest.raises(ValueError, match="multicast must be 1 or 2"):
        ds.DgSignalConfig(64, 128, 4, multicast=4)
    with pytest.raises(ValueError, match="eager and store_warp are two signal timings"):
        ds.DgSignalConfig(64, 128, 4, eager=True, store_warp=True)
    ds.DgSignalConfig(64, 112, 9, multicast=2).check_launch(7168, 132)  # 64 n tiles
    with pytest.raises(ValueError, match="even number of n tiles"):
        ds.DgSignalConfig(64, 160, 7, multicast=2).check_launch(7168, 132)  # 45 n tiles
    with pytest.raises(ValueError, match="even SM count"):
        ds.DgSignalConfig(64, 128, 8, multicast=2).check_launch(7168, 129)


# --- operands and layouts ------------------------------------------------------------------------


def _operands(e: int = 2, cap: int = 128, n: int = 256, k: int = 256):
    a = torch.zeros((e, cap, k), dtype=torch.float8_e4m3fn)
    a_s = torch.ones((e, cap, k // 128))
    b = torch.zeros((e, n, k), dtype=torch.float8_e4m3fn)
    b_s = torch.ones((e, -(-n // 128), k // 128))
    out = torch.empty((e, cap, n), dtype=torch.bfloat16)
    return a, a_s, b, b_s, out, torch.zeros(e, dtype=torch.int32)


@pytest.mark.parametrize(("change", "match"), [
    ({"cap": 96}, "capacity 96 is not a multiple of block_m 64"),
    ({"k": 200}, "K % 128 == 0"),
])
def test_bad_shapes_are_refused(change: dict, match: str) -> None:
    args = {"e": 2, "cap": 128, "n": 256, "k": 256, **change}
    if args["k"] % 128:
        a, a_s, b, b_s, out, masked = _operands(2, 128, 256, 256)
        a = torch.zeros((2, 128, 200), dtype=torch.float8_e4m3fn)
        b = torch.zeros((2, 256, 200), dtype=torch.float8_e4m3fn)
    else:
        a, a_s, b, b_s, out, masked = _operands(**args)
    with pytest.raises(ValueError, match=match):
        ds.check_operands(a, a_s, b, b_s, out, masked, ds.DgSignalConfig(64, 128, 4))


def test_bad_dtypes_and_scales_are_refused() -> None:
    cfg = ds.DgSignalConfig(64, 128, 4)
    a, a_s, b, b_s, out, masked = _operands()
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        ds.check_operands(a.float(), a_s, b, b_s, out, masked, cfg)
    with pytest.raises(ValueError, match="out must be bfloat16"):
        ds.check_operands(a, a_s, b, b_s, out.float(), masked, cfg)
    with pytest.raises(ValueError, match=r"a_scale must be \[E, C, K/128\]"):
        ds.check_operands(a, a_s[:, :64], b, b_s, out, masked, cfg)
    with pytest.raises(ValueError, match="masked_m must be int32"):
        ds.check_operands(a, a_s, b, b_s, out, masked.long(), cfg)
    with pytest.raises(ValueError, match="must be on a's CUDA device"):  # all checks passed
        ds.check_operands(a, a_s, b, b_s, out, masked, cfg)


def test_activation_scales_are_laid_out_mn_major() -> None:
    from sglang_overlap.kernels import fp8

    scales = torch.randn((3, 70, 16))  # rows not a multiple of 4, K-major
    got = ds.mn_major_scales(scales)
    assert torch.equal(got, scales)
    assert got.stride() == (16 * fp8.tma_aligned_rows(70), 1, fp8.tma_aligned_rows(70))
    assert ds.mn_major_scales(got) is got


def _layout(granularity: str, block_m: int, block_n: int, cap: int = 256):
    return plan_sbo_layout(num_local_experts=8, capacity=cap, block_m=block_m, block_n=block_n,
                           hidden=7168, num_sms=132, comm_num_sms=4,
                           granularity=granularity)  # type: ignore[arg-type]


def test_layout_must_count_the_kernel_tiles() -> None:
    cfg = ds.DgSignalConfig(128, 160, 5)
    assert ds.layout_mode(None, cfg, 7168) == ("none", 64)
    assert ds.layout_mode(_layout("block", 64, 160), cfg, 7168) == ("block", 64)
    assert ds.layout_mode(_layout("expert", 128, 160), cfg, 7168) == ("expert", 64)
    with pytest.raises(ValueError, match="counts tiles of 128 columns"):
        ds.layout_mode(_layout("block", 64, 128), cfg, 7168)
    with pytest.raises(ValueError, match="counts 64-row blocks"):
        ds.layout_mode(_layout("expert", 64, 160), cfg, 7168)
    with pytest.raises(ValueError, match="multiple of it"):
        ds.layout_mode(_layout("block", 128, 160), ds.DgSignalConfig(64, 160, 7), 7168)

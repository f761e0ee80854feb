"""Tests for sglang_overlap/compat.py: the compatibility table as code, and README.md's copy."""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

import pytest

from sglang_overlap import compat
from sglang_overlap.compat import Stack, evaluate
from sglang_overlap.planning.sbo_path import Capabilities, SboRequest, decide_sbo_path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PATCHED = compat.patched_deep_gemm_versions()
HOPPER = Stack(arch="sm90", sglang="0.5.23", deep_ep="0.1.2.post1",
               deep_ep_forms=("per_expert",), deep_gemm=PATCHED[0], nvcc=True, triton=True)


def test_patched_versions_come_from_the_patch_table() -> None:
    from sglang_overlap.kernels.signal_deepgemm.versions import RELEASES

    assert set(PATCHED) == set(RELEASES) and "0.1.4.post1" in PATCHED


def test_version_order() -> None:
    key = compat._version_key  # noqa: SLF001
    assert sorted(["0.2.5", "0.1.4.post1", "0.2.3.post2", "0.2.10"], key=key) == [
        "0.1.4.post1", "0.2.3.post2", "0.2.5", "0.2.10"]


def test_hopper_fast_path_serves() -> None:
    v = evaluate(HOPPER)
    assert v.matched == ("sm90-patched-deepgemm", "sm90-triton", "sm90-no-signal",
                         "any-torch-a2a")
    assert v.fast_path == "sm90-patched-deepgemm" and v.fast_path_serves and v.missing == ()


def test_hopper_other_deep_gemm_names_the_install() -> None:
    v = evaluate(Stack(**{**HOPPER.__dict__, "deep_gemm": "9.9.9"}))
    assert v.matched[0] == "sm90-triton" and not v.fast_path_serves
    assert len(v.missing) == 1
    want = "0.2.3.post2" if "0.2.3.post2" in PATCHED else PATCHED[-1]  # sglang 0.5.23's pin
    assert v.missing[0][1] == f"pip install sgl-deep-gemm=={want}"


def test_hopper_without_nvcc_or_deep_ep() -> None:
    v = evaluate(Stack(**{**HOPPER.__dict__, "nvcc": False, "deep_ep": None,
                          "deep_ep_forms": ()}))
    assert [fix for _, fix in v.missing] == ["pip install sgl-deep-ep==0.1.2.post1",
                                             "install the CUDA toolkit's nvcc and set CUDA_HOME"]
    assert v.matched == ("any-torch-a2a",)


def test_other_sglang_matches_nothing() -> None:
    v = evaluate(Stack(**{**HOPPER.__dict__, "sglang": "0.5.24"}))
    assert v.matched == () and ("sglang 0.5.23", "pip install sglang==0.5.23") in v.missing


def test_cpu_has_no_fast_path() -> None:
    v = evaluate(Stack(arch="cpu", sglang="0.5.23", deep_ep=None, deep_ep_forms=(),
                       deep_gemm=None, nvcc=False, triton=False))
    assert v.matched == ("any-torch-a2a",) and v.fast_path is None and v.missing == ()
    assert v.to_dict() == {"matched": ["any-torch-a2a"], "fast_path": None,
                           "fast_path_serves": False, "missing": []}


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_first_matched_row_is_the_path_the_server_decides(arch: str) -> None:
    """Over every combination of kernel facts, the table's first DeepEP row that matches names
    the SBO path `planning.sbo_path` decides for SBO with DeepEP and default flags."""
    by_name = {r.name: r for r in compat.rows()}
    for forms, dg, nvcc, triton in itertools.product(
            [(), ("per_expert",), ("per_block",), ("per_block", "per_expert")],
            [None, PATCHED[0], "9.9.9"], [True, False], [True, False]):
        stack = Stack(arch=arch, sglang="0.5.23", deep_ep="x" if forms else "0.0.1",  # type: ignore[arg-type]
                      deep_ep_forms=forms, deep_gemm=dg, nvcc=nvcc, triton=triton)
        caps = Capabilities(arch=arch, deep_ep_version=stack.deep_ep,  # type: ignore[arg-type]
                            deep_ep_combine_forms=forms, deep_gemm_version=dg,
                            deep_gemm_signal=False, plugin_signal_gemm=triton)
        decided = decide_sbo_path(caps, SboRequest())
        first = next((n for n in evaluate(stack).matched if n != "any-torch-a2a"), None)
        if arch == "sm100" and "per_expert" not in forms:
            assert first is None and decided.path is not None, f"{stack=}"
            continue
        assert first is not None, f"{stack=}"
        assert by_name[first].sbo == (decided.path.value if decided.path else None), (
            f"{stack=} {first=} {decided=}")


def test_readme_carries_the_table() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert compat.markdown_table() in readme, "README.md's compatibility table is stale: paste " \
        "`python -c 'from sglang_overlap.compat import markdown_table; print(markdown_table())'`"
    assert f"`{compat.fast_path_install()}`" in readme


def test_fast_path_install_meets_the_fast_path_row() -> None:
    words = compat.fast_path_install().split()
    pins = dict(w.split("==") for w in words if "==" in w)
    stack = Stack(arch="sm90", sglang="0.5.23", deep_ep=pins["sgl-deep-ep"],
                  deep_ep_forms=("per_expert",), deep_gemm=pins["sgl-deep-gemm"], nvcc=True,
                  triton=True)
    assert evaluate(stack).fast_path_serves


def test_markdown_table_shape() -> None:
    lines = compat.markdown_table().splitlines()
    assert len(lines) == 2 + len(compat.rows())
    assert {line.count("|") for line in lines} == {9}, "a cell holds a '|'"


def _extra_pin(extra: str, package: str) -> str:
    """The exact version pyproject.toml's `extra` pins `package` to (`package==X`)."""
    reqs = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]
    pins = [r for r in reqs if re.fullmatch(rf"{re.escape(package)}\s*==\s*\S+", r)]
    assert len(pins) == 1, f"{extra=} {package=} {reqs=}"
    return pins[0].split("==", 1)[1].strip()


def test_the_sglang_extra_pins_the_supported_version() -> None:
    pin = _extra_pin("sglang", "sglang")
    assert pin == compat.SUPPORTED_SGLANG, f"{pin=} {compat.SUPPORTED_SGLANG=}"


def test_the_guard_and_the_launcher_use_the_supported_version() -> None:
    from sglang_overlap.launch.commands import INSTALL
    from sglang_overlap.sglang import guard

    unsupported = "this version is not supported"
    assert guard.check([], version=compat.SUPPORTED_SGLANG).mismatch != unsupported
    for other in (compat.SUPPORTED_SGLANG + ".post9", compat.SUPPORTED_SGLANG[:-1], "0.0.1"):
        assert guard.check([], version=other).mismatch == unsupported, f"{other=}"
    assert f"supports sglang {compat.SUPPORTED_SGLANG};" in guard.check(
        [], version=other).message()
    assert INSTALL["sglang"] == f"sglang=={_extra_pin('sglang', 'sglang')}"

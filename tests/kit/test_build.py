"""tests/kit/build.py: the CPU kit builds from scratch into an empty cache, its stand-in libraries
answer as a machine without a GPU or RDMA device would, SGLang can find its plugin, a second
build reuses the first, and a missing compiler is one line saying what to install."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kit import build

CUDA_ERROR_STUB_LIBRARY = 34


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> build.Kit:
    try:
        return build.build_kit(tmp_path_factory.mktemp("cpu-kit"))
    except build.KitMissing as exc:
        pytest.skip(str(exc))


def test_libcuda_stand_in_reports_a_stub_driver(kit: build.Kit) -> None:
    lib = ctypes.CDLL(str(kit.lib / "libcuda.so.1"))
    assert lib.cuInit(0) == CUDA_ERROR_STUB_LIBRARY
    assert lib.cuDeviceGetCount(None) == CUDA_ERROR_STUB_LIBRARY


def test_libibverbs_stand_in_lists_no_device(kit: build.Kit) -> None:
    lib = ctypes.CDLL(str(kit.lib / "libibverbs.so.1"))
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    num = ctypes.c_int(-1)
    devices = lib.ibv_get_device_list(ctypes.byref(num))
    assert num.value == 0 and bool(devices) and devices[0] is None  # empty, NULL-terminated
    lib.ibv_free_device_list(devices)
    lib.ibv_open_device.restype = ctypes.c_void_p
    assert lib.ibv_open_device(None) is None
    if shutil.which("readelf"):  # the symbol versions Mooncake's wheel links against
        versions = subprocess.run(["readelf", "-V", str(kit.lib / "libibverbs.so.1")],
                                  capture_output=True, text=True, check=True).stdout
        for v in ("IBVERBS_1.0", "IBVERBS_1.1", "IBVERBS_1.8", "IBVERBS_1.11"):
            assert f"Name: {v}" in versions, v


def test_cpu_shim_is_an_sglang_plugin_on_the_kits_path(kit: build.Kit) -> None:
    dists = list(importlib.metadata.distributions(path=[str(kit.site)]))
    assert [d.metadata["Name"] for d in dists] == ["sglang-overlap-cpu-shim"]
    (ep,) = dists[0].entry_points.select(group="sglang.srt.plugins")
    assert (ep.name, ep.value) == ("cpu_shim", "sglang_cpu_shim:register")
    assert (kit.site / "sglang_cpu_shim" / "__init__.py").is_file()


def test_env_puts_the_kit_first_and_keeps_the_rest(kit: build.Kit) -> None:
    base = {"LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/a:/b"}
    env = kit.env(base, pythonpath=["/repo"])
    assert env["LD_LIBRARY_PATH"] == f"{kit.lib}:/opt/lib"
    assert env["PYTHONPATH"] == f"/repo:{kit.site}:/a:/b"
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["MC_FORCE_TCP"] == "1"
    assert kit.env({})["LD_LIBRARY_PATH"] == str(kit.lib)
    sourced = subprocess.run(
        ["bash", "-c", f"unset LD_LIBRARY_PATH PYTHONPATH; source {kit.path / 'env.sh'}; "
         "echo $LD_LIBRARY_PATH; echo $PYTHONPATH; echo $SGLANG_CPU_OMP_THREADS_BIND"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    assert sourced == [str(kit.lib), str(kit.site), "0|1"]


def test_a_second_build_reuses_the_first(kit: build.Kit) -> None:
    stamp = (kit.lib / "libcuda.so.1").stat().st_mtime_ns
    again = build.build_kit(kit.path.parent)
    assert again == kit and (kit.lib / "libcuda.so.1").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in kit.path.parent.iterdir()) == [kit.path.name]  # no scratch


def test_missing_compiler_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(build.KitMissing) as info:
        build.build_kit(tmp_path / "cache")
    message = str(info.value)
    assert message.startswith("no C compiler (gcc or cc on PATH, or $CC)") and "\n" not in message
    assert "apt-get install gcc" in message
    assert not (tmp_path / "cache").exists()


def test_cache_root_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_CPU_KIT", "/somewhere/kit")
    assert build.cache_root() == Path("/somewhere/kit")
    monkeypatch.delenv("SGLANG_CPU_KIT")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert build.cache_root() == Path("/xdg/sglang-overlap/cpu-kit")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert build.cache_root() == Path(os.path.expanduser("~/.cache/sglang-overlap/cpu-kit"))


def test_pd_missing_names_the_router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = build.pd_missing()
    assert reason is not None and "smg (the PD router)" in reason, reason
    assert reason.endswith(build.INSTALL_HINT)

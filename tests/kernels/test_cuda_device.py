"""`kernels/cuda_device.py` against driver libraries compiled here: a stub libcuda.so.1 with known
answers (gcc), the CPU kit's stand-in driver (every call fails), and no library at all; and a
`sglang-overlap check` run on the stub driver that never imports torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_overlap.kernels import cuda_device
from sglang_overlap.kernels.capabilities import detect_gpu

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"
STUB = r"""
#include <string.h>
int cuInit(unsigned int flags) { return flags == 0 ? INIT_RC : 1; }
int cuDriverGetVersion(int *v) { *v = VERSION; return 0; }
int cuDeviceGetCount(int *n) { *n = COUNT; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal + 40; return ordinal < COUNT ? 0 : 101; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (dev < 40) return 101;  /* CUDA_ERROR_INVALID_DEVICE: the ordinal, not the handle */
    switch (attr) {
        case 16: *v = SMS + (dev - 40); return 0;  /* MULTIPROCESSOR_COUNT */
        case 75: *v = MAJOR; return 0;             /* COMPUTE_CAPABILITY_MAJOR */
        case 76: *v = MINOR; return 0;             /* COMPUTE_CAPABILITY_MINOR */
    }
    return 1;
}
int cuDeviceGetName(char *name, int len, int dev) { strncpy(name, NAME, len); return 0; }
"""


def _gcc() -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build a stub libcuda.so.1")
    return gcc


def _driver(folder: Path, source: str, **defines: object) -> Path:
    """`source` compiled as folder/libcuda.so.1 with `defines` as -D macros."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stub.c").write_text(source)
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    subprocess.run([_gcc(), "-shared", "-fPIC", *flags, "-o", str(folder / "libcuda.so.1"),
                    str(folder / "stub.c")], check=True, capture_output=True)
    return folder / "libcuda.so.1"


def _hopper(folder: Path, **overrides: object) -> Path:
    defines: dict[str, object] = {"INIT_RC": 0, "VERSION": 12040, "COUNT": 2, "SMS": 132,
                                  "MAJOR": 9, "MINOR": 0, "NAME": f'"{H100}"'}
    return _driver(folder, STUB, **{**defines, **overrides})


def test_the_drivers_answers_come_back(tmp_path: Path) -> None:
    facts = cuda_device.query(str(_hopper(tmp_path)))
    assert facts.problem is None and facts.driver_version == 12040
    assert facts.driver_cuda == "12.4" and facts.device_count == 2
    assert facts.devices == (cuda_device.CudaDevice(0, H100, (9, 0), 132),
                             cuda_device.CudaDevice(1, H100, (9, 0), 133))


def test_a_blackwell_driver(tmp_path: Path) -> None:
    facts = cuda_device.query(str(_hopper(tmp_path, VERSION=13000, COUNT=1, SMS=148, MAJOR=10,
                                          NAME='"NVIDIA B200"')))
    assert facts.driver_cuda == "13.0"
    assert facts.devices == (cuda_device.CudaDevice(0, "NVIDIA B200", (10, 0), 148),)


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"COUNT": 0}, "CUDA sees no device ("),
    ({"INIT_RC": 100}, "CUDA sees no device ("),
    ({"INIT_RC": 3}, "the driver refused: cuInit returned CUDA error 3 ("),
])
def test_no_device(tmp_path: Path, overrides: dict[str, object], problem: str) -> None:
    lib = _hopper(tmp_path, **overrides)
    facts = cuda_device.query(str(lib))
    assert facts.devices == () and facts.device_count == 0
    assert facts.problem == f"{problem}{lib})", facts


def test_the_cpu_kits_stand_in_driver(tmp_path: Path) -> None:
    """tests/kit/libcuda_stub.c: every entry point answers CUDA_ERROR_STUB_LIBRARY (34)."""
    lib = _driver(tmp_path, (ROOT / "tests" / "kit" / "libcuda_stub.c").read_text())
    facts = cuda_device.query(str(lib))
    assert facts == cuda_device.CudaFacts(
        None, (), f"the driver refused: cuInit returned CUDA error 34 ({lib})")


def test_no_driver_library(tmp_path: Path) -> None:
    facts = cuda_device.query(str(tmp_path / "libcuda.so.1"))
    assert facts.devices == () and facts.driver_version is None
    assert facts.problem is not None and facts.problem.startswith("no NVIDIA driver library (")


def test_a_library_that_is_not_a_driver(tmp_path: Path) -> None:
    lib = _driver(tmp_path, "int cuInit(unsigned int f) { return 0; }\n")
    facts = cuda_device.query(str(lib))
    assert facts.devices == () and facts.problem is not None
    assert facts.problem.startswith(f"{lib} is not a CUDA driver ("), facts.problem


def test_detect_gpu_reads_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_OVERLAP_ASSUME_ARCH", raising=False)
    monkeypatch.setattr(cuda_device, "DRIVER_LIBRARY", str(_hopper(tmp_path)))
    gpu = detect_gpu()
    assert (gpu.arch, gpu.source, gpu.name, gpu.capability, gpu.sm_count) == (
        "sm90", "detected", H100, (9, 0), 132)
    assert (gpu.driver_cuda, gpu.device_count, gpu.problem) == ("12.4", 2, None)


def test_check_on_a_gpu_machine_never_imports_torch(tmp_path: Path) -> None:
    """The driver stub first on LD_LIBRARY_PATH: `check` reports its GPU, and neither torch nor
    sglang is imported in the process that answers."""
    _hopper(tmp_path / "lib")
    code = ("import sys; from sglang_overlap.cli.main import main; "
            "rc = main(['check', '--no-import-check', '--model-path', 'deepseek-ai/DeepSeek-V3',"
            " '--tp', '16', '--moe-a2a-backend', 'deepep', '--enable-two-batch-overlap']); "
            "heavy = [m for m in ('torch', 'sglang') if m in sys.modules]; "
            "print('imported:', heavy); sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "LD_LIBRARY_PATH": os.pathsep.join(
               [str(tmp_path / "lib"), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])}
    env.pop("SGLANG_OVERLAP_ASSUME_ARCH", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode <= 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "imported: []", done.stdout[-2000:]
    assert (f"GPU (detected): {H100} sm90 capability (9, 0), 132 SMs; NVIDIA driver for CUDA "
            "12.4, 2 GPU(s) visible") in done.stdout.splitlines(), done.stdout
    assert any(line.startswith("TBO: on (deepep") for line in done.stdout.splitlines())

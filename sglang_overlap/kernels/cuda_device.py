"""The CUDA driver's facts about this machine's GPUs, read through `libcuda.so.1` with ctypes.

`import torch` takes seconds; `sglang-overlap check` needs only what the driver API answers in
milliseconds: how many devices CUDA sees (after CUDA_VISIBLE_DEVICES), each one's compute
capability and multiprocessor count, and the driver's CUDA version. `query` loads the driver
library, calls cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute
and cuDeviceGetName, and returns a `CudaFacts`; where the library is missing or a call fails
(no NVIDIA driver, a stand-in driver, no device) it says why in `CudaFacts.problem` instead of
raising. Nothing of the package, no torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

DRIVER_LIBRARY = "libcuda.so.1"
"""The driver API library, as the CUDA runtime (and torch) loads it."""

# CUdevice_attribute values (cuda.h)
_MULTIPROCESSOR_COUNT = 16
_COMPUTE_CAPABILITY_MAJOR = 75
_COMPUTE_CAPABILITY_MINOR = 76
_NAME_BYTES = 256
_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


@dataclass(frozen=True)
class CudaDevice:
    """One device as the driver numbers it (ordinals count the visible devices only)."""

    index: int
    """The CUDA ordinal (0 = the first device CUDA_VISIBLE_DEVICES leaves visible)."""
    name: str
    """The product name, e.g. "NVIDIA H100 80GB HBM3"."""
    capability: tuple[int, int]
    """Compute capability (major, minor): (9, 0) is Hopper (SM90), (10, 0) Blackwell (SM100)."""
    sm_count: int
    """Streaming multiprocessors on the device (132 on an H100 SXM)."""


@dataclass(frozen=True)
class CudaFacts:
    """What the driver answered; `devices` is empty and `problem` says why when CUDA sees no
    device."""

    driver_version: int | None
    """The newest CUDA version the driver supports, as cuDriverGetVersion returns it:
    1000 * major + 10 * minor (12040 = CUDA 12.4); None when the driver did not answer."""
    devices: tuple[CudaDevice, ...]
    problem: str | None
    """Why no device is listed (the library is missing, cuInit failed, no device); None when
    the driver answered."""

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def driver_cuda(self) -> str | None:
        """The driver's CUDA version as "major.minor" ("12.4"), None when unknown."""
        if self.driver_version is None:
            return None
        return f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"


class _CallFailed(Exception):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned CUDA error {code}")
        self.code = code


def _call(lib: ctypes.CDLL, name: str, *args: object) -> None:
    code = int(getattr(lib, name)(*args))
    if code != 0:
        raise _CallFailed(name, code)


def _int(lib: ctypes.CDLL, name: str, *args: object) -> int:
    out = ctypes.c_int()
    _call(lib, name, ctypes.byref(out), *args)
    return out.value


def _device(lib: ctypes.CDLL, ordinal: int) -> CudaDevice:
    handle = _int(lib, "cuDeviceGet", ordinal)  # CUdevice: an int

    def attribute(attr: int) -> int:
        return _int(lib, "cuDeviceGetAttribute", attr, handle)

    capability = (attribute(_COMPUTE_CAPABILITY_MAJOR), attribute(_COMPUTE_CAPABILITY_MINOR))
    name = ctypes.create_string_buffer(_NAME_BYTES)
    try:
        _call(lib, "cuDeviceGetName", name, _NAME_BYTES, handle)
        text = name.value.decode("utf-8", "replace")
    except (_CallFailed, AttributeError):
        text = ""
    return CudaDevice(ordinal, text or f"CUDA device {ordinal} (sm_{capability[0]}"
                      f"{capability[1]})", capability, attribute(_MULTIPROCESSOR_COUNT))


def query(library: str | None = None) -> CudaFacts:
    """The driver's facts (see `CudaFacts`) from `library` (default `DRIVER_LIBRARY`); never
    raises for a missing or failing driver."""
    library = library or DRIVER_LIBRARY
    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        return CudaFacts(None, (), f"no NVIDIA driver library ({exc})")
    version: int | None = None
    try:
        _call(lib, "cuInit", 0)
        version = _int(lib, "cuDriverGetVersion")
        count = _int(lib, "cuDeviceGetCount")
        devices = tuple(_device(lib, i) for i in range(count))
    except _CallFailed as exc:
        why = "CUDA sees no device" if exc.code == _NO_DEVICE else f"the driver refused: {exc}"
        return CudaFacts(version, (), f"{why} ({library})")
    except AttributeError as exc:  # a library without the driver API's symbols
        return CudaFacts(version, (), f"{library} is not a CUDA driver ({exc})")
    if not devices:
        return CudaFacts(version, (), f"CUDA sees no device ({library})")
    return CudaFacts(version, devices, None)


__all__ = ["DRIVER_LIBRARY", "CudaDevice", "CudaFacts", "query"]

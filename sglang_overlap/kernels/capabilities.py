"""What the installed kernels accept, found without loading their CUDA extensions.

`import deep_ep` runs host checks and loads `_C` at import time, so the probe reads the packages'
Python source instead (`package_source`: the parameter lists of DeepEP's combine and DeepGEMM's
masked GEMM, and their versions).

The GPU architecture comes from the CUDA driver (`cuda_device`: ctypes, no torch), unless
SGLANG_OVERLAP_ASSUME_ARCH (or `assume_arch=`) says what to pretend (sm90 | sm100 | cpu): that is
how `sglang-overlap check --assume-arch sm90` answers for a Hopper box from a CPU machine, and how
tests describe one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_overlap.kernels import cuda_device
from sglang_overlap.kernels.package_source import (
    FunctionParams,
    PackageProbe,
    package_dir,
    probe_package,
)
from sglang_overlap.kernels.triton_versions import installed_triton, kernel_problem
from sglang_overlap.planning.sbo_layout import BLACKWELL_NUM_SMS, HOPPER_NUM_SMS
from sglang_overlap.planning.sbo_path import (
    PER_BLOCK_ARGS,
    PER_EXPERT_ARGS,
    Arch,
    Capabilities,
    CombineForm,
)

ASSUME_ARCH_ENV = "SGLANG_OVERLAP_ASSUME_ARCH"
ARCH_CHOICES = ("sm90", "sm100", "cpu")
_ASSUMED = {"sm90": ((9, 0), HOPPER_NUM_SMS, "assumed SM90 (H100/H200 SXM)"),
            "sm100": ((10, 0), BLACKWELL_NUM_SMS, "assumed SM100 (B200)"),
            "cpu": (None, None, "assumed CPU")}

DEEP_EP_COMBINE = ("deep_ep", "Buffer.low_latency_combine")
# The supported SGLang calls fp8_m_grouped_gemm_nt_masked; older wheels (0.1.x) have the third name.
DEEP_GEMM_MASKED = ("fp8_m_grouped_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
                    "m_grouped_gemm_fp8_fp8_bf16_nt_masked")
DEEP_GEMM_SIGNAL_ARGS = ("enable_overlap", "signal")


def combine_forms(params: FunctionParams | None) -> tuple[CombineForm, ...]:
    """Overlap forms `low_latency_combine` declares: per_block (Hopper fork) / per_expert."""
    if params is None:
        return ()
    forms: list[CombineForm] = []
    if params.accepts("overlap", *PER_BLOCK_ARGS):
        forms.append("per_block")
    if params.accepts(*PER_EXPERT_ARGS):
        forms.append("per_expert")
    return tuple(forms)


def gemm_takes_signal(params: FunctionParams | None) -> bool:
    return params is not None and params.accepts(*DEEP_GEMM_SIGNAL_ARGS)


@dataclass(frozen=True)
class GpuInfo:
    arch: Arch
    source: str  # "assumed" | "detected"
    name: str
    capability: tuple[int, int] | None
    sm_count: int | None
    driver_cuda: str | None = None
    """The CUDA version the NVIDIA driver supports ("12.4"); None: assumed, or no driver."""
    device_count: int | None = None
    """CUDA devices visible (after CUDA_VISIBLE_DEVICES); None: assumed."""
    problem: str | None = None
    """Why no device was found (detected "cpu" only)."""


DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
"""Any of these exists where an NVIDIA driver is loaded (`/dev/dxg`: WSL)."""


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (without one, CUDA sees no device)."""
    return any(os.path.exists(p) for p in DRIVER_FILES)


def detect_gpu(assume_arch: str | None = None) -> GpuInfo:
    """The GPU of device 0 (or what `assume_arch` / SGLANG_OVERLAP_ASSUME_ARCH says), asked of
    the CUDA driver through ctypes (`cuda_device`): torch is not imported."""
    assume = assume_arch or os.environ.get(ASSUME_ARCH_ENV) or None
    if assume is not None:
        if assume not in ARCH_CHOICES:
            raise ValueError(f"{ASSUME_ARCH_ENV} / --assume-arch must be one of "
                             f"{', '.join(ARCH_CHOICES)} (got {assume!r})")
        cap, sms, name = _ASSUMED[assume]
        return GpuInfo(assume, "assumed", name, cap, sms)  # type: ignore[arg-type]
    facts = cuda_device.query()
    if not facts.devices:
        return GpuInfo("cpu", "detected", "no CUDA device", None, None,
                       driver_cuda=facts.driver_cuda, device_count=0, problem=facts.problem)
    dev = facts.devices[0]
    arch: Arch = {9: "sm90", 10: "sm100"}.get(dev.capability[0], "other")  # type: ignore[assignment]
    return GpuInfo(arch, "detected", dev.name, dev.capability, dev.sm_count,
                   driver_cuda=facts.driver_cuda, device_count=facts.device_count)


def device_num_sms(device: object = None) -> int:
    """Multiprocessor count of a CUDA `device` (default: the current one). Without a CUDA device
    this raises: the SGLang glue's nominal count for CPU servers is `sglang.state.num_sms`."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("device_num_sms needs a CUDA device (none is visible)")
    index = torch.cuda.current_device() if device is None else device
    return int(torch.cuda.get_device_properties(index).multi_processor_count)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ProbeReport:
    gpu: GpuInfo
    deep_ep: PackageProbe
    deep_gemm: PackageProbe
    triton: bool
    signal_gemm_module: bool
    triton_version: str | None = None
    """The installed triton's version (None: not installed, or no metadata to read it from)."""

    @property
    def triton_problem(self) -> str | None:
        """Why the installed triton cannot build the plugin's signal GEMMs (the sliced
        producer's signal store, which every SBO path may fall back to), None if it can or
        its version is unknown (`triton_versions`)."""
        if not self.triton or self.triton_version is None:
            return None
        return kernel_problem("sliced", self.triton_version)

    @property
    def capabilities(self) -> Capabilities:
        problem = self.triton_problem
        return Capabilities(
            arch=self.gpu.arch, deep_ep_version=self.deep_ep.version,
            deep_ep_combine_forms=combine_forms(self.deep_ep.params),
            deep_gemm_version=self.deep_gemm.version,
            deep_gemm_signal=gemm_takes_signal(self.deep_gemm.params),
            plugin_signal_gemm=self.triton and self.signal_gemm_module and problem is None,
            plugin_signal_gemm_problem=problem)


def probe(search_path: Sequence[str] | None = None,
          assume_arch: str | None = None) -> ProbeReport:
    """Everything the SBO decision needs; `search_path` replaces sys.path for the kernels."""
    module, fn = DEEP_EP_COMBINE
    own = Path(__file__).with_name("signal_fused.py").is_file()
    return ProbeReport(
        gpu=detect_gpu(assume_arch),
        deep_ep=probe_package(module, (fn,), search_path),
        deep_gemm=probe_package("deep_gemm", DEEP_GEMM_MASKED, search_path),
        triton=package_dir("triton", search_path) is not None,
        signal_gemm_module=own,
        triton_version=installed_triton(search_path),
    )


__all__ = [
    "ASSUME_ARCH_ENV",
    "GpuInfo",
    "ProbeReport",
    "combine_forms",
    "detect_gpu",
    "device_num_sms",
    "gemm_takes_signal",
    "probe",
]

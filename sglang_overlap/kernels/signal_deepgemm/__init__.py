"""SignalPlan.path "deepgemm": DeepGEMM's own SM90 masked fp8 GEMM, raising the SBO signals.

No released DeepGEMM signals from its Hopper masked GEMM, and its host API takes no signal
argument. This package builds the kernel itself from the *installed* deep_gemm's headers, one
module per job:

- `versions.py`   the table of releases the patch covers (version -> header sha256 -> patch
                  file -> template arguments) and `producer_for`, the serving rule;
- `patching.py`   the strict patch applier;
- `headers.py`    which release is installed (files only, no import) and the private patched
                  copy of its `deep_gemm/include` (the wheel stays untouched);
- `configs.py`    tiles, stages and shared memory (DeepGEMM's SM90 rules);
- `build.py`      nvcc, one translation unit per instantiation, the cubin cache;
- `driver.py`     ctypes bindings on libcuda: module load, TMA descriptors, launch;
- `launch.py`     operand checks and the launch on the current torch stream.

The patch (`patches/<version>/` in this package) adds to `sm90_fp8_gemm_1d2d_impl` an `int* signal`
argument and four template parameters: after each output tile's TMA store has completed, one lane
of an idle TMA warp adds 1 with a gpu-scope release to the tile's unit - per (expert, 64-row
block) or per expert - and at start credits the units of the blocks past `masked_m` that the
masked scheduler never visits, so every unit reaches its final value exactly once.

Any release or header not in the table, or no nvcc, makes `probe()` say why, and `down_gemm`
then serves the plugin's other producers with one log line.

Signal timing (`DgSignalConfig.eager`, `.store_warp`): deferred (default) signals a tile when the
next tile of the same CTA waits for its stores anyway (or after the CTA's last tile); eager waits
for each tile's stores right after issuing them (one warp stalls); store_warp lets the signalling
lane issue the tile's TMA stores itself, so the math threads wait only for the shared-memory reads
(as in DeepGEMM) and the global-write wait moves off the math path.
"""

from sglang_overlap.kernels.signal_deepgemm.configs import (
    DgSignalConfig,
    block_n_candidates,
    default_config,
    max_stages,
)
from sglang_overlap.kernels.signal_deepgemm.headers import probe, served_producer
from sglang_overlap.kernels.signal_deepgemm.launch import load, masked_gemm_signal
from sglang_overlap.kernels.signal_deepgemm.versions import (
    RELEASES,
    DgSignalError,
    Release,
    producer_for,
)

__all__ = [
    "RELEASES",
    "DgSignalConfig",
    "DgSignalError",
    "Release",
    "block_n_candidates",
    "default_config",
    "load",
    "masked_gemm_signal",
    "max_stages",
    "probe",
    "producer_for",
    "served_producer",
]

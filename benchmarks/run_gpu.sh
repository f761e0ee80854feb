#!/usr/bin/env bash
# Runs on the CUDA machine, from the repo root: installs the wheels carried in .whl/, restores the
# DeepGEMM/Triton JIT caches carried in .gpu-cache/, runs benchmarks/gpu_suite.py all (GPU tests
# + every shape + tables) and packs the caches into $OUT for the next call.
#   bash benchmarks/run_gpu.sh [gpu_suite.py all options, e.g. --shapes 8x32 --seeds 3]
set -uo pipefail
OUT=${OUT:-$PWD/.gpu-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
CACHE=${GPU_CACHE:-$PWD/.gpu-cache}
mkdir -p "$CACHE/work"
[ -f "$CACHE/caches.tar.gz" ] && tar -xzf "$CACHE/caches.tar.gz" -C "$CACHE/work"
export DG_JIT_CACHE_DIR=$CACHE/work/deep_gemm TRITON_CACHE_DIR=$CACHE/work/triton
# NVRTC there cannot find cuda/std headers (seen 2026-12-02): DeepGEMM compiles with nvcc
export DG_JIT_USE_NVRTC=${DG_JIT_USE_NVRTC:-0}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used \
  --format=csv
python3 - <<'PY'
import time, torch, triton
t = time.time()
try:
    import deep_gemm
    from sglang_overlap.kernels import deepgemm
    print("deep_gemm", deep_gemm.__version__, deepgemm.api().flavour,
          f"import {time.time() - t:.1f} s")
except Exception as exc:
    print("deep_gemm unavailable:", exc)
print("torch", torch.__version__, "triton", triton.__version__,
      torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)
PY
rc=0
python3 benchmarks/gpu_suite.py all --out "$OUT" "$@" || rc=$?
(cd "$CACHE/work" && tar -czf "$OUT/caches.tar.gz" deep_gemm triton 2>/dev/null) || true
echo "run_gpu.sh exit $rc"
exit $rc

#!/usr/bin/env bash
# `benchmarks/run_gpu.sh serve` on the GPU machine (one H100/H200): stage SGLang 0.5.23 from the
# kit that benchmarks/serve/build_kit.sh made here (.gpukit, carried), build the torch bridge,
# check SGLang's kernels through it, draw the DeepSeek-V3-width checkpoint, then start real
# `sglang serve` processes one after another (serve_suite.py) and print the table (report.py).
#   KERNELS_ONLY=1 (stop after the kernel check)  SERVERS=base,auto,...  MOE_LAYERS=3  DEADLINE_S=540 (stop starting servers after this many
#   seconds from the script's start)  CONCURRENCY=1,16,64
# $OUT gets: serve_table.md, serve_results.json, logs.tar.gz, pip.log and jit.tar.gz (DeepGEMM's
# and Triton's JIT caches, reused when carried as .gpukit/jit.tar.gz).
set -uo pipefail
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
OUT=${OUT:-$ROOT/.gpu-out}; KIT=${KIT:-$ROOT/.gpukit}; G=${GK:-/tmp/gk}
mkdir -p "$OUT" "$G/site" "$G/plugin" "$G/trees" "$G/jit" "$G/out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader
df -h /dev/shm /tmp | tail -2; free -g | sed -n 2p

log "stage"
pids=()
for a in sglang sgl_kernel deps; do
  [ -f "$KIT/$a.tar.xz" ] && { tar -xJf "$KIT/$a.tar.xz" -C "$G/site" & pids+=($!); }
done
for t in "$KIT"/deepep/*.tar.xz; do
  n=$(basename "$t" .tar.xz); mkdir -p "$G/trees/$n"; tar -xJf "$t" -C "$G/trees/$n" & pids+=($!)
done
[ -f "$KIT/jit.tar.gz" ] && { tar -xzf "$KIT/jit.tar.gz" -C "$G/jit" & pids+=($!); }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$G/site" \
  "$KIT"/wheels/sgl_deep_gemm-0.2.3.post2-*.whl benchmarks/serve/probe > "$OUT/pip.log" 2>&1 \
  || { log "pip (deep_gemm, probe) failed"; tail -5 "$OUT/pip.log"; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
  --target "$G/plugin" . >> "$OUT/pip.log" 2>&1 || { log "pip (plugin) failed"; tail -5 "$OUT/pip.log"; }
TP=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
g++ -shared -fPIC -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$TP/include" \
  -I"$TP/include/torch/csrc/api/include" -I/usr/local/cuda/include benchmarks/gpukit/torch_bridge.cpp \
  -L"$TP/lib" -lc10 -lc10_cuda -ltorch_cpu -ltorch -Wl,-rpath,"$TP/lib" -o "$G/libtorch_bridge.so" \
  || log "bridge build failed"
for p in "${pids[@]}"; do wait "$p" || log "unpack failed ($p)"; done
cp benchmarks/serve/boot/sitecustomize.py "$G/site/"
cp benchmarks/gpukit/bridge.py "$G/site/sglang_serve_bridge.py"
trees="{"; for d in "$G"/trees/*/; do n=$(basename "$d"); trees+="\"$n\": \"${d%/}\", "; done
export SERVE_TREES="${trees%, }}" SERVE_SITE_BASE=$G/site SERVE_SITE_PLUGIN=$G/plugin
export SGLANG_SERVE_TORCH_BRIDGE=$G/libtorch_bridge.so SGLANG_SERVE_BRIDGE_VERBOSE=1
export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false SGLANG_DG_CACHE_DIR=$G/jit/deep_gemm \
  DG_JIT_CACHE_DIR=$G/jit/deep_gemm TRITON_CACHE_DIR=$G/jit/triton SGLANG_OVERLAP_CACHE=$G/jit/sgo \
  CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
log "staged: $(du -sh "$G" | cut -f1); trees $SERVE_TREES"

first_tree=$(ls -d "$G"/trees/*/ | head -1)
PYTHONPATH=$G/site:$first_tree python3 benchmarks/serve/kernel_check.py --json "$G/out/kernels.json" \
  2>&1 | tee "$G/out/kernels.log" | grep -E "^\[kernels\]|Error|error" | head -20
log "kernels checked"
[ "${KERNELS_ONLY:-0}" = 1 ] && { cp "$G/out/kernels.json" "$OUT/"; exit 0; }

MODEL=/dev/shm/dsv3
shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
[ "${shm:-0}" -lt 30 ] && MODEL=/tmp/dsv3
PYTHONPATH=$G/site python3 benchmarks/serve/make_model.py "$MODEL" --moe-layers "${MOE_LAYERS:-3}" \
  2>&1 | tail -3
log "model drawn"

W=$G/out; mkdir -p "$W"
# the suite stops starting servers SERVE_MIN_LEFT s before DEADLINE_S and is interrupted at it,
# leaving time to pack what came back
D=$(( T0 + ${DEADLINE_S:-530} ))
PYTHONPATH=$G/site timeout -s INT $(( D - $(date +%s) )) python3 benchmarks/serve/serve_suite.py \
  --model "$MODEL" --out "$W" --servers "${SERVERS:-base,auto,tbo,sbo_expert,plugin}" \
  --concurrency "${CONCURRENCY:-1,16,64}" --deadline "$D" --min-left "${SERVE_MIN_LEFT:-150}"
rc=$?
pkill -9 -f "sglang.cli.main" 2>/dev/null; pkill -9 -f "sglang::" 2>/dev/null
(cd "$G/jit" && tar -czf "$OUT/jit.tar.gz" deep_gemm triton sgo 2>/dev/null)
ls -la "$OUT/jit.tar.gz" 2>/dev/null
python3 benchmarks/serve/report.py "$W" --json "$OUT/serve_results.json" | tee "$OUT/serve_table.md"
(cd "$W" && tar -czf "$OUT/logs.tar.gz" --exclude='probe_*' . 2>/dev/null)
log "serve exit $rc"
exit $rc

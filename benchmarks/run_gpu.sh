#!/usr/bin/env bash
# Every GPU test and benchmark in one call on the CUDA machine, from the repo root, on the stack
# users run (torch 2.14.1, NCCL 2.30.7, triton 3.8.0, sgl-deep-ep, sgl-deep-gemm 0.2.3.post2,
# SGLang 0.5.23), which benchmarks/serve/stage.sh stages there first from the kit
# benchmarks/serve/build_kit.sh builds here (STACK=image runs on the image's torch 2.11 instead,
# for what needs no SGLang; nothing else does):
#   bash benchmarks/run_gpu.sh [gpusuite|sbo|gemm|padded|dgsignal|graphsets|all] [extra gpu_suite.py options for gemm]
#     gpusuite  the whole tests/gpu suite: the DeepEP tests once per tree (sgl-deep-ep, the
#           staged antgroup-opt), the rest once; workers sized to the card's memory
#           (SUITE_PART=deepep or rest: that half only, for a call too short for both)
#     sbo   DeepEP trees: env probe, JIT warm-up, tests/gpu (DeepEP + SBO layer tests once per
#           tree), hang probe and SBO layer benchmark per tree, tables (default)
#     gemm  the signal down-GEMM suite (benchmarks/gpu_suite.py all: tests/gpu + tile sweep)
#     padded  the down GEMM in a padded buffer (capacity > rows, as served): DeepGEMM vs the
#           fused kernel in both tile orders (benchmarks/bench_padded_gemm.py), the fused tests
#     dgsignal  DeepGEMM's own kernel with the plugin's signal patch (kernels/signal_deepgemm/):
#           its GPU tests, then every producer against one plain DeepGEMM launch
#           (benchmarks/bench_dg_signal.py; DG_PRINT_CONFIGS shows DeepGEMM's own configs)
#     releases  every signal producer on each sgl-deep-gemm release (wheels in .whl), through
#           down_gemm.signal_down_gemm (tests/gpu/test_signal_down_gemm.py), then the served
#           producer against each BENCH_RELEASES release's own masked GEMM
#           (benchmarks/bench_dg_releases.py)
#     dgown  DeepGEMM's own masked launch of sgl-deep-gemm 0.2.3.post2 / 0.2.5 (the staged
#           stack's and GK/dg-0.2.5, both on torch 2.14.1) as the baseline:
#           DeepGEMM's JIT warm-up, benchmarks/tune_producer.py (writes this GPU's
#           sglang_overlap/profiles/producer-<GPU>.json, copied to $OUT), the producer's GPU tests
#           per release (tests/gpu/test_dg_own_launch.py + test_signal_down_gemm.py), then
#           benchmarks/bench_dg_releases.py per release alone on the GPU; tables last.
#           Knobs: DGOWN_RELEASES, DGOWN_TUNE=0 (keep the shipped table), DGOWN_SHAPES (ExCxROWS,..),
#           DGOWN_K (pytest -k, default "not sliced"), DGOWN_SKIP (bench variants, default sliced)
#     graphsets  decode graph sets per overlap mode (none / TBO / SBO) on a stack of MoE layers:
#           capture time and memory against one set, replay times, the mode selector over a
#           decode trace on those replays (benchmarks/bench_graph_sets.py; GRAPH_ARGS, GRAPH_TREE)
#     all   all four (not releases, not graphsets)
#     serve real `sglang serve` processes (SGLang 0.5.23 staged from .gpukit, built here by
#           benchmarks/serve/build_kit.sh) with and without the plugin on one GPU: tokens,
#           bench_serving, graph capture, decisions vs replays (benchmarks/serve/run_serve.sh)
# Results and logs go to $OUT (default .gpu-out/). Set NPROC=N to run the DeepEP tests and the
# layer benchmark under torchrun --nproc-per-node N (default: 1, one rank).
#
# Inputs, all git-ignored, found beside the repo (or at the paths the variables give):
#   WHEELS=.whl         cp312 wheels: sgl-deep-gemm==0.1.4.post1 apache-tvm-ffi==0.1.11 (GPU.md)
#   DEEPEP_TREES=.deepep  one folder per DeepEP tree, each a DeepEP v1 checkout (setup.py,
#       deep_ep/, csrc/): e.g. deepep-hybrid/ (deepseek-ai/DeepEP branch hybrid-ep @ 94a9f8f)
#       and deepep-ant/ (branch antgroup-opt @ 76f0271). Prepare from a checkout:
#         git clone https://github.com/deepseek-ai/DeepEP .deepep/deepep-ant
#         git -C .deepep/deepep-ant checkout 76f0271
#       (hybrid-ep also needs two local edits: setup.py
#       builds hybrid_ep_cpp only with BUILD_HYBRID_EP=1; deep_ep/__init__.py imports hybrid_ep
#       optionally, adds topk_idx_t and __version__), or from a tarball of such a tree:
#         tar -xzf deepep-hybrid-ep-94a9f8f.tar.gz -C .deepep
#       A prebuilt extension is used when the tree holds deep_ep_cpp*.so, or deep_ep_cpp*.so.gz
#       (unpacked here, e.g. a prebuilt *.so.gz copied in); otherwise the tree
#       is built here in place (the recipe below, ~60 s on 16 cores, trees in parallel).
#   GPU_CACHE=.gpu-cache  caches.tar.gz of DeepGEMM/Triton JIT caches from an earlier $OUT;
#       sgo/ the patched kernel's cubins (SGLANG_OVERLAP_CACHE; built anywhere with nvcc 13.0:
#       python benchmarks/bench_dg_signal.py --compile-only, on a machine with deep_gemm 0.1.4.post1),
#       or sgo.tar.gz of its kernels/ folders (4 MB for 314 cubins; unpacked into sgo/ here):
#         tar -czf .gpu-cache/sgo.tar.gz -C .gpu-cache sgo/deepgemm-signal/<version-key>/kernels
set -uo pipefail
MODE=${1:-sbo}; shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ "$MODE" = serve ] && exec bash "$ROOT/benchmarks/serve/run_serve.sh" "$@"
cd "$ROOT"
STAGED=0
if [ -f "${GK:-/tmp/gk}/env.sh" ]; then  # the users' stack, staged by benchmarks/serve/stage.sh
  # shellcheck disable=SC1091
  source "${GK:-/tmp/gk}/env.sh"; STAGED=1
elif [ "${STACK:-}" != image ]; then
  echo "the users' stack is not staged here: bash benchmarks/serve/stage.sh install (or STACK=image)"
  exit 2
fi
OUT=${OUT:-$ROOT/.gpu-out}; mkdir -p "$OUT"
WHEELS=${WHEELS:-$ROOT/.whl}; TREES=${DEEPEP_TREES:-$ROOT/.deepep}; CACHE=${GPU_CACHE:-$ROOT/.gpu-cache}
NPROC=${NPROC:-1}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
DG_VERSION=${DG_VERSION:-0.1.4.post1}  # the sgl-deep-gemm wheel installed for the other modes
install_dg() {  # install_dg VERSION TARGET: that sgl-deep-gemm wheel (+ apache-tvm-ffi) into TARGET
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$2" "$WHEELS"/sgl_deep_gemm-"$1"-*.whl $(ls "$WHEELS"/apache_tvm_ffi-*.whl 2>/dev/null)
}
if [ $STAGED = 0 ] && compgen -G "$WHEELS/sgl_deep_gemm-$DG_VERSION-*.whl" >/dev/null \
    && [ "$MODE" != releases ] && [ "$MODE" != dgown ]; then
  install_dg "$DG_VERSION" /tmp/site || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$ROOT:${PYTHONPATH:-}
if [ $STAGED = 0 ]; then  # the staged env.sh names the JIT caches (the kit's sgo/jit inside)
  mkdir -p "$CACHE/work"
  [ -f "$CACHE/caches.tar.gz" ] && tar -xzf "$CACHE/caches.tar.gz" -C "$CACHE/work"
  export DG_JIT_CACHE_DIR=$CACHE/work/deep_gemm TRITON_CACHE_DIR=$CACHE/work/triton
  export DG_JIT_USE_NVRTC=${DG_JIT_USE_NVRTC:-0}  # NVRTC there cannot find cuda/std headers
  export SGLANG_OVERLAP_CACHE=${SGLANG_OVERLAP_CACHE:-$CACHE/sgo}
  [ -f "$CACHE/sgo.tar.gz" ] && [ "$SGLANG_OVERLAP_CACHE" = "$CACHE/sgo" ] \
    && tar -xzf "$CACHE/sgo.tar.gz" -C "$CACHE"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

build_tree() {  # the DeepEP v1 recipe for this image (CUDA 13, nvidia-nvshmem-cu13 wheel)
  ( cd "$1" && export PATH=/usr/local/cuda/bin:/opt/gcc/bin:$PATH CUDA_HOME=/usr/local/cuda \
      TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16} && \
    export CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH} && \
    unset NVSHMEM_DIR && python3 setup.py build_ext --inplace > build.log 2>&1 )
  echo "built $1: rc=$? ($(ls "$1"/deep_ep_cpp*.so 2>/dev/null || tail -3 "$1/build.log"))"
}
if [ "$MODE" = releases ]; then
  # every producer on every sgl-deep-gemm release (tests/gpu/test_signal_down_gemm.py, the
  # releases side by side), then the served producer against each release's own masked GEMM
  # (benchmarks/bench_dg_releases.py, one release at a time: BENCH_RELEASES)
  rc=0; pids=()
  for v in ${DG_RELEASES:-0.1.4.post1 0.2.3.post2 0.2.5}; do  # nvcc every launch, in parallel
    install_dg "$v" "/tmp/dg-$v" || { echo "install sgl-deep-gemm $v failed"; rc=1; continue; }
    shapes=none; case " ${BENCH_RELEASES:-0.2.3.post2} " in *" $v "*) shapes=${REL_SHAPES:-};; esac
    PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-} python3 benchmarks/bench_dg_releases.py --compile-only \
      --with-tests --workers 6 ${shapes:+--shapes $shapes} > "$OUT/compile_$v.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "[$(date +%T)] compiled: $(cat "$OUT"/compile_*.log | tr '\n' ' ' | tail -c 600)"
  for v in ${BENCH_RELEASES:-0.2.3.post2}; do
    PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-} python3 benchmarks/bench_dg_releases.py \
      --json "$OUT/releases_$v.json" ${REL_SHAPES:+--shapes $REL_SHAPES} \
      > "$OUT/releases_$v.log" 2>&1 || rc=1
    sed -n '/^deep_gemm /,$p' "$OUT/releases_$v.log" | grep -v '^{' | tee "$OUT/releases_$v.md"
  done
  echo "[$(date +%T)] benchmark done"; pids=()
  for v in ${DG_RELEASES:-0.1.4.post1 0.2.3.post2 0.2.5}; do
    ( export PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-}
      python3 -c "import deep_gemm, sys; print('deep_gemm', deep_gemm.__file__, 'imports')" \
        > "$OUT/import_$v.txt" 2>&1
      echo "import deep_gemm $v: $(tail -1 "$OUT/import_$v.txt")"
      SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1 python3 -m pytest -q -p no:cacheprovider \
        -n ${PYTEST_WORKERS:-1} tests/gpu/test_signal_down_gemm.py \
        > "$OUT/pytest_release_$v.txt" 2>&1
      r=$?; echo "pytest (signal_down_gemm, deep_gemm $v): $(tail -1 "$OUT/pytest_release_$v.txt")"
      grep -E "^(FAILED|ERROR)" "$OUT/pytest_release_$v.txt" | head -20; exit $r ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "[$(date +%T)] run_gpu.sh releases exit $rc"
  exit $rc
fi
if [ "$MODE" = dgown ]; then
  rc=0; T0=$SECONDS; rels=${DGOWN_RELEASES:-0.2.3.post2 0.2.5}; tune_rel=${rels%% *}
  at() { echo "[$(date +%T) +$((SECONDS - T0))s] $*"; }
  [ -d /opt/gcc/bin ] && export PATH=/usr/local/cuda/bin:/opt/gcc/bin:$PATH
  # each release first on PYTHONPATH: 0.2.3.post2 is the staged stack's own, 0.2.5 in GK/dg-0.2.5
  for v in $rels; do
    if [ $STAGED = 1 ]; then
      rm -rf "/tmp/dg-$v"
      if [ "$v" = 0.2.5 ]; then ln -s "$GK_DG025" "/tmp/dg-$v"; else mkdir -p "/tmp/dg-$v"; fi
    else
      install_dg "$v" "/tmp/dg-$v" &
    fi
  done
  wait
  pids=()
  for v in $rels; do  # import check, then DeepGEMM's own JIT for every benchmark/test shape
    ( export PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-}
      python3 -c "import torch, deep_gemm; print('deep_gemm', deep_gemm.__file__, 'imports on torch',
torch.__version__)" > "$OUT/import_$v.txt" 2>&1
      timeout 150 python3 benchmarks/bench_dg_releases.py --warm-dg --workers 8 \
        ${DGOWN_SHAPES:+--shapes $DGOWN_SHAPES} > "$OUT/warm_$v.log" 2>&1 ) & pids+=($!)
  done
  PYTHONPATH=/tmp/dg-$tune_rel:$ROOT:${PYTHONPATH:-} python3 benchmarks/tune_producer.py --compile-only \
    --workers 16 > "$OUT/compile_tune.log" 2>&1 || rc=1
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for v in $rels; do at "deep_gemm $v: $(tail -qn1 "$OUT/import_$v.txt"); warm-up log: $(
    grep -c -i error "$OUT/warm_$v.log") error lines"; done
  at "tuner cubins: $(tail -1 "$OUT/compile_tune.log")"
  if [ "${DGOWN_TUNE:-1}" = 1 ]; then  # alone on the GPU
    PYTHONPATH=/tmp/dg-$tune_rel:$ROOT:${PYTHONPATH:-} timeout 200 python3 benchmarks/tune_producer.py \
      --raw "$OUT/tune_raw.json" > "$OUT/tune.log" 2>&1 || rc=1
    cp sglang_overlap/profiles/producer-*.json "$OUT/"
    at "tuner: $(tail -1 "$OUT/tune.log")"
  fi
  pids=()
  for v in $rels; do  # the launches of the table now served: nvcc what is not cached
    PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-} python3 benchmarks/bench_dg_releases.py --compile-only \
      --with-tests --workers 8 ${DGOWN_SHAPES:+--shapes $DGOWN_SHAPES} \
      > "$OUT/compile_$v.log" 2>&1 & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  at "compiled: $(tail -qn1 "$OUT"/compile_0.2*.log | tr '\n' ' ')"
  pids=()
  for v in $rels; do  # the producer's GPU tests, the releases side by side
    PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-} SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1 SGLANG_OVERLAP_REQUIRE_DGOWN=1 \
      timeout 200 python3 -m pytest -q -p no:cacheprovider -k "${DGOWN_K:-not sliced}" \
      tests/gpu/test_dg_own_launch.py tests/gpu/test_signal_down_gemm.py \
      > "$OUT/pytest_dgown_$v.txt" 2>&1 & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  at "tests done"
  for v in $rels; do  # the benchmark, one release at a time, alone on the GPU
    r=0; PYTHONPATH=/tmp/dg-$v:$ROOT:${PYTHONPATH:-} timeout 240 python3 benchmarks/bench_dg_releases.py \
      --skip "${DGOWN_SKIP-sliced}" --json "$OUT/dgown_$v.json" \
      ${DGOWN_SHAPES:+--shapes $DGOWN_SHAPES} > "$OUT/dgown_$v.log" 2>&1 || r=$?
    [ $r = 0 ] || rc=1; at "benchmark $v: exit $r, $(grep -c '^{' "$OUT/dgown_$v.log") shapes"
  done
  (cd "$(dirname "$DG_JIT_CACHE_DIR")" && tar -czf "$OUT/caches.tar.gz" deep_gemm triton 2>/dev/null) || true  # staged: GK/jit
  gpu=$(python3 -c "from sglang_overlap.kernels.gpu_tables import device_gpu as g; print(g())")
  [ -f "sglang_overlap/profiles/producer-$gpu.json" ] && python3 benchmarks/tune_producer.py \
    --show "sglang_overlap/profiles/producer-$gpu.json" \
    | tee "$OUT/producer_$gpu.md"
  for v in $rels; do
    echo "pytest (deep_gemm $v): $(tail -1 "$OUT/pytest_dgown_$v.txt")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_dgown_$v.txt" | head -20
  done
  for v in $rels; do
    [ -f "$OUT/dgown_$v.json" ] && python3 benchmarks/bench_dg_releases.py --table-from \
      "$OUT/dgown_$v.json" | tee "$OUT/dgown_$v.md"
  done
  # a device call returns 8 files: the producer table and the tables as they are, the rest packed
  keep=$(mktemp -d); mv "$OUT"/* "$keep"/
  cp "$keep"/producer-*.json "$keep"/*.md "$OUT"/ 2>/dev/null
  tar -czf "$OUT/dgown_all.tar.gz" -C "$keep" --exclude=caches.tar.gz .
  mv "$keep/caches.tar.gz" "$OUT"/ 2>/dev/null
  at "run_gpu.sh dgown exit $rc ($(ls "$OUT" | wc -l) files in \$OUT)"
  exit $rc
fi
tree_list=()
if [ $STAGED = 1 ]; then  # the stack's sgl-deep-ep (GK/stack) and the staged antgroup-opt tree
  mkdir -p /tmp/gk-trees/sgl-deep-ep
  tree_list=(/tmp/gk-trees/sgl-deep-ep "$GK_ANT")
  export DEEPEP_DISABLE_LL_DISPATCH_OPT=1  # antgroup-opt's layered LL dispatch needs 8k ranks
fi
for tree in "$TREES"/*/; do
  [ $STAGED = 1 ] && break
  tree=${tree%/}; [ -d "$tree/deep_ep" ] || continue
  if ! compgen -G "$tree/deep_ep_cpp*.so" >/dev/null; then
    gz=$(ls "$tree"/deep_ep_cpp*.so.gz 2>/dev/null | head -1)
    if [ -n "$gz" ]; then gunzip -c "$gz" > "${gz%.gz}"; else build_tree "$tree" & fi
  fi
  tree_list+=("$tree")
done
wait
for tree in "${tree_list[@]}"; do
  PYTHONPATH=$tree:$PYTHONPATH python3 -c "
from sglang_overlap.kernels.capabilities import combine_forms
from sglang_overlap.kernels.package_source import probe_package
p = probe_package('deep_ep', ('Buffer.low_latency_combine',))
from benchmarks.harness.deepep import load_deep_ep
try:
    load_deep_ep(); ok = 'loads'
except RuntimeError as exc:
    ok = f'FAILS: {exc}'
print(f'{p.location}: deep_ep {p.version}, forms {combine_forms(p.params)}, {ok}')"
done
python3 -c "import importlib.util as u; s=u.find_spec('nvidia.nvshmem'); print('nvshmem wheel:', s and list(s.submodule_search_locations))"

launch() {  # one rank, or torchrun
  if [ "$NPROC" -gt 1 ]; then torchrun --nproc-per-node "$NPROC" "$@"; else python3 "$@"; fi
}
rc=0
if [ "$MODE" = sbo ] || [ "$MODE" = all ]; then
  # knobs for a short run: WARM_SHAPES=8x1,16x128  SBO_K='e_local0'  SBO_SHAPES=8x1  HANG=0
  python3 benchmarks/sbo_layer_bench.py warm --of "${WARM_PROCS:-12}" \
    ${WARM_SHAPES:+--shapes $WARM_SHAPES} || rc=1
  hang_pids=()
  if [ "${HANG:-1}" = 1 ] && [ "$NPROC" = 1 ]; then  # each tree its own process, in parallel
    for tree in "${tree_list[@]}"; do
      case " ${HANG_TREES:-$(basename "$tree")} " in *" $(basename "$tree") "*) ;; *) continue;; esac
      PYTHONPATH=$tree:$PYTHONPATH python3 benchmarks/sbo_hang_probe.py all --timeout 20 \
        --release 4 ${HANG_ONLY:+--only $HANG_ONLY} > "$OUT/hang_$(basename "$tree").md" 2>&1 &
      hang_pids+=($!)
    done
    # HANG_BG=1: the probes run beside the tests (time-sliced GPU; never beside the benchmark)
    [ "${HANG_BG:-0}" = 1 ] || wait "${hang_pids[@]}"
  fi
  for tree in "${tree_list[@]}"; do
    name=$(basename "$tree")
    PYTHONPATH=$tree:$PYTHONPATH SGLANG_OVERLAP_REQUIRE_DEEPEP=1 launch -m pytest -q \
      -p no:cacheprovider ${SBO_K:+-k "$SBO_K"} \
      ${SBO_TESTS:-tests/gpu/test_deepep_kernels.py tests/gpu/test_sbo_layer.py} \
      > "$OUT/pytest_$name.txt" 2>&1 || rc=1
    echo "pytest ($name): $(tail -1 "$OUT/pytest_$name.txt")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_$name.txt" | head -20
  done
  [ ${#hang_pids[@]} -gt 0 ] && wait "${hang_pids[@]}"
  for f in "$OUT"/hang_*.md; do [ -f "$f" ] && { echo "$f:"; grep '^|' "$f"; }; done
  for tree in "${tree_list[@]}"; do
    name=$(basename "$tree")
    if [ "$NPROC" -gt 1 ]; then
      PYTHONPATH=$tree:$PYTHONPATH launch benchmarks/sbo_layer_bench.py worker \
        ${SBO_SHAPES:+--shapes $SBO_SHAPES} > "$OUT/sbo_$name.jsonl" || rc=1
    else
      PYTHONPATH=$tree:$PYTHONPATH SBO_TREE=$name python3 benchmarks/sbo_layer_bench.py run \
        --out "$OUT" ${SBO_SHAPES:+--shapes $SBO_SHAPES} > "$OUT/bench_$name.log" 2>&1 || rc=1
    fi
  done
  python3 benchmarks/sbo_layer_bench.py table "$OUT"/sbo_*.jsonl | tee "$OUT/sbo_tables.md"
fi
if [ "$MODE" = graphsets ]; then
  # decode graph sets per overlap mode + the mode selector on their replays, one DeepEP tree
  # (GRAPH_TREE, default deepep-hybrid); GRAPH_ARGS: extra bench_graph_sets.py options
  tree=${tree_list[0]:-}
  for t in "${tree_list[@]}"; do [ "$(basename "$t")" = "${GRAPH_TREE:-deepep-hybrid}" ] && tree=$t; done
  python3 benchmarks/sbo_layer_bench.py warm --of "${WARM_PROCS:-5}" --shapes \
    "$(python3 benchmarks/bench_graph_sets.py --print-warm-shapes ${GRAPH_ARGS:-})" || rc=1
  PYTHONPATH=$tree:$PYTHONPATH timeout "${GRAPH_TIMEOUT:-420}" python3 \
    benchmarks/bench_graph_sets.py --json "$OUT/graph_sets.json" ${GRAPH_ARGS:-} 2>&1 \
    | tee "$OUT/graph_sets.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$MODE" = gpusuite ]; then
  # every file of tests/gpu on this stack, the DeepEP tests once per tree; pytest workers per file
  # from its gpu_mem markers and this card's memory (tests/gpu/memory.py: files needing the same
  # workers share a run); per-file counts from each run's JUnit report (benchmarks/junit_counts.py)
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  gib=$(( ${mib:-81000} / 1024 ))
  suite() {  # suite NAME WORKERS FILE...: one pytest run, its last line and failures printed
    local name=$1 n=$2; shift 2
    local xdist=(); [ "$n" -gt 1 ] && xdist=(-n "$n")
    timeout "${SUITE_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rs "${xdist[@]}" \
      --junitxml="$OUT/junit_$name.xml" "$@" > "$OUT/pytest_$name.txt" 2>&1 || rc=1
    echo "pytest ($name, $n workers): $(tail -1 "$OUT/pytest_$name.txt")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_$name.txt" | head -20
  }
  export SGLANG_OVERLAP_REQUIRE_DEEPEP=1 SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1
  export SGLANG_OVERLAP_REQUIRE_DGOWN=1 SGLANG_OVERLAP_GPU_SEEDS=${GPU_SEEDS:-4}
  deepep_files=(tests/gpu/test_deepep_kernels.py tests/gpu/test_sbo_layer.py)
  part=${SUITE_PART:-all}  # deepep | rest | all: the suite in two calls where one is too short
  case "$part" in deepep|rest|all) ;; *) echo "SUITE_PART=$part: deepep, rest or all"; exit 2;; esac
  [ "$part" = rest ] && tree_list=()
  for tree in "${tree_list[@]}"; do
    while read -r n files; do
      # shellcheck disable=SC2086
      PYTHONPATH=$tree:$PYTHONPATH suite "deepep_$(basename "$tree")_w$n" "$n" $files
    done < <(python3 -m tests.gpu.memory --total-gib "$gib" --groups "${deepep_files[@]}")
  done
  [ "$part" != deepep ] && while read -r n files; do
    # shellcheck disable=SC2086
    suite "w$n" "$n" $files
  done < <(python3 -m tests.gpu.memory --total-gib "$gib" --groups \
           --exclude test_deepep_kernels.py --exclude test_sbo_layer.py)
  python3 benchmarks/junit_counts.py "$OUT"/junit_*.xml | tee "$OUT/gpusuite.md"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$MODE" = gemm ] || [ "$MODE" = all ]; then
  python3 benchmarks/gpu_suite.py all --out "$OUT" "$@" || rc=1
fi
if [ "$MODE" = padded ] || [ "$MODE" = all ]; then
  python3 benchmarks/bench_padded_gemm.py --json "$OUT/padded.json" ${PADDED_EXPERTS:+--experts \
    $PADDED_EXPERTS} ${PADDED_SHAPES:+--shapes $PADDED_SHAPES} | tee "$OUT/padded.md" || rc=1
  SGLANG_OVERLAP_GPU_SEEDS=${GPU_SEEDS:-12} python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_signal_gemm.py > "$OUT/pytest_signal_gemm.txt" 2>&1 || rc=1
  echo "pytest (signal gemm): $(tail -1 "$OUT/pytest_signal_gemm.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_signal_gemm.txt" | head -20
fi
if [ "$MODE" = dgsignal ] || [ "$MODE" = all ]; then
  # the fp64 reference of the largest case takes ~36 GiB per worker: 6 fit an H200, 2 an H100
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  DG_WORKERS=${PYTEST_WORKERS:-$(( ${mib:-81000} >= 120000 ? 6 : 2 ))}
  SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1 SGLANG_OVERLAP_GPU_SEEDS=${GPU_SEEDS:-12} python3 -m pytest -q \
    -n "$DG_WORKERS" -p no:cacheprovider tests/gpu/test_deepgemm_signal.py > "$OUT/pytest_dg_signal.txt" 2>&1 || rc=1
  echo "pytest (patched DeepGEMM): $(tail -1 "$OUT/pytest_dg_signal.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_dg_signal.txt" | head -20
  DG_PRINT_CONFIGS=1 python3 benchmarks/bench_dg_signal.py --json "$OUT/dg_signal.json" \
    ${DGSIG_SHAPES:+--shapes $DGSIG_SHAPES} > "$OUT/dg_signal.log" 2>&1 || rc=1
  sed -n '/^Copy bandwidth/,$p' "$OUT/dg_signal.log" | tee "$OUT/dg_signal.md"
  { grep -v -E '^(\{|\|)' "$OUT/dg_signal.log" | grep -i -E "layout|block|wave|config" | sort -u
    for f in "$DG_JIT_CACHE_DIR"/cache/*/kernel.cu; do
      [ -f "$f" ] && tr -s ' \n' ' ' < "$f" | grep -o "sm90_fp8_gemm_1d2d_impl<[^>]*>" && echo
    done; } > "$OUT/dg_configs.txt" 2>&1
fi
(cd "$(dirname "$DG_JIT_CACHE_DIR")" && tar -czf "$OUT/caches.tar.gz" deep_gemm triton 2>/dev/null) || true  # staged: GK/jit
echo "run_gpu.sh $MODE exit $rc"
exit $rc

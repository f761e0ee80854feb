#!/usr/bin/env bash
# Stage the users' stack (benchmarks/serve/build_kit.sh's kit) on the GPU machine, from the repo
# root there:
#   bash benchmarks/serve/stage.sh recv      # one call per part: carry .gpukit/kit.json and
#                                            # .gpukit/parts/part-NN; prints held / missing
#   bash benchmarks/serve/stage.sh install   # all parts held: assemble, install, check (carry
#                                            # .gpukit/jit.tar.gz and antgroup-opt-<kit>.so.gz
#                                            # too where an earlier run returned them)
#   source /tmp/gk/env.sh                    # later calls (run_gpu.sh does): the stack first
# install puts torch 2.14.1 (+ torchvision 0.29.1) + NCCL 2.30.7 + triton 3.8.0 + sgl-deep-ep +
# sgl-deep-gemm 0.2.3.post2 in GK/stack (pip --target), SGLang, sglang-kernel and the server's other packages in GK/sg,
# sgl-deep-gemm 0.2.5 in GK/dg-0.2.5, DeepEP's antgroup-opt tree (built against the staged torch
# if the kit has no prebuilt extension) in GK/trees/antgroup-opt, and writes GK/env.sh (both
# first on PYTHONPATH, ahead of the image's torch 2.11). Then it checks what it installed:
# torch's version and the NCCL it loaded, triton's version, kernel_check.py (SGLang's and
# DeepGEMM's kernels against torch references) and deepep_check.py (a one-rank DeepEP buffer,
# dispatch and combine, both trees), and prints a table; GK/stack.json (copied to $OUT) holds it.
# Exit 0 only if every check passed. A second install of the same kit only re-runs the checks.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
G=${GK:-/tmp/gk}; export GK=$G
OUT=${OUT:-$ROOT/.gpu-out}; mkdir -p "$OUT" "$G"
T0=$(date +%s.%N)
at() { python3 -c "import sys,time; print(f'[stage +{time.time()-float(sys.argv[1]):.1f}s] ' + sys.argv[2])" "$T0" "$*"; }
case "${1:-}" in
  recv) exec python3 benchmarks/serve/stage.py recv ;;
  status) exec python3 benchmarks/serve/stage.py status ;;
  install) ;;
  *) echo "usage: stage.sh recv|status|install"; exit 2 ;;
esac

python3 benchmarks/serve/stage.py status || { at "parts missing: send them first (recv)"; exit 3; }
kit=$(python3 -c "import json; print(json.load(open('$G/kit.json'))['kit'])")
P=$G/payload S=$G/stack X=$G/sg A=$G/trees/antgroup-opt D=$G/dg-0.2.5 L=$G/logs
mkdir -p "$L"
if [ "$(cat "$G/installed" 2>/dev/null)" != "$kit" ]; then
  rm -rf "$P" "$S" "$X" "$A" "$D"; mkdir -p "$S" "$X" "$A" "$D" "$G/jit"
  python3 benchmarks/serve/stage.py assemble "$P" || exit 1
  pipt() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
  pids=()
  pipt "$S" "$P"/wheels/torch-*.whl "$P"/wheels/torchvision-*.whl \
    "$P"/wheels/nvidia_nccl_cu13-*.whl "$P"/wheels/triton-*.whl \
    "$P"/wheels/sgl_deep_ep-*.whl "$P"/wheels/sgl_deep_gemm-0.2.3.post2-*.whl \
    > "$L/pip_stack.log" 2>&1 & pids+=($!)
  pipt "$D" "$P"/wheels/sgl_deep_gemm-0.2.5-*.whl > "$L/pip_dg025.log" 2>&1 & pids+=($!)
  for a in sglang sgl_kernel deps; do tar -xJf "$P/$a.tar.xz" -C "$X" & pids+=($!); done
  tar -xJf "$P/deepep-antgroup-opt.tar.xz" -C "$A" & pids+=($!)
  [ -f "$P/sgo.tar.gz" ] && { tar -xzf "$P/sgo.tar.gz" -C "$G/jit" & pids+=($!); }
  [ -f "$P/jit.tar.gz" ] && { tar -xzf "$P/jit.tar.gz" -C "$G/jit" & pids+=($!); }
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || { at "install FAILED"; tail -5 "$L"/pip_*.log; exit 1; }
  rm -rf "$P"
  cat > "$G/env.sh" <<EOF
# the users' stack staged by benchmarks/serve/stage.sh (kit $kit)
export PYTHONPATH=$S:$X\${PYTHONPATH:+:\$PYTHONPATH}
export GK=$G GK_STACK=$S GK_SG=$X GK_ANT=$A GK_DG025=$D
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:/opt/gcc/bin:\$PATH PYTHONUNBUFFERED=1
export DG_JIT_CACHE_DIR=$G/jit/deep_gemm SGLANG_DG_CACHE_DIR=$G/jit/deep_gemm
export TRITON_CACHE_DIR=$G/jit/triton SGLANG_OVERLAP_CACHE=$G/jit/sgo DG_JIT_USE_NVRTC=0
EOF
  # the image's NVSHMEM 3.4.5 (what torch 2.14.1 and both DeepEPs link): an extension built on
  # another machine carries that machine's rpath, so name the library folder
  nvshmem=$(python3 -c "import nvidia.nvshmem as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$nvshmem" ] && echo "export LD_LIBRARY_PATH=$nvshmem\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >> "$G/env.sh"
  echo "$kit" > "$G/installed"
  at "installed kit $kit: $(du -sh "$S" | cut -f1) stack, $(du -sh "$X" | cut -f1) SGLang"
fi
# JIT caches of a later run than the kit's (run_serve.sh's jit.tar.gz, carried beside the last
# part as .gpukit/jit.tar.gz): the first server then skips DeepGEMM's and Triton's compiles
J=$ROOT/.gpukit/jit.tar.gz
if [ -f "$J" ] && [ "$(cat "$G/jit/.carried" 2>/dev/null)" != "$(cksum < "$J")" ]; then
  tar -xzf "$J" -C "$G/jit" && cksum < "$J" > "$G/jit/.carried" \
    && at "JIT caches from $J: $(du -sh "$G/jit" | cut -f1)"
fi
# shellcheck disable=SC1091
source "$G/env.sh"
export PYTHONPATH=$ROOT:$PYTHONPATH

# STAGE_CHECKS=0 (a call short of device time): the versions only; no kernel or DeepEP check,
# no antgroup-opt build (the per-block servers then cannot run)
CHECKS=${STAGE_CHECKS:-1}
# the antgroup-opt extension an earlier install of this kit built here (run_serve.sh returns it as
# deep_ep_cpp*.so.gz; carried as .gpukit/antgroup-opt-<kit>.so.gz): no rebuild (~35 s)
SO=$ROOT/.gpukit/antgroup-opt-$kit.so.gz
if [ -f "$SO" ] && ! compgen -G "$A/deep_ep_cpp*.so" > /dev/null; then
  gzip -dc "$SO" > "$A/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so" && at "antgroup-opt extension from $SO"
fi
if [ "$CHECKS" = 1 ] && ! compgen -G "$A/deep_ep_cpp*.so" > /dev/null; then  # per-block tree: build it here (~1 min)
  bash benchmarks/serve/build_deepep.sh "$A" > "$L/deepep_build.log" 2>&1 &
  build=$!
fi
python3 -c "
import json, torch, triton, deep_gemm, sglang, sgl_kernel
from importlib.metadata import version
r = {'torch': torch.__version__, 'torch_file': torch.__file__, 'cuda': torch.version.cuda,
     'nccl': '.'.join(map(str, torch.cuda.nccl.version())), 'triton': triton.__version__,
     'deep_gemm': version('sgl-deep-gemm'), 'sglang': sglang.__version__,
     'sglang_kernel': version('sglang-kernel'), 'deep_ep': version('sgl-deep-ep'),
     'gpu': torch.cuda.get_device_name(0)}
print(json.dumps(r))
want = {'torch': '2.14.1', 'nccl': '2.30.7', 'triton': '3.8.0'}
bad = {k: r[k] for k, w in want.items() if not r[k].startswith(w)}
assert not bad, f'not the users stack: {bad} (want {want})'" > "$L/versions.json" 2> "$L/versions.err"
vs=$?; [ $vs = 0 ] || tail -3 "$L/versions.err"
at "versions: $(cat "$L/versions.json")"
kc=0 ds=0 da=0
rm -f "$L"/kernels.json "$L"/deepep_*.json
if [ "$CHECKS" = 1 ]; then
  python3 benchmarks/serve/kernel_check.py --json "$L/kernels.json" > "$L/kernels.log" 2>&1
  kc=$?
  grep "^\[kernels\]" "$L/kernels.log"
  python3 benchmarks/serve/deepep_check.py --json "$L/deepep_sgl.json" > "$L/deepep_sgl.log" 2>&1
  ds=$?
  at "sgl-deep-ep one rank: $(tail -1 "$L/deepep_sgl.log")"
  if [ -n "${build:-}" ]; then
    wait "$build" || at "DeepEP antgroup-opt build FAILED: $(tail -3 "$L/deepep_build.log")"
    at "DeepEP antgroup-opt built: $(ls "$A"/deep_ep_cpp*.so 2>/dev/null)"
    for so in "$A"/deep_ep_cpp*.so; do  # back, to carry next time as .gpukit/antgroup-opt-<kit>.so.gz
      [ -f "$so" ] && gzip -c "$so" > "$OUT/antgroup-opt-$kit.so.gz"
    done
  fi
  DEEPEP_DISABLE_LL_DISPATCH_OPT=1 PYTHONPATH=$A:$PYTHONPATH python3 benchmarks/serve/deepep_check.py \
    --json "$L/deepep_ant.json" > "$L/deepep_ant.log" 2>&1
  da=$?
  at "antgroup-opt one rank: $(tail -1 "$L/deepep_ant.log")"
else
  at "kernel and DeepEP checks skipped (STAGE_CHECKS=0)"
fi
python3 - "$L" "$kit" "$G" <<'EOF' | tee "$OUT/stack.md"
import json, sys
from pathlib import Path
L, kit, G = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
def load(name):
    if not (L / name).exists():
        return {"skipped": "STAGE_CHECKS=0"}
    try:
        return json.loads((L / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
v, k = load("versions.json"), load("kernels.json")
arr = [json.loads(x) for x in (G / "parts" / "arrivals.jsonl").read_text().splitlines()]
span = arr[-1]["t"] - arr[0]["t"] if len(arr) > 1 else 0.0
rows = [("kit", f"{kit}: {len(arr)} parts, {sum(a['bytes'] for a in arr) / 2**20:.0f} MiB, "
         f"received over {span:.0f} s ({span / max(1, len(arr) - 1):.1f} s a call)")]
rows += [(key, str(v.get(key, v.get("error")))) for key in
         ("gpu", "torch", "cuda", "nccl", "triton", "sglang", "sglang_kernel", "deep_gemm", "deep_ep")]
rows += [(r["check"], ("ok" if r["ok"] else "FAIL") + f" {r.get('rel_err', r.get('error'))}")
         for r in (k if isinstance(k, list) else [])]
if isinstance(k, dict) and "skipped" in k:
    rows.append(("kernel_check.py", f"skipped ({k['skipped']})"))
for tree in ("sgl", "ant"):
    d = load(f"deepep_{tree}.json")
    verdict = "skipped " if "skipped" in d else "ok " if d.get("ok") else "FAIL "
    rows.append((f"deepep one rank ({tree})", verdict + json.dumps(d)))
print("| staged stack | |\n|---|---|")
for a, b in rows:
    print(f"| {a} | {' '.join(str(b).split())[:400]} |")
json.dump({"versions": v, "kernels": k, "deepep": {t: load(f"deepep_{t}.json") for t in
           ("sgl", "ant")}, "arrivals": arr}, open(L / "stack.json", "w"), indent=1)
EOF
cp "$L/stack.json" "$OUT/" 2>/dev/null
at "stage install: versions $vs, kernels $kc, deepep sgl $ds, ant $da"
[ $vs = 0 ] && [ $kc = 0 ] && [ $ds = 0 ] && [ $da = 0 ]

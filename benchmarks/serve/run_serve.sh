#!/usr/bin/env bash
# `benchmarks/run_gpu.sh serve` on the GPU machine (one H100/H200), after
# `benchmarks/serve/stage.sh install` staged the users' stack (torch 2.14.1, NCCL 2.30.7,
# triton 3.8.0, SGLang 0.5.23, sglang-kernel 0.4.10, sgl-deep-ep, sgl-deep-gemm 0.2.3.post2, the
# antgroup-opt DeepEP tree): install the plugin (and, for the planted-bug server, a copy with the
# bug planted) from this tree, draw the DeepSeek-V3-width fp8 checkpoint, fill DeepGEMM's JIT
# cache for its shapes in parallel, then start real `sglang serve` processes one after another
# (serve_suite.py) and print the table (report.py). What a call already did on this machine (the
# checkpoint, the JIT caches, servers whose records exist) is kept: a second call goes on.
#   SERVERS=base,plugin,...  MOE_LAYERS=2  DEADLINE_S=560 (stop starting servers after this many
#   seconds from the script's start)  CONCURRENCY=1,16,64  FRESH=1 (forget earlier records)
# $OUT gets: serve_table.md, serve_results.json, logs.tar.gz, jit.tar.gz (the JIT caches, for the
# kit: build_kit.sh JIT_CACHE=...).
set -uo pipefail
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
OUT=${OUT:-$ROOT/.gpu-out}; G=${GK:-/tmp/gk}
log() { echo "[serve +$(( $(date +%s) - T0 ))s] $*"; }
[ -f "$G/env.sh" ] || { echo "the stack is not staged: bash benchmarks/serve/stage.sh install"; exit 2; }
# shellcheck disable=SC1091
source "$G/env.sh"
export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv,noheader
W=$G/out; [ "${FRESH:-0}" = 1 ] && rm -rf "$W"; mkdir -p "$OUT" "$W"

log "plugin"
rm -rf "$G/plugin" "$G/planted" "$G/probe" "$G/planted-src"
pipt() { python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$@"; }
pipt "$G/plugin" . > "$W/pip.log" 2>&1 || { log "pip (plugin) failed"; tail -5 "$W/pip.log"; exit 1; }
pipt "$G/probe" benchmarks/serve/probe >> "$W/pip.log" 2>&1 || { log "pip (probe) failed"; exit 1; }
# the planted bug (tests/mutation/decision_glue.py M17: a one-sequence none step replays the SBO
# graphs): the decisions-vs-replays check must fail on the server that runs it
mkdir -p "$G/planted-src" && cp -r pyproject.toml README.md LICENSE sglang_overlap "$G/planted-src/"
PYTHONPATH=$ROOT python3 - "$G/planted-src" <<'EOF' || { log "planting failed"; exit 1; }
import sys
from pathlib import Path
from tests.mutation.decision_glue import NEW
m = next(m for m in NEW if m.id == "M17")
f = Path(sys.argv[1]) / m.file
text = f.read_text()
assert text.count(m.before) == 1, f"M17 no longer applies to {m.file}"
f.write_text(text.replace(m.before, m.after))
print(f"planted {m.id} ({m.what}) in {m.file}")
EOF
pipt "$G/planted" "$G/planted-src" >> "$W/pip.log" 2>&1 || { log "pip (planted) failed"; exit 1; }

MODEL=/dev/shm/dsv3
shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
[ -f "$MODEL/config.json" ] || [ "${shm:-0}" -ge 40 ] || MODEL=/tmp/dsv3
# the checkpoint is drawn while DeepGEMM's JIT warms up (it needs only config.json, written first)
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
  python3 benchmarks/serve/make_model.py "$MODEL" --moe-layers "${MOE_LAYERS:-2}" \
    > "$W/make_model.log" 2>&1 &
  draw=$!
  for _ in $(seq 60); do [ -f "$MODEL/config.json" ] && break; sleep 0.5; done
fi
if [ ! -f "$G/jit/warmed" ]; then  # every GEMM shape in parallel, before any server needs it
  timeout "${WARM_TIMEOUT:-150}" python3 benchmarks/serve/warm_deepgemm.py "$MODEL" --max-prefill 256 --max-rows 256 \
    --low-latency-only --json "$W/warm_deepgemm.json" \
    > "$W/warm_deepgemm.log" 2>&1 && touch "$G/jit/warmed"
  log "DeepGEMM JIT warm-up: $(tail -1 "$W/warm_deepgemm.log")"
fi
if [ -n "${draw:-}" ]; then
  wait "$draw" || { log "make_model failed: $(tail -3 "$W/make_model.log")"; exit 1; }
fi
log "model: $(tail -1 "$W/make_model.log" 2>/dev/null); $(du -sh "$MODEL" | cut -f1) at $MODEL"

export SERVE_TREES="{\"sgl-deep-ep\": \"\", \"antgroup-opt\": \"$GK_ANT\"}"
export SERVE_SITE_PLUGIN=$G/plugin SERVE_SITE_PLANTED=$G/planted SERVE_SITE_PROBE=$G/probe
D=$(( T0 + ${DEADLINE_S:-560} ))
timeout -s INT $(( D - $(date +%s) )) python3 benchmarks/serve/serve_suite.py \
  --model "$MODEL" --out "$W" \
  --servers "${SERVERS:-base,plugin,base_again,plugin_again,sbo_expert,auto,auto_planted,sbo_block,tbo_one_rank}" \
  --concurrency "${CONCURRENCY:-1,16,64}" --deadline "$D" --min-left "${SERVE_MIN_LEFT:-100}"
rc=$?
pkill -9 -f "sglang.cli.main" 2>/dev/null; pkill -9 -f "sglang::" 2>/dev/null
(cd "$G/jit" && tar -czf "$OUT/jit.tar.gz" deep_gemm triton sgo 2>/dev/null)
cp "$G/logs/stack.json" "$W/" 2>/dev/null
python3 benchmarks/serve/report.py "$W" --json "$OUT/serve_results.json" | tee "$OUT/serve_table.md"
rep=${PIPESTATUS[0]}
(cd "$W" && tar -czf "$OUT/logs.tar.gz" --exclude='probe_*' --exclude='*.jsonl' . 2>/dev/null)
log "serve exit $rc, report exit $rep"
exit $(( rc | rep ))

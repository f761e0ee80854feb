#!/usr/bin/env bash
# Build, on this (CPU) machine, the stack users run, cut into parts that the GPU machine receives
# one device call at a time (benchmarks/serve/stage.sh there):
#   bash benchmarks/serve/build_kit.sh            # -> .gpukit/kit.json + .gpukit/parts/part-NN
# The GPU machine has Python 3.12, torch 2.11, triton 3.6, NCCL 2.28.9 and no package index; what
# `pip install sglang==0.5.23` gives users travels instead (cp312 wheels, downloads cached in
# .gpukit/dl):
#   wheels/           torch 2.14.1 (cu130), torchvision 0.29.1, nvidia-nccl-cu13 2.30.7, triton
#                     3.8.0, sgl-deep-ep 0.1.2.post1 (the per-expert combine form), sgl-deep-gemm
#                     0.2.3.post2 (what sglang 0.5.23 pins) and 0.2.5 (the newest, for the
#                     producer benchmark)
#   sglang.tar.xz     SGLang 0.5.23's Python (no .so: its Rust extensions are optional; no tests,
#                     no diffusion code)
#   sgl_kernel.tar.xz sglang-kernel 0.4.10 without FA3 (flash_ops, 1.1 GB: --attention-backend
#                     triton), its SM100 and InfLLM builds; FlashMLA kept (decode)
#   deps.tar.xz       the pure-Python and cp312 packages a server imports that the machine lacks
#                     (benchmarks/serve/device-wheels.txt, pinned as sglang 0.5.23 installs them)
#   deepep-antgroup-opt.tar.xz  DeepEP's antgroup-opt tree (the per-block combine form; no wheel
#                     exists), with deep_ep_cpp built against torch 2.14.1 where DEEPEP_SO names
#                     it (benchmarks/serve/build_deepep.sh); otherwise stage.sh builds it there
#   sgo.tar.gz        optional (SGO_CACHE): the patched DeepGEMM producer's cubins (nvcc 13.0.88)
#   jit.tar.gz        optional (JIT_CACHE): DeepGEMM's and Triton's JIT caches of an earlier run
# The payload (an uncompressed tar of the above: the wheels are compressed already) is split into
# parts of PART_MIB (59: one part, the working tree and kit.json fit one 64 MiB call); kit.json
# lists each part's size and sha256 and the payload's contents.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT:-.gpukit}; DL=$KIT/dl; PAY=$KIT/payload; PART_MIB=${PART_MIB:-59}
PY=${PY:-.venv/bin/python}
mkdir -p "$DL/big" "$DL/wheels" "$DL/deps" "$PAY/wheels"
dl() {  # dl DEST SPEC...: cp312 manylinux wheels, no dependencies
  local dest=$1; shift
  local plat=()
  for p in manylinux2014 manylinux_2_17 manylinux_2_18 manylinux_2_24 manylinux_2_26 \
      manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
    plat+=(--platform "${p}_x86_64")
  done
  local spec out
  for spec in "$@"; do  # one at a time: pip refuses two versions of a package in one call
    out=$("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${plat[@]}" --platform any -d "$dest" "$spec" 2>&1) \
      || { echo "$out" | grep -v WARNING; echo "download of $spec failed"; exit 1; }
  done
}
xzdir() {  # xzdir OUT DIR: DIR's contents as tar.xz
  tar -C "$2" --exclude=__pycache__ -cf - . | xz -T0 -6 > "$1"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

dl "$DL/big" torch==2.14.1 nvidia-nccl-cu13==2.30.7 triton==3.8.0
# torchvision: transformers imports it where installed, and the image's 0.26 (torch 2.11) fails
# on torch 2.14.1 ("operator torchvision::nms does not exist"): users have 0.29.1 beside 2.14.1
dl "$DL/wheels" sgl-deep-ep==0.1.2.post1 sgl-deep-gemm==0.2.3.post2 sgl-deep-gemm==0.2.5 \
  torchvision==0.29.1
for w in "$DL"/big/*.whl "$DL"/wheels/sgl_deep_*.whl "$DL"/wheels/torchvision-*.whl; do
  ln -f "$w" "$PAY/wheels/"
done

if [ ! -f "$PAY/sglang.tar.xz" ]; then
  dl "$DL" sglang==0.5.23
  mkdir "$tmp/sg" && unzip -q "$DL"/sglang-0.5.23-*.whl -d "$tmp/sg" \
    -x '*.so' 'sglang/test/*' 'sglang/multimodal_gen/*'
  xzdir "$PAY/sglang.tar.xz" "$tmp/sg"
fi
if [ ! -f "$PAY/sgl_kernel.tar.xz" ]; then
  dl "$DL" sglang-kernel==0.4.10
  mkdir "$tmp/sk" && unzip -q "$DL"/sglang_kernel-0.4.10-*.whl -d "$tmp/sk" \
    -x 'sgl_kernel/flash_ops*' 'sgl_kernel/sm100/*' 'sgl_kernel/infllm_ops*'
  xzdir "$PAY/sgl_kernel.tar.xz" "$tmp/sk"
fi
if [ ! -f "$PAY/deps.tar.xz" ]; then
  mapfile -t specs < <(grep -v '^#' benchmarks/serve/device-wheels.txt)
  dl "$DL/deps" "${specs[@]}"
  mkdir "$tmp/deps"
  for w in "$DL"/deps/*.whl; do unzip -q -o "$w" -d "$tmp/deps"; done
  xzdir "$PAY/deps.tar.xz" "$tmp/deps"
fi
if [ ! -f "$PAY/deepep-antgroup-opt.tar.xz" ] || [ -n "${DEEPEP_SO:-}" ]; then
  # DEEPEP_SRC: the folder holding deepep-antgroup-opt-<commit>.tar.gz (the workplace's DeepEP
  # sources; benchmarks/serve/README.md)
  src=${DEEPEP_SRC:?set DEEPEP_SRC to the folder holding deepep-antgroup-opt-*.tar.gz}
  mkdir -p "$tmp/ant" && tar -xzf "$src"/deepep-antgroup-opt-*.tar.gz -C "$tmp/ant"
  tree=$(ls -d "$tmp"/ant/*/ | head -1)
  [ -n "${DEEPEP_SO:-}" ] && cp "$DEEPEP_SO" "$tree/"
  xzdir "$PAY/deepep-antgroup-opt.tar.xz" "$tree"
fi
[ -n "${SGO_CACHE:-}" ] && cp "$SGO_CACHE" "$PAY/sgo.tar.gz"
[ -n "${JIT_CACHE:-}" ] && cp "$JIT_CACHE" "$PAY/jit.tar.gz"

rm -rf "$KIT/parts"; mkdir -p "$KIT/parts"
# the wheels first, what changes most (the DeepEP tree's extension, the caches) last: a rebuild
# that changes only those leaves the earlier parts as they were
order=$(cd "$PAY" && ls wheels/*.whl; ls *.tar.xz | grep -v deepep; ls deepep-*.tar.xz
  ls *.tar.gz 2>/dev/null || true)
tar -C "$PAY" -cf - $order | split -b "${PART_MIB}M" -d -a 2 - "$KIT/parts/part-"
"$PY" - "$KIT" "$PAY" <<'EOF'
import hashlib, json, sys, time
from pathlib import Path
kit, pay = Path(sys.argv[1]), Path(sys.argv[2])
parts = []
for p in sorted((kit / "parts").iterdir()):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    parts.append({"name": p.name, "bytes": p.stat().st_size, "sha256": h.hexdigest()})
contents = {str(f.relative_to(pay)): f.stat().st_size for f in sorted(pay.rglob("*")) if f.is_file()}
kit_id = hashlib.sha256("".join(p["sha256"] for p in parts).encode()).hexdigest()[:12]
(kit / "kit.json").write_text(json.dumps({
    "format": 1, "kit": kit_id, "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "parts": parts, "payload_bytes": sum(p["bytes"] for p in parts), "contents": contents},
    indent=1))
print(f"kit {kit_id}: {len(parts)} parts, {sum(p['bytes'] for p in parts) / 2**20:.0f} MiB")
for name, size in contents.items():
    print(f"  {size / 2**20:8.1f} MiB  {name}")
EOF

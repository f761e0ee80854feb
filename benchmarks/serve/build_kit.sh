#!/usr/bin/env bash
# Build, on this (CPU) machine, what `benchmarks/run_gpu.sh serve` carries to the GPU machine:
#   bash benchmarks/serve/build_kit.sh [KIT=.gpukit]
# The GPU machine has Python 3.12, torch 2.11 and no package index; SGLang 0.5.23 wants torch 2.14.
# Everything SGLang needs there and lacks travels as tar.xz (one device call carries 64 MiB):
#   sglang.tar.xz     SGLang 0.5.23's Python (from its cp311 wheel: no .so - its Rust extensions
#                     are optional -, no tests, no diffusion code)
#   sgl_kernel.tar.xz sglang-kernel 0.4.10 without FA3 (flash_ops, 1.1 GB: --attention-backend
#                     triton), the SM100 and InfLLM builds
#   deps.tar.xz       the pure-Python and cp312 packages the server imports that the machine lacks
#                     (benchmarks/serve/device-wheels.txt, pinned as sglang 0.5.23 installs them)
#   wheels/           sgl-deep-gemm 0.2.3.post2 (the release SGLang 0.5.23 pins)
#   deepep/<tree>.tar.xz  a DeepEP v1 tree with its prebuilt cp312 extension (DEEPEP_SRC: the
#                     folder holding deepep-<tree>-*.tar.gz and prebuilt/<tree>_deep_ep_cpp*.so.gz)
# Downloads are cached in $KIT/dl. Needs python3.12 (PY312) for cp312 wheel resolution.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${1:-.gpukit}; DL=$KIT/dl; mkdir -p "$DL/wheels" "$KIT/wheels" "$KIT/deepep"
PY=${PY:-.venv/bin/python}
dl() {  # dl DEST PYVER SPEC...: cp wheels, no dependencies
  local dest=$1 pyv=$2; shift 2
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyv" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 --platform any -d "$dest" "$@"
}
xzdir() {  # xzdir OUT DIR [tar args...]
  local out=$1 dir=$2; shift 2
  tar -C "$dir" "$@" --exclude=__pycache__ -cf - . | xz -T0 -6 > "$out"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$KIT/sglang.tar.xz" ]; then
  dl "$DL" 3.11 sglang==0.5.23
  mkdir "$tmp/sg" && unzip -q "$DL"/sglang-0.5.23-*.whl -d "$tmp/sg" \
    -x '*.so' 'sglang/test/*' 'sglang/multimodal_gen/*'
  xzdir "$KIT/sglang.tar.xz" "$tmp/sg"
fi
if [ ! -f "$KIT/sgl_kernel.tar.xz" ]; then
  dl "$DL" 3.12 sglang-kernel==0.4.10
  mkdir "$tmp/sk" && unzip -q "$DL"/sglang_kernel-0.4.10-*.whl -d "$tmp/sk" \
    -x 'sgl_kernel/flash_ops*' 'sgl_kernel/sm100/*' 'sgl_kernel/infllm_ops*' 'sgl_kernel/flashmla_ops*'
  xzdir "$KIT/sgl_kernel.tar.xz" "$tmp/sk"
fi
if [ ! -f "$KIT/deps.tar.xz" ]; then
  mapfile -t specs < <(grep -v '^#' benchmarks/serve/device-wheels.txt)
  dl "$DL/wheels" 3.12 "${specs[@]}"
  mkdir "$tmp/deps"
  for w in "$DL"/wheels/*.whl; do unzip -q -o "$w" -d "$tmp/deps"; done
  xzdir "$KIT/deps.tar.xz" "$tmp/deps"
fi
dl "$KIT/wheels" 3.12 sgl-deep-gemm==0.2.3.post2
if [ -n "${DEEPEP_SRC:-}" ]; then
  for tree in hybrid-ep antgroup-opt; do
    [ -f "$KIT/deepep/$tree.tar.xz" ] && continue
    d=$tmp/ep-$tree; mkdir -p "$d"
    tar -xzf "$DEEPEP_SRC"/deepep-$tree-*.tar.gz -C "$d"
    src=$(ls -d "$d"/*/ | head -1)
    gunzip -c "$DEEPEP_SRC"/prebuilt/${tree}_deep_ep_cpp.cpython-312-x86_64-linux-gnu.so.gz \
      > "$src/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so"
    xzdir "$KIT/deepep/$tree.tar.xz" "$src"
  done
fi
du -sh "$KIT"/*.tar.xz "$KIT"/wheels "$KIT"/deepep/* 2>/dev/null

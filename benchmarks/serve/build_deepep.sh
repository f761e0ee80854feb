#!/usr/bin/env bash
# bash benchmarks/serve/build_deepep.sh TREE : build a DeepEP v1 tree's deep_ep_cpp in place
# (setup.py build_ext --inplace), sm_90 only, against the torch first on sys.path (the staged
# 2.14.1 on the GPU machine, or a Python 3.12 venv with torch 2.14.1 here: nvcc 13.0 builds it on
# a machine without a GPU) and the nvidia-nvshmem-cu13 3.4.5 wheel, which setup.py finds itself.
# PY (default python3) is the interpreter; MAX_JOBS the parallel nvcc jobs.
set -uo pipefail
tree=$1; PY=${PY:-python3}
export PATH=/usr/local/cuda/bin:/opt/gcc/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
# NVSHMEM 3.4.5's nvshmem.h includes <cuda/std/tuple>: CUDA 13 keeps CCCL under include/cccl,
# which nvcc adds by itself but g++ (csrc/deep_ep.cpp) does not
export CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
# a toolkit of nvcc alone (this CPU machine): torch's headers want cusparse.h & co. from the
# nvidia-*-cu13 wheels beside torch (EXTRA_INCLUDE=<site-packages>/nvidia/cu13/include)
[ -n "${EXTRA_INCLUDE:-}" ] && export CPLUS_INCLUDE_PATH=$CPLUS_INCLUDE_PATH:$EXTRA_INCLUDE \
  CPATH=$EXTRA_INCLUDE${CPATH:+:$CPATH}
# no driver (this CPU machine): link against a stub libcuda.so.1 of the driver calls DeepEP makes
# (LIBCUDA_STUB=DIR holding libcuda.so); the GPU machine's real driver serves them at load time
[ -n "${LIBCUDA_STUB:-}" ] && export LIBRARY_PATH=$LIBCUDA_STUB${LIBRARY_PATH:+:$LIBRARY_PATH}
unset NVSHMEM_DIR  # setup.py then finds nvidia.nvshmem and links its libnvshmem_host.so.3
cd "$tree" || exit 1
t0=$(date +%s)
"$PY" setup.py build_ext --inplace
rc=$?
echo "built $tree: rc=$rc in $(( $(date +%s) - t0 )) s: $(ls deep_ep_cpp*.so 2>/dev/null)"
exit $rc

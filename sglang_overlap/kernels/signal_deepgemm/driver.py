"""The few CUDA driver calls the launch needs, through ctypes on libcuda (no extra dependency):
module load, TMA descriptors, launch (with a cluster dimension for TMA multicast)."""

from __future__ import annotations

import ctypes

from sglang_overlap.kernels.signal_deepgemm.versions import DgSignalError


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", _ClusterDim)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class Driver:
    """The few CUDA driver calls the launch needs, through ctypes (no extra dependency)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DgSignalError(f"libcuda.so.1 cannot be loaded: {exc}") from exc
        lib, vp, u32, u64 = self.lib, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
        sig = {
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuModuleLoadData": [ctypes.POINTER(vp), ctypes.c_char_p],
            "cuModuleGetFunctionCount": [ctypes.POINTER(ctypes.c_uint), vp],
            "cuModuleEnumerateFunctions": [ctypes.POINTER(vp), ctypes.c_uint, vp],
            "cuFuncSetAttribute": [vp, ctypes.c_int, ctypes.c_int],
            "cuTensorMapEncodeTiled": [vp, ctypes.c_int, u32, vp, ctypes.POINTER(u64),
                                       ctypes.POINTER(u64), ctypes.POINTER(u32),
                                       ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_int],
            "cuLaunchKernel": [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                               ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp,
                               ctypes.POINTER(vp), ctypes.POINTER(vp)],
            "cuLaunchKernelEx": [ctypes.POINTER(_LaunchConfig), vp, ctypes.POINTER(vp),
                                 ctypes.POINTER(vp)],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise DgSignalError(f"{what} failed: CUDA error {result} "
                                f"({(text.value or b'?').decode()})")

    def launch(self, func: int, grid: int, block: int, smem: int, stream: int, cluster: int,
               params: ctypes.Array[ctypes.c_void_p]) -> None:
        if cluster == 1:
            self.check(self.lib.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, smem,
                                               ctypes.c_void_p(stream), params, None),
                       "cuLaunchKernel(patched DeepGEMM masked GEMM)")
            return
        attr = _LaunchAttribute(id=_CLUSTER_DIMENSION)
        attr.value.cluster_dim = _ClusterDim(cluster, 1, 1)
        config = _LaunchConfig((ctypes.c_uint * 3)(grid, 1, 1), (ctypes.c_uint * 3)(block, 1, 1),
                               smem, ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), func, params, None),
                   f"cuLaunchKernelEx(patched DeepGEMM masked GEMM, cluster {cluster})")

    def load_kernel(self, cubin: bytes, smem: int) -> int:
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        count = ctypes.c_uint()
        self.check(self.lib.cuModuleGetFunctionCount(ctypes.byref(count), module),
                   "cuModuleGetFunctionCount")
        if count.value != 1:
            raise DgSignalError(f"the patched kernel's module holds {count.value} functions, "
                                "not 1")
        func = ctypes.c_void_p()
        self.check(self.lib.cuModuleEnumerateFunctions(ctypes.byref(func), 1, module),
                   "cuModuleEnumerateFunctions")
        self.check(self.lib.cuFuncSetAttribute(func, 8, smem),  # MAX_DYNAMIC_SHARED_SIZE_BYTES
                   "cuFuncSetAttribute(max dynamic shared memory)")
        return int(func.value or 0)


class TensorMap:
    """A CUtensorMap (128 opaque bytes) at a 64-byte aligned address, as the driver requires."""

    def __init__(self) -> None:
        self._raw = (ctypes.c_uint8 * 192)()
        base = ctypes.addressof(self._raw)
        self.address = base + (-base) % 64


UINT8, FLOAT32, BFLOAT16 = 0, 7, 9
_SWIZZLE = {0: 0, 16: 0, 32: 1, 64: 2, 128: 3}
_L2_256B = 3


def tensor_map(drv: Driver, ptr: int, dtype: int, elem: int, inner: int, outer: int,
                outer_stride: int, box_inner: int, box_outer: int, swizzle: int) -> TensorMap:
    """A 2D TMA descriptor (DeepGEMM's make_tma_2d_desc): dims (inner, outer), row stride in
    elements, box (box_inner, box_outer); with a swizzle the box's inner size is swizzle bytes."""
    if swizzle:
        box_inner = swizzle // elem
    tmap = TensorMap()
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(outer_stride * elem)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    drv.check(drv.lib.cuTensorMapEncodeTiled(tmap.address, dtype, 2, ptr, dims, strides,
                                             box, estr, 0, _SWIZZLE[swizzle], _L2_256B, 0),
              f"cuTensorMapEncodeTiled(dims={inner}x{outer}, box={box_inner}x{box_outer})")
    return tmap


_DRIVER: Driver | None = None


def driver() -> Driver:
    """The process's driver bindings (libcuda loaded once)."""
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver()
    return _DRIVER

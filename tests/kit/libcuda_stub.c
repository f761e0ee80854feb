/* A stand-in libcuda.so.1 for a machine without an NVIDIA driver (test kit only).
   sgl_kernel is always imported by SGLang and links libcuda.so.1; every entry point here reports
   CUDA_ERROR_STUB_LIBRARY (34), so the CUDA runtime sees "no usable driver" and SGLang stays on
   the CPU. */
#define STUB(name) int name(void) { return 34; }
STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2)
STUB(cuDeviceGetCount)
STUB(cuDeviceGet)
STUB(cuGetErrorString)
STUB(cuGetErrorName)
STUB(cuPointerGetAttribute)

"""The current device's default CUDA memory pool, where a library's cudaMallocAsync draws from: the
tests read its peak to show that calls take their workspace from torch's caching allocator."""

import ctypes

import torch


def default_pool_peak(reset):
    """Peak bytes handed out by the default pool since the last reset; None when libcudart cannot
    be reached."""
    try:
        rt = ctypes.CDLL("libcudart.so.13")
    except OSError:
        return None
    pool = ctypes.c_void_p()
    value = ctypes.c_uint64(0)
    used_mem_high = 8  # cudaMemPoolAttrUsedMemHigh
    if rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), torch.cuda.current_device()) != 0:
        return None
    if reset:
        rt.cudaMemPoolSetAttribute(pool, used_mem_high, ctypes.byref(value))
    rt.cudaMemPoolGetAttribute(pool, used_mem_high, ctypes.byref(value))
    return value.value

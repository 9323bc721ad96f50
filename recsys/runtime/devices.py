"""What the local accelerator offers, asked of the CUDA driver directly (TensorFlow does not say).

TensorFlow reports a GPU's name and compute capability but not its total memory, which sizes the
default embedding budget; the driver library (`libcuda.so.1`, present wherever a GPU is) does.
"""
from __future__ import annotations

import ctypes
from typing import Optional


def gpu_total_memory_bytes(ordinal: int) -> Optional[int]:
    """Total memory of CUDA device `ordinal` (as numbered under CUDA_VISIBLE_DEVICES), or None
    when no CUDA driver or no such device is present."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, total = ctypes.c_int(), ctypes.c_size_t()
    if (driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0
            or driver.cuDeviceTotalMem_v2(ctypes.byref(total), device) != 0):
        return None
    return int(total.value)

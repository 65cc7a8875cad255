"""Tensors and a stand-in torch shared by the DeepGEMM and FlashMLA adapter tests (no GPU, no
torch: NumPy-backed attncheck_bridge tensors)."""

import types

import numpy as np


def aligned(shape, dtype, offset_bytes=0):
    """A zeroed C-contiguous array whose first element is 16-byte aligned (plus offset_bytes)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(n + 64 + offset_bytes, np.uint8)
    start = (-raw.ctypes.data) % 16 + offset_bytes
    return raw[start : start + n].view(dt).reshape(shape)


def fake_torch(capability):
    """A CUDA torch module that answers only the device capability the executors check first."""
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(hip=None, cuda="13.0")
    torch.cuda = types.SimpleNamespace(get_device_capability=lambda: capability)
    return torch

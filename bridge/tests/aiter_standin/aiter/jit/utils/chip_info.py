"""Stand-in for aiter/jit/utils/chip_info.py: the arch comes from AITER_STANDIN_GFX."""

from ..._standin import cu_num, gfx


def get_gfx():
    return gfx()


def get_gfx_runtime():
    return gfx()


def get_cu_num():
    return cu_num()

"""attncheck_bridge codecs against known bit patterns."""

import math

import numpy as np
import pytest

import attncheck_bridge as ab


def f32_bits(x):
    return int(np.float32(x).view(np.uint32))


def bits_f32(b):
    return float(np.uint32(b).view(np.float32))


@pytest.mark.parametrize(
    "bits, value",
    [
        (0x3F80, 1.0),
        (0xC000, -2.0),
        (0x3F00, 0.5),
        (0x4049, 3.140625),
        (0x0001, 2.0**-133),  # smallest subnormal
        (0x0080, 2.0**-126),  # smallest normal
        (0x7F7F, 3.3895313892515355e38),  # largest finite
        (0x7F80, math.inf),
        (0xFF80, -math.inf),
    ],
)
def test_bf16_to_f32(bits, value):
    assert float(ab.bf16_to_f32(np.uint16(bits))) == value


def test_bf16_specials():
    z = ab.bf16_to_f32(np.array([0x8000, 0x7FC0, 0xFFC1], dtype=np.uint16))
    assert z[0] == 0 and np.signbit(z[0])
    assert np.isnan(z[1]) and np.isnan(z[2])


@pytest.mark.parametrize(
    "f32, bf16",
    [
        (0x3F800000, 0x3F80),
        (0x3F808000, 0x3F80),  # tie, even stays
        (0x3F818000, 0x3F82),  # tie, odd rounds up to even
        (0x3F808001, 0x3F81),  # just above the tie
        (0x3F80FFFF, 0x3F81),
        (0xBF808001, 0xBF81),  # negative, magnitude rounds up
        (0x7F7FFFFF, 0x7F80),  # overflow to inf
        (0xFF7FFFFF, 0xFF80),
        (0x7F800000, 0x7F80),
        (0x00000001, 0x0000),  # tiny subnormal rounds to zero
        (0x80000000, 0x8000),  # -0 keeps its sign
        (0x7FA00000, 0x7FE0),  # signalling NaN becomes quiet, payload's top bits kept
        (0xFFC00001, 0xFFC0),
        (0x7F800001, 0x7FC0),  # NaN whose payload is only in the low bits stays NaN
    ],
)
def test_f32_to_bf16_rne(f32, bf16):
    got = ab.f32_to_bf16_rne(np.array([f32], dtype=np.uint32).view(np.float32))
    assert got.dtype == np.uint16
    assert int(got[0]) == bf16, hex(int(got[0]))


def test_bf16_round_trip_every_pattern():
    b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f = ab.bf16_to_f32(b)
    back = ab.f32_to_bf16_rne(f)
    finite = ~np.isnan(f)
    assert np.array_equal(back[finite], b[finite])
    assert np.isnan(ab.bf16_to_f32(back[~finite])).all()


def test_f16_to_f32():
    assert list(ab.f16_to_f32(np.array([0x3C00, 0xC000, 0x0001, 0x7BFF], dtype=np.uint16))) == [1.0, -2.0, 2.0**-24, 65504.0]


@pytest.mark.parametrize(
    "code, value",
    [
        (0x00, 0.0),
        (0x01, 2.0**-9),  # smallest subnormal: 1/8 * 2^-6
        (0x07, 7 * 2.0**-9),
        (0x08, 2.0**-6),  # smallest normal
        (0x38, 1.0),
        (0x3C, 1.5),
        (0x40, 2.0),
        (0x7E, 448.0),  # largest finite
        (0xFE, -448.0),
        (0xB8, -1.0),
    ],
)
def test_e4m3fn(code, value):
    assert float(ab.e4m3fn_to_f32(np.uint8(code))) == value
    assert float(ab.fp8_to_f32(np.uint8(code), "e4m3fn")) == value


def test_e4m3fn_specials():
    all_codes = ab.e4m3fn_to_f32(np.arange(256, dtype=np.uint16).astype(np.uint8))
    assert sorted(np.flatnonzero(np.isnan(all_codes))) == [0x7F, 0xFF]
    assert not np.isinf(all_codes).any()
    assert np.signbit(all_codes[0x80]) and all_codes[0x80] == 0
    assert np.nanmax(all_codes) == 448.0


@pytest.mark.parametrize(
    "code, value",
    [
        (0x00, 0.0),
        (0x01, 2.0**-10),  # bias 8: 1/8 * 2^-7
        (0x08, 2.0**-7),
        (0x40, 1.0),
        (0x7F, 240.0),  # largest finite
        (0xFF, -240.0),
        (0xC0, -1.0),
    ],
)
def test_e4m3fnuz(code, value):
    assert float(ab.e4m3fnuz_to_f32(np.uint8(code))) == value
    assert float(ab.fp8_to_f32(np.uint8(code), "e4m3fnuz")) == value


def test_e4m3fnuz_specials():
    all_codes = ab.e4m3fnuz_to_f32(np.arange(256, dtype=np.uint16).astype(np.uint8))
    assert list(np.flatnonzero(np.isnan(all_codes))) == [0x80]  # the only NaN; no -0
    assert not np.isinf(all_codes).any()
    assert (all_codes[np.arange(256) != 0x80] != 0).sum() == 254


def test_fp8_codecs_are_monotone_on_positive_codes():
    for fn, top in ((ab.e4m3fn_to_f32, 0x7E), (ab.e4m3fnuz_to_f32, 0x7F)):
        v = fn(np.arange(top + 1, dtype=np.uint8))
        assert (np.diff(v) > 0).all()


def test_unknown_fp8_format_is_unsupported():
    with pytest.raises(ab.Unsupported):
        ab.fp8_to_f32(np.uint8(1), "e3m4")

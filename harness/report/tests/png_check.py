"""PNG structure check without matplotlib or PIL: signature, every chunk's CRC, IHDR first,
IDAT present, IEND last with nothing after it. Returns (width, height)."""

import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(data: bytes):
    assert data[:8] == SIGNATURE, f"not a PNG signature: {data[:8]!r}"
    pos, chunks, size = 8, [], None
    while pos < len(data):
        assert pos + 12 <= len(data), f"truncated chunk header at byte {pos}"
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert len(body) == length, f"chunk {kind!r} truncated"
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"bad CRC in chunk {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        chunks.append(kind)
        pos += 12 + length
        if kind == b"IEND":
            break
    assert chunks[0] == b"IHDR", "IHDR is not the first chunk"
    assert b"IDAT" in chunks, "no image data"
    assert chunks[-1] == b"IEND" and pos == len(data), "IEND missing or data after it"
    return size

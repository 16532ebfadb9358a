#!/usr/bin/env python3
"""Round every parameter of a Nectar module file to B bits of mantissa
(round to nearest, ties to even; the exponent is kept), and write the
result as a new module file: a perturbation of known size. On quadrature
modules with p = n pairs initialised from the cache (train --arch quad
--rho 1 --steps 0), which are exact attention, it rounds the document's
keys and values themselves: B = 7 is bfloat16's mantissa, 10 float16's, 3
float8 e4m3's (without their narrower exponent ranges).

usage: scripts/round_modules.py IN.nectar BITS OUT.nectar   (BITS in 1..22)

The layout read here is moduleset_save's in src/formats.c: a 128-byte header
(magic "NTCR", version 4; n_layers and n_kv_heads at bytes 12 and 16,
n_params at byte 64), a table of 8 bytes a module, then n_params float32,
the held-out prompts, and last the 64-bit FNV-1a hash of every byte before
it, which is written again for the rounded file.
"""
import os
import struct
import sys
from array import array


def fnv1a(data):
    """64-bit FNV-1a, as src/util.c hashes: fnv1a(FNV_OFFSET, data)."""
    h = 1469598103934665603
    for byte in data:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    if len(sys.argv) != 4 or not sys.argv[2].isdigit() or not 1 <= int(sys.argv[2]) <= 22:
        sys.exit("usage: scripts/round_modules.py IN.nectar BITS OUT.nectar   (BITS in 1..22)")
    src, bits, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(src, "rb") as f:
        data = f.read()
    if len(data) < 136 or data[:8] != struct.pack("<II", 0x5243544E, 4):
        sys.exit(f"error: {src} is not a version-4 Nectar module file")
    if fnv1a(data[:-8]) != struct.unpack_from("<Q", data, len(data) - 8)[0]:
        sys.exit(f"error: {src}: its checksum does not match its bytes: the file is corrupt")
    n_layers, n_kv_heads = struct.unpack_from("<ii", data, 12)
    (n_params,) = struct.unpack_from("<Q", data, 64)
    start = 128 + 8 * n_layers * n_kv_heads
    end = start + 4 * n_params
    if n_layers <= 0 or n_kv_heads <= 0 or end > len(data) - 8:
        sys.exit(f"error: {src} is truncated or its header is corrupt")
    words = array("I", data[start:end])  # the float32 parameters as their bits
    if sys.byteorder != "little":
        words.byteswap()
    drop = 23 - bits                      # mantissa bits dropped
    half = (1 << (drop - 1)) - 1          # a half unit of the last kept bit, less one: ties go to even
    keep = ~((1 << drop) - 1) & 0xFFFFFFFF
    # x + half + (the last kept bit), truncated: round to nearest even (a carry into the exponent is
    # right); infinities and NaNs (exponent all ones) are left as they are
    words = array("I", (w if w & 0x7F800000 == 0x7F800000 else (w + half + ((w >> drop) & 1)) & keep
                        for w in words))
    if sys.byteorder != "little":
        words.byteswap()
    body = data[:start] + words.tobytes() + data[end:-8]
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(body + struct.pack("<Q", fnv1a(body)))
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()

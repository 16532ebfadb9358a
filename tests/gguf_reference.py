#!/usr/bin/python3
"""gguf-py's dequantization of some tensors of a GGUF model, for
`tests/test_gguf --model` to compare its own with.

Usage:  python3 tests/gguf_reference.py MODEL.gguf OUTDIR NAME [NAME ...]
        (needs numpy and the gguf package)

Writes OUTDIR/NAME.f32 for each tensor NAME: its values as raw little-endian
float32 in GGUF order (dims[0] fastest). Then, for example:

  tests/test_gguf --model MODEL.gguf token_embd.weight=OUTDIR/token_embd.weight.f32
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, quants


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: python3 tests/gguf_reference.py MODEL.gguf OUTDIR NAME [NAME ...]")
    reader = GGUFReader(sys.argv[1])
    outdir = Path(sys.argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    tensors = {t.name: t for t in reader.tensors}
    for name in sys.argv[3:]:
        if name not in tensors:
            sys.exit(f"error: {sys.argv[1]} has no tensor {name}")
        t = tensors[name]
        values = quants.dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
        values.tofile(outdir / f"{name}.f32")
        print(f"{name}: {t.tensor_type.name} {list(map(int, t.shape))} -> {values.size} values")


if __name__ == "__main__":
    main()

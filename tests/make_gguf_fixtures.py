#!/usr/bin/python3
"""Writes the GGUF fixtures that tests/test_gguf.c reads, with gguf-py.

Usage:  python3 tests/make_gguf_fixtures.py tests/data
        (needs numpy and the gguf package; the output is the same bytes on
        every run, so regenerating leaves git status clean)

Writes into OUTDIR:
  gguf_types.gguf    metadata of every GGUF value type (nested arrays, an
                     empty string, a string holding a NUL byte, the extremes
                     of the 64-bit integers, general.alignment = 64) and
                     tensors of every type test_gguf dequantizes: F32, F16 and
                     BF16 with zeros, subnormals, infinities and NaNs; Q8_0,
                     Q4_0 and Q4_1 quantized from seeded normal values by
                     gguf-py; Q4_K, Q5_K and Q6_K as seeded random blocks with
                     sane fp16 scales (gguf-py only dequantizes K-quants); and
                     one Q5_0 tensor, a type the C reader does not dequantize.
  gguf_types.expect  gguf-py's dequantization of each tensor of gguf_types.gguf:
                       tensor NAME TYPE NDIMS DIM0 .. DIM{NDIMS-1}
                     then the values as float32 bit patterns in hex, 8 a line
                     (types that test_gguf must refuse are listed with no values)
  gguf_llama.gguf    a tiny llama-shaped model (D 64, F 96, 2 layers, 4 heads,
                     2 KV heads, vocabulary 128 from tokenizer.ggml.tokens,
                     untied output.weight), seeded random weights in F32, F16
                     and Q8_0; a byte-level tokenizer and a ChatML chat template
  gguf_mistral.gguf  the same shape as a "mistral" model (D 32, 1 layer, tied
                     embeddings) with no optional keys: the defaults apply
  gguf_spm.gguf      a tiny llama model (D 32, 1 layer, tied) whose tokenizer
                     is SentencePiece's ("llama": pieces with U+2581 for a
                     space, scores, byte tokens at ids 3..258), converted from
                     the project's tests/data/tok_test.bin (read from OUTDIR):
                     the same text must give the same ids through either file
  gguf_*.expect      beside each model, "name value" lines: the
                     GgufLlamaConfig it must give
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter, GGMLQuantizationType as Q, quants

SEED = 20240617
V = GGUFValueType


def write_gguf(path, arch, metadata, tensors, alignment=None):
    """metadata: (key, value, type, element type or None); tensors: (name,
    numpy array as gguf-py stores it, raw ggml type or None)."""
    w = GGUFWriter(str(path), arch)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub_type in metadata:
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, array, raw_type in tensors:
        w.add_tensor(name, array, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def half_bits(bits):
    return np.array(bits, dtype=np.uint16)


def float_tensor(rng):
    """F32 (4, 64): normals with the special values in the first row."""
    x = rng.standard_normal((4, 64)).astype(np.float32)
    specials = np.array([0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                         0xffc12345, 0x00000001, 0x807fffff, 0x7f7fffff, 0x3f800000],
                        dtype=np.uint32).view(np.float32)
    x[0, :len(specials)] = specials
    return x


def f16_tensor(rng):
    """F16 (4, 64): normals and every kind of half (zeros, subnormals,
    smallest and largest normal, infinities, quiet and signalling NaNs)."""
    x = rng.standard_normal((4, 64)).astype(np.float16)
    specials = half_bits([0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                          0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x3c00, 0x3555, 0x0200])
    x[0, :len(specials)] = specials.view(np.float16)
    return x


def bf16_tensor(rng):
    """BF16 (4, 64) as raw bytes: rounded normals and special values."""
    x = quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.BF16).view(np.uint16)
    specials = half_bits([0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x3f80])
    x[0, :len(specials)] = specials
    return x.view(np.uint8)


def random_k_blocks(rng, qtype, n_rows, n_blocks_per_row):
    """Random bytes for every field, then fp16 scales set to sane values:
    d in +-[0.001, 0.05) (Q6_K: d > 0, its int8 scales carry the sign) and
    dmin in [0, 0.05)."""
    type_size = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}[qtype]
    blocks = rng.integers(0, 256, size=(n_rows * n_blocks_per_row, type_size), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, size=len(blocks))
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    else:
        d *= rng.choice([-1, 1], size=len(blocks))
        dmin = rng.uniform(0, 0.05, size=len(blocks))
        blocks[:, 0:2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
        blocks[:, 2:4] = dmin.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return blocks.reshape(n_rows, n_blocks_per_row * type_size)


def types_tensors(rng):
    """(name, stored array, raw type, expected float32 values or None)."""
    out = []
    x = float_tensor(rng)
    out.append(("f32", x, None, x))
    x = f16_tensor(rng)
    out.append(("f16", x, None, x.astype(np.float32)))
    x = bf16_tensor(rng)
    out.append(("bf16", x, Q.BF16, quants.dequantize(x, Q.BF16)))
    x = rng.standard_normal((2, 2, 3, 2)).astype(np.float32)
    out.append(("f32_4d", x, None, x))
    for name, qtype, shape in [("q8_0", Q.Q8_0, (3, 64)), ("q8_0_3d", Q.Q8_0, (3, 2, 32)),
                               ("q4_0", Q.Q4_0, (4, 64)), ("q4_1", Q.Q4_1, (4, 64))]:
        q = quants.quantize(rng.standard_normal(shape).astype(np.float32), qtype)
        out.append((name, q, qtype, quants.dequantize(q, qtype)))
    for name, qtype in [("q4_k", Q.Q4_K), ("q5_k", Q.Q5_K), ("q6_k", Q.Q6_K)]:
        q = random_k_blocks(rng, qtype, 3, 1)
        out.append((name, q, qtype, quants.dequantize(q, qtype)))
    q = random_k_blocks(rng, Q.Q6_K, 1, 2)
    out.append(("q6_k_wide", q, Q.Q6_K, quants.dequantize(q, Q.Q6_K)))
    q = quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), Q.Q5_0)
    out.append(("q5_0_unsupported", q, Q.Q5_0, None))
    return out


TYPES_METADATA = [
    ("test.u8", 200, V.UINT8, None),
    ("test.i8", -100, V.INT8, None),
    ("test.u16", 60000, V.UINT16, None),
    ("test.i16", -30000, V.INT16, None),
    ("test.u32", 4000000000, V.UINT32, None),
    ("test.i32", -2000000000, V.INT32, None),
    ("test.u64", 2**64 - 1, V.UINT64, None),
    ("test.i64", -2**63, V.INT64, None),
    ("test.f32", 0.1, V.FLOAT32, None),
    ("test.f64", -2.5e-300, V.FLOAT64, None),
    ("test.true", True, V.BOOL, None),
    ("test.false", False, V.BOOL, None),
    ("test.string", "h\u00e9llo w\u00f6rld", V.STRING, None),
    ("test.empty", "", V.STRING, None),
    ("test.nul", b"a\x00b", V.STRING, None),
    ("test.array_i16", [-1, 2, -3], V.ARRAY, V.INT16),
    ("test.array_u64", [0, 2**64 - 1], V.ARRAY, V.UINT64),
    ("test.array_f32", [1.5, -0.25], V.ARRAY, V.FLOAT32),
    ("test.array_f64", [1e300, -5e-324], V.ARRAY, V.FLOAT64),
    ("test.array_string", ["alpha", "", "\u03b3\u03ac\u03bc\u03bc\u03b1", "with space"], V.ARRAY, V.STRING),
    ("test.array_nested", [[1, 2], [3], [4, 5, 6]], V.ARRAY, None),
    ("test.array_bool", [True, False, True], V.ARRAY, V.BOOL),
    ("test.dup_a", 1, V.UINT32, None),   # test_gguf renames dup_b to dup_a: a key repeated
    ("test.dup_b", 2, V.UINT32, None),
]


def write_types(outdir, rng):
    tensors = types_tensors(rng)
    write_gguf(outdir / "gguf_types.gguf", "test", TYPES_METADATA,
               [(name, array, raw) for name, array, raw, _ in tensors], alignment=64)
    lines = ["# gguf-py's dequantization of gguf_types.gguf (tests/make_gguf_fixtures.py):",
             "# tensor NAME TYPE NDIMS DIMS..., then float32 bits in hex (none: must be refused)"]
    for name, array, raw, expected in tensors:
        qtype = raw if raw is not None else (Q.F16 if array.dtype == np.float16 else Q.F32)
        dims = (expected.shape if expected is not None else
                quants.quant_shape_from_byte_shape(array.shape, qtype))[::-1]
        lines.append(f"tensor {name} {qtype.name} {len(dims)} " + " ".join(map(str, dims)))
        if expected is None:
            continue
        bits = np.ascontiguousarray(expected, dtype=np.float32).view(np.uint32).ravel()
        lines += [" ".join(f"{b:08x}" for b in bits[i:i + 8]) for i in range(0, len(bits), 8)]
    (outdir / "gguf_types.expect").write_text("\n".join(lines) + "\n")


# The tiny models. "llama" writes every optional key (head_count_kv,
# key_length, rope.dimension_count, freq_base, epsilon) but no vocab_size (the
# vocabulary is the token list) and an untied output.weight; "mistral" writes
# none of the optional keys (the reader's defaults apply), a vocab_size key,
# and no output.weight (tied embeddings).
MODELS = {
    "gguf_llama": dict(arch="llama", dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2,
                       vocab_size=128, context_length=256, rope_theta=500000.0, rms_eps=1e-6,
                       tied=False),
    "gguf_mistral": dict(arch="mistral", dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=2,
                         vocab_size=32, context_length=64, rope_theta=10000.0, rms_eps=1e-5,
                         tied=True),
    "gguf_spm": dict(arch="llama", dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=2,
                     vocab_size=654, context_length=64, rope_theta=10000.0, rms_eps=1e-5,
                     tied=True),
}


CHATML_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                   "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
                   "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def read_tokenizer_bin(path):
    """llama2.c's tokenizer.bin: int32 max length, then per token a float32
    score, an int32 length and the bytes."""
    data = Path(path).read_bytes()
    at, pieces, scores = 4, [], []
    while at < len(data):
        score, length = struct.unpack_from("<fi", data, at)
        pieces.append(data[at + 8:at + 8 + length].decode("utf-8"))
        scores.append(score)
        at += 8 + length
    return pieces, scores


def spm_tokenizer_metadata(outdir):
    """tok_test.bin as a GGUF "llama" tokenizer: spaces written as U+2581,
    control tokens 0..2, byte tokens 3..258 (type 6)."""
    pieces, scores = read_tokenizer_bin(outdir / "tok_test.bin")
    types = [3, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    return [
        ("tokenizer.ggml.model", "llama", V.STRING, None),
        ("tokenizer.ggml.tokens", [p.replace(" ", "\u2581") for p in pieces], V.ARRAY, V.STRING),
        ("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
        ("tokenizer.ggml.bos_token_id", 1, V.UINT32, None),
        ("tokenizer.ggml.eos_token_id", 2, V.UINT32, None),
    ]


def model_tensors(c, rng):
    D, F, V = c["dim"], c["hidden_dim"], c["vocab_size"]
    KVD = c["n_kv_heads"] * D // c["n_heads"]

    def weight(rows, cols, qtype):          # stored (out, in) = GGUF [in, out]
        w = (0.05 * rng.standard_normal((rows, cols))).astype(np.float32)
        if qtype == Q.F16:
            return w.astype(np.float16), None
        return quants.quantize(w, qtype), qtype

    def norm():
        return (1 + 0.1 * rng.standard_normal(D)).astype(np.float32), None

    out = [("token_embd.weight", *weight(V, D, Q.Q8_0)), ("output_norm.weight", *norm())]
    if not c["tied"]:
        out.append(("output.weight", *weight(V, D, Q.F16)))
    for layer in range(c["n_layers"]):
        parts = [("attn_norm", norm()), ("attn_q", weight(D, D, Q.F16)),
                 ("attn_k", weight(KVD, D, Q.Q8_0)), ("attn_v", weight(KVD, D, Q.F16)),
                 ("attn_output", weight(D, D, Q.Q8_0)), ("ffn_norm", norm()),
                 ("ffn_gate", weight(F, D, Q.Q8_0)), ("ffn_up", weight(F, D, Q.F16)),
                 ("ffn_down", weight(D, F, Q.Q8_0))]
        out += [(f"blk.{layer}.{name}.weight", *w) for name, w in parts]
    return out


def byte_level_vocab(V):
    """A valid byte-level BPE vocabulary of V tokens, as GPT-2 writes its
    pieces (G-breve for a space, C-dot for a newline): three control tokens,
    single characters, and about a quarter of merged pieces of English
    words, each merge "left right" of two pieces already there."""
    chars = list("\u0120etaoinshrdlucmfwypvbgkqjxz\u010a") + [chr(c) for c in range(33, 127) if not chr(c).islower()]
    words = ["\u0120the", "\u0120and", "\u0120that", "\u0120this", "ing", "tion", "\u0120of", "\u0120to",
             "\u0120in", "\u0120it", "\u0120is", "\u0120was", "ed", "er", "es", "on", "at", "en", "or", "an"]
    n_chars = V - 3 - (V - 3) // 4
    pieces, merges = ["<unk>", "<s>", "</s>"] + chars[:n_chars], []
    for word in words:                      # prefixes left to right: \u0120 t -> \u0120t, \u0120t h -> \u0120th
        for k in range(2, len(word) + 1):
            left, right = word[:k - 1], word[k - 1]
            if len(pieces) < V and left in pieces and right in pieces and word[:k] not in pieces:
                pieces.append(word[:k])
                merges.append(f"{left} {right}")
    pieces += chars[n_chars:n_chars + V - len(pieces)]
    assert len(pieces) == V and merges
    return pieces, merges


def model_metadata(c):
    a, d = c["arch"], c["dim"] // c["n_heads"]
    counts = [("block_count", c["n_layers"]), ("context_length", c["context_length"]),
              ("embedding_length", c["dim"]), ("feed_forward_length", c["hidden_dim"]),
              ("attention.head_count", c["n_heads"])]
    if c["tied"]:
        counts += [("vocab_size", c["vocab_size"])]
    else:
        counts += [("attention.head_count_kv", c["n_kv_heads"]), ("attention.key_length", d),
                   ("rope.dimension_count", d)]
    metadata = [(f"{a}.{key}", value, V.UINT32, None) for key, value in counts]
    if not c["tied"]:
        metadata += [(f"{a}.rope.freq_base", c["rope_theta"], V.FLOAT32, None),
                     (f"{a}.attention.layer_norm_rms_epsilon", c["rms_eps"], V.FLOAT32, None)]
    return metadata


def bpe_tokenizer_metadata(vocab_size):
    tokens, merges = byte_level_vocab(vocab_size)
    return [
        ("tokenizer.ggml.model", "gpt2", V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (vocab_size - 3), V.ARRAY, V.INT32),
        ("tokenizer.ggml.merges", merges, V.ARRAY, V.STRING),
    ]


def write_model(outdir, name, c, rng):
    tokenizer = spm_tokenizer_metadata(outdir) if name == "gguf_spm" else bpe_tokenizer_metadata(c["vocab_size"])
    if name == "gguf_llama":  # a ChatML template with a default system message, as SmolLM2's
        tokenizer.append(("tokenizer.chat_template", CHATML_TEMPLATE, V.STRING, None))
    metadata = model_metadata(c) + tokenizer
    write_gguf(outdir / f"{name}.gguf", c["arch"], metadata, model_tensors(c, rng))
    expect = {k: v for k, v in c.items() if k not in ("arch", "tied")}
    expect.update(head_size=c["dim"] // c["n_heads"], tied_embeddings=int(c["tied"]))
    text = "".join(f"{k} {float(np.float32(v)):.9g}\n" if isinstance(v, float) else f"{k} {v}\n"
                   for k, v in expect.items())     # 9 digits: the float32 exactly
    (outdir / f"{name}.expect").write_text(text)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/make_gguf_fixtures.py OUTDIR")
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    write_types(outdir, rng)
    for name, config in MODELS.items():
        write_model(outdir, name, config, rng)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Independent float64 numpy reference for SmolLM2-135M-Instruct read from its GGUF file.

Usage:  python3 tests/smollm2_reference.py MODEL.gguf OUTDIR
        (needs numpy and gguf; the fixtures in tests/data/ were made with
        numpy 2.4 and gguf 0.19 from SmolLM2-135M-Instruct.Q4_1.gguf:
        python3 tests/smollm2_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf tests/data)

Every tensor is dequantized by the gguf package's own code (gguf.quants.dequantize),
the hyperparameters come from the file's metadata, and the Llama forward pass is
written here from the model definition (whole-sequence causal attention, no kv
cache) and runs in float64 on the dequantized values.

Writes, deterministically:

  OUTDIR/smollm2_tensors.txt   one line per tensor, in file order:
      NAME TYPE NDIM NE0 [NE1] SUM SUMSQ WSUM X0 X1 X2 X3
    TYPE is the ggml type name (F32, Q8_0, Q4_1); NE0 .. are the GGUF dimensions
    (NE0 varies fastest: a matrix is NE1 rows of NE0 values, i.e. (out, in) row-major).
    Over the dequantized values x[i], i the flat index in file order, in float64:
    SUM = sum x[i], SUMSQ = sum x[i]^2, WSUM = sum x[i] * (i mod 1009) (changes when
    values are permuted, which SUM and SUMSQ do not see); X0..X3 = x[0..3].
    Sums are %.17g, values %.9g (exact for the float32 dequantized values).

  for each prompt NAME in PROMPTS:
  OUTDIR/smollm2_NAME.expect   text, one record per line:
      prompt K id1 .. idK
      greedy M id1 .. idM                 float64 argmax continuation of the prompt
      margin M m1 .. mM                   top1 - top2 logit at each greedy step
      subset S id1 .. idS                 vocabulary ids, ascending
      logits POS S v1 .. vS               one line per POS = 0 .. K+M-2: the logits
                                          after feeding token POS of prompt + greedy,
                                          at the subset ids, %.9g
  OUTDIR/smollm2_NAME.last.f32 raw little-endian float32, exactly V values (4 V bytes,
                                          no header): all logits at position K-1,
                                          the ones that choose greedy id1.

The subset is the SUBSET_TOP highest logits at position K-1 plus FIXED_IDS.
Position 0 is the first prompt token; no BOS is added (the file says
add_bos_token false, and the prompts are exactly the ids below).

Reading them from a C test:
  tensors: fscanf("%s %s %d", name, type, &ndim), then ndim dimensions, then
    "%lf %lf %lf" and four "%f". Dequantize the tensor, sum in double in file order.
    Each fp32 value may differ from gguf's by one rounding (d*q+m with or without
    FMA), i.e. |err| <= 2^-23 |x| per value, so with n values and
    B = sqrt(n * SUMSQ) >= sum |x|:  |SUM - got| <= 1e-6 B,  |WSUM - got| <= 1e-6 * 1009 B,
    |SUMSQ - got| <= 1e-6 SUMSQ, X0..X3 within 1e-6 relative.
  expect: the same "KIND COUNT values..." lines as tests/reference.py's .expect
    files (kind first, then the count, then that many numbers), in the order above.
  last.f32: check the file is exactly 4 V bytes, then fread V floats.
  Tolerance: the same forward run in float32 numpy lands within 1.2e-4 of these
    float64 logits (max |logit| about 38), so an fp32 C forward should pass
    |got - ref| <= 1e-3 + 1e-4 |ref|. A greedy token may differ from the
    reference only where its margin is below about twice that tolerance.

Cross-check done when the fixtures were made: llama.cpp (llama-cpp-python 0.3.36,
f32 KV cache) on an all-F32 copy of the file (these dequantized weights) agrees
within 4e-5 at every fixture logit and gives the same greedy ids. On the Q4_1
file itself llama.cpp quantizes the activations too and drifts by up to 2 in
the logits (its chat answer then starts with "L'" instead of "The"), so that is
not the number to compare an fp32 dequantize-at-load forward with.
"""
import os
import sys
import time

import numpy as np
import gguf
from gguf.quants import dequantize

# Token ids of the prompts, as encoded by the model's own byte-level BPE
# (pre-tokenizer "smollm": single digits split off, then GPT-2's byte-level regex;
# control tokens written in the text are one id each).
PROMPTS = [
    # "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    # "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ("chat", [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
              411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2,
              198, 1, 520, 9531, 198]),
    # "The Apache License, Version 2.0, January 2004. Licensed under the Apache License; you may not "
    # "use this file except in compliance with the License. 1234"
    ("text", [504, 16797, 6966, 28, 13867, 216, 34, 30, 32, 28, 4450, 216, 34, 32, 32, 36, 30, 22658,
              656, 260, 16797, 6966, 43, 346, 654, 441, 722, 451, 2301, 2560, 281, 9626, 351, 260,
              6966, 30, 216, 33, 34, 35, 36]),
]
N_GREEDY = 16
SUBSET_TOP = 64
# <|endoftext|>, <|im_start|>, <|im_end|>, "\n", ",", ".", " " and the last id
FIXED_IDS = [0, 1, 2, 198, 28, 30, 216, 49151]
WSUM_PERIOD = 1009


# ---------------------------------------------------------------- reading the GGUF

def metadata(reader, key):
    field = reader.fields.get(key)
    if field is None:
        raise SystemExit("error: the GGUF file has no metadata key %s" % key)
    return field.contents()


def read_model(path):
    """Returns (hyperparameters, {tensor name: float64 array shaped (ne1, ne0) or (ne0,)}, tensor list)."""
    reader = gguf.GGUFReader(path)
    arch = metadata(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit("error: architecture %r, this reference knows only llama" % arch)
    hp = dict(n_layers=metadata(reader, "llama.block_count"),
              dim=metadata(reader, "llama.embedding_length"),
              hidden_dim=metadata(reader, "llama.feed_forward_length"),
              n_heads=metadata(reader, "llama.attention.head_count"),
              n_kv_heads=metadata(reader, "llama.attention.head_count_kv"),
              rope_theta=float(metadata(reader, "llama.rope.freq_base")),
              rms_eps=float(metadata(reader, "llama.attention.layer_norm_rms_epsilon")))
    if hp["dim"] % hp["n_heads"] or hp["n_heads"] % hp["n_kv_heads"] or (hp["dim"] // hp["n_heads"]) % 2:
        raise SystemExit("error: head counts %d/%d do not divide dim %d into even heads"
                         % (hp["n_heads"], hp["n_kv_heads"], hp["dim"]))
    W = {}
    for t in reader.tensors:
        W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64)
    hp["vocab_size"] = W["token_embd.weight"].shape[0]
    return hp, W, reader.tensors


def write_tensor_stats(path, tensors, W):
    with open(path, "w") as f:
        for t in tensors:
            x = W[t.name].reshape(-1)                       # flat, file order
            ne = [int(n) for n in t.shape]                  # GGUF order: ne0 fastest
            if x.size != int(np.prod(ne)):
                raise SystemExit("error: tensor %s dequantized to %d values, shape says %d"
                                 % (t.name, x.size, int(np.prod(ne))))
            weight = (np.arange(x.size) % WSUM_PERIOD).astype(np.float64)
            first = x[:4].astype(np.float32)
            f.write("%s %s %d %s %.17g %.17g %.17g %s\n" % (
                t.name, t.tensor_type.name, len(ne), " ".join(map(str, ne)),
                np.sum(x), np.sum(x * x), np.sum(x * weight), " ".join("%.9g" % v for v in first)))


# ---------------------------------------------------------------- forward (float64)

def rmsnorm(x, w, eps):
    # x / sqrt(mean(x^2) + eps) * w, over the last axis
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, head_size, theta):
    """x: (T, D), D a multiple of head_size. llama2.c convention: rotate the ADJACENT
    pair (v[i], v[i+1]) of each head by angle pos * theta^(-i / head_size), i even."""
    T, D = x.shape
    i = np.arange(0, D, 2)                                      # even index in the row
    freq = theta ** (-(i % head_size) / head_size)              # (D/2,)
    ang = np.arange(T, dtype=np.float64)[:, None] * freq[None]  # (T, D/2)
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = x0 * c - x1 * s
    out[:, 1::2] = x0 * s + x1 * c
    return out


def forward(hp, W, tokens):
    """Logits (T, V) in float64 for every position of `tokens`."""
    dim, nh, nkv, eps = hp["dim"], hp["n_heads"], hp["n_kv_heads"], hp["rms_eps"]
    hs = dim // nh
    kv_mul = nh // nkv                                          # query heads per KV head
    T = len(tokens)
    x = W["token_embd.weight"][np.asarray(tokens)].copy()       # (T, dim)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)            # True above the diagonal: future
    for l in range(hp["n_layers"]):
        blk = "blk.%d." % l
        xb = rmsnorm(x, W[blk + "attn_norm.weight"], eps)
        theta = hp["rope_theta"]
        q = rope(xb @ W[blk + "attn_q.weight"].T, hs, theta).reshape(T, nh, hs)   # (T, nh, hs)
        k = rope(xb @ W[blk + "attn_k.weight"].T, hs, theta).reshape(T, nkv, hs)  # (T, nkv, hs)
        v = (xb @ W[blk + "attn_v.weight"].T).reshape(T, nkv, hs)                 # (T, nkv, hs)
        att_out = np.empty((T, nh, hs))
        for h in range(nh):
            kh, vh = k[:, h // kv_mul], v[:, h // kv_mul]
            sc = (q[:, h] @ kh.T) / np.sqrt(hs)                 # (T, T) scores q.k / sqrt(d)
            sc[mask] = -np.inf
            sc -= sc.max(axis=1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=1, keepdims=True)                   # softmax over the past
            att_out[:, h] = p @ vh
        x = x + att_out.reshape(T, dim) @ W[blk + "attn_output.weight"].T
        xb = rmsnorm(x, W[blk + "ffn_norm.weight"], eps)
        a = xb @ W[blk + "ffn_gate.weight"].T                   # W1 x    (T, hidden)
        b = xb @ W[blk + "ffn_up.weight"].T                     # W3 x    (T, hidden)
        silu = a / (1.0 + np.exp(-a))
        x = x + (silu * b) @ W[blk + "ffn_down.weight"].T       # W2 (SiLU(W1 x) * W3 x)
    x = rmsnorm(x, W["output_norm.weight"], eps)
    return x @ W["token_embd.weight"].T                         # tied classifier


def greedy(hp, W, prompt, n_new):
    """Returns (generated ids, margins, logits (K+M, V) of prompt + generated)."""
    seq = list(prompt)
    gen, margins = [], []
    for _ in range(n_new):
        lg = forward(hp, W, seq)[-1]
        top2 = np.sort(lg)[-2:]
        nxt = int(np.argmax(lg))
        gen.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        seq.append(nxt)
    return gen, margins, forward(hp, W, seq)


# ---------------------------------------------------------------- fixtures

def write_expect(path, prompt, gen, margins, subset, logits):
    K, M = len(prompt), len(gen)
    with open(path, "w") as f:
        f.write("prompt %d %s\n" % (K, " ".join(map(str, prompt))))
        f.write("greedy %d %s\n" % (M, " ".join(map(str, gen))))
        f.write("margin %d %s\n" % (M, " ".join("%.9g" % m for m in margins)))
        f.write("subset %d %s\n" % (len(subset), " ".join(map(str, subset))))
        for pos in range(K + M - 1):
            f.write("logits %d %d %s\n" % (pos, len(subset), " ".join("%.9g" % logits[pos, j] for j in subset)))


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: python3 smollm2_reference.py MODEL.gguf OUTDIR\n")
        return 2
    model_path, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    t0 = time.time()
    hp, W, tensors = read_model(model_path)
    write_tensor_stats(os.path.join(outdir, "smollm2_tensors.txt"), tensors, W)
    sys.stderr.write("read and dequantized %d tensors in %.1f s: %s\n" % (len(tensors), time.time() - t0, hp))
    V = hp["vocab_size"]
    for name, prompt in PROMPTS:
        t0 = time.time()
        if not all(0 <= t < V for t in prompt + FIXED_IDS):
            raise SystemExit("error: a prompt or fixed id is outside the vocabulary of %d" % V)
        gen, margins, logits = greedy(hp, W, prompt, N_GREEDY)
        K = len(prompt)
        last = logits[K - 1]                                    # (V,) chooses gen[0]
        assert int(np.argmax(last)) == gen[0], "whole-sequence logits disagree with the greedy step"
        top = np.argsort(-last, kind="stable")[:SUBSET_TOP]
        subset = sorted(set(int(t) for t in top) | set(FIXED_IDS))
        write_expect(os.path.join(outdir, "smollm2_%s.expect" % name), prompt, gen, margins, subset, logits)
        last.astype("<f4").tofile(os.path.join(outdir, "smollm2_%s.last.f32" % name))
        print("%s: prompt %d ids, greedy %s, min margin %.4g, max |logit| %.4g at K-1, top5 %s (%.1f s)"
              % (name, K, gen, min(margins), np.abs(last).max(),
                 ", ".join("%d:%.4f" % (t, last[t]) for t in top[:5]), time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())

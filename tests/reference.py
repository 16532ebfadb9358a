#!/usr/bin/python3
"""Independent float64 numpy reference for a llama2.c-style transformer.

Usage:  python3 reference.py OUTDIR

Writes, deterministically, for each model NAME in MODELS:
  OUTDIR/NAME.bin     llama2.c "v0" checkpoint (7 x int32 header, fp32 tensors)
  OUTDIR/NAME.expect  text:
      prompt K id1 .. idK
      greedy M id1 .. idM
      logits POS V v1 .. vV      (one line per POS = 0 .. K+M-2, %.9g)

Checkpoint layout (all little endian, matrices row-major, stored (out, in)):
  int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
        (vocab_size < 0 means an unshared classifier wcls is appended)
  token_embedding (vocab, dim)
  rms_att (L, dim)
  wq (L, dim, dim)  wk (L, kv_dim, dim)  wv (L, kv_dim, dim)  wo (L, dim, dim)
  rms_ffn (L, dim)
  w1 (L, hidden, dim)  w2 (L, dim, hidden)  w3 (L, hidden, dim)
  rms_final (dim)
  freq_cis_real (seq_len, head_size/2)  freq_cis_imag (seq_len, head_size/2)
  [wcls (vocab, dim)]      only when the header's vocab_size is negative

The forward pass is written from the model definition (whole-sequence causal
attention, no kv cache) and runs in float64 on the fp32 values stored in the
file. Weights are drawn from numpy's legacy RandomState (a stream that numpy
guarantees never to change). For each model the seed is found by a
deterministic search starting at SEED_START; the seed found is recorded in
MODELS and the script asserts that the search still lands on it.
"""
import os
import sys

try:
    import numpy as np
except ImportError:  # pyenv's python3 may lack numpy; Debian's python3 has it
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

PROMPT_LEN = 7          # K, including the leading BOS (1)
N_GREEDY = 24           # M
MIN_MARGIN = 3e-2       # required top1 - top2 logit gap at every greedy step (brief asks > 1e-2; 3e-2 leaves slack for fp32 C code)
MIN_DISTINCT = 12       # greedy output must contain at least this many distinct ids
MAX_IMMEDIATE_REPEATS = 2  # at most this many i with g[i] == g[i-1] (incl. prompt end)
SEED_START = 1000

MODELS = [
    # name, config, recorded seed (found by search from SEED_START)
    ("ref_gqa", dict(dim=48, hidden_dim=128, n_layers=2, n_heads=6, n_kv_heads=2,
                     vocab_size=300, seq_len=64, shared=True), 1001),
    ("ref_mha_unshared", dict(dim=32, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=4,
                              vocab_size=280, seq_len=48, shared=False), 1004),
]

# weight scales
EMB_STD = 1.0           # token embedding (and wcls) std
LIN_GAIN = 2.0          # linear weights std = LIN_GAIN / sqrt(fan_in); gain 1 makes the shared-classifier model repeat its input token
RMS_STD = 0.1           # RMSNorm weights = 1 + RMS_STD * N(0,1)


def make_weights(cfg, seed):
    rs = np.random.RandomState(seed)
    dim, hid, L = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"]
    nh, nkv, V, S = cfg["n_heads"], cfg["n_kv_heads"], cfg["vocab_size"], cfg["seq_len"]
    hs = dim // nh
    kv_dim = nkv * hs

    def lin(*shape):  # shape (..., out, in)
        return (rs.standard_normal(shape) * (LIN_GAIN / np.sqrt(shape[-1]))).astype(np.float32)

    def rms(*shape):
        return (1.0 + RMS_STD * rs.standard_normal(shape)).astype(np.float32)

    W = {}
    W["emb"] = (rs.standard_normal((V, dim)) * EMB_STD).astype(np.float32)
    W["rms_att"] = rms(L, dim)
    W["wq"] = lin(L, nh * hs, dim)
    W["wk"] = lin(L, kv_dim, dim)
    W["wv"] = lin(L, kv_dim, dim)
    W["wo"] = lin(L, dim, nh * hs)
    W["rms_ffn"] = rms(L, dim)
    W["w1"] = lin(L, hid, dim)
    W["w2"] = lin(L, dim, hid)
    W["w3"] = lin(L, hid, dim)
    W["rms_final"] = rms(dim)
    # RoPE tables (llama2.c v0 layout); freq_j = 10000^(-2j/head_size)
    j = np.arange(hs // 2, dtype=np.float64)
    freqs = 10000.0 ** (-(2.0 * j) / hs)
    ang = np.outer(np.arange(S, dtype=np.float64), freqs)
    W["freq_cis_real"] = np.cos(ang).astype(np.float32)
    W["freq_cis_imag"] = np.sin(ang).astype(np.float32)
    if not cfg["shared"]:
        W["wcls"] = (rs.standard_normal((V, dim)) * EMB_STD).astype(np.float32)
    # prompt: BOS then ids uniform in 3..V-1
    prompt = [1] + [int(t) for t in rs.randint(3, V, size=PROMPT_LEN - 1)]
    return W, prompt


ORDER = ["emb", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3",
         "rms_final", "freq_cis_real", "freq_cis_imag"]


def write_checkpoint(path, cfg, W):
    V = cfg["vocab_size"] if cfg["shared"] else -cfg["vocab_size"]
    hdr = np.array([cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"],
                    cfg["n_kv_heads"], V, cfg["seq_len"]], dtype="<i4")
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        for k in ORDER + ([] if cfg["shared"] else ["wcls"]):
            f.write(np.ascontiguousarray(W[k], dtype="<f4").tobytes())


def read_checkpoint(path):
    """Independent reader, used to check that what was written reads back."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:28], dtype="<i4")
    dim, hid, L, nh, nkv, V, S = [int(v) for v in h]
    shared = V > 0
    V = abs(V)
    hs = dim // nh
    kv_dim = nkv * hs
    data = np.frombuffer(raw[28:], dtype="<f4")
    shapes = [("emb", (V, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
              ("wk", (L, kv_dim, dim)), ("wv", (L, kv_dim, dim)), ("wo", (L, dim, dim)),
              ("rms_ffn", (L, dim)), ("w1", (L, hid, dim)), ("w2", (L, dim, hid)),
              ("w3", (L, hid, dim)), ("rms_final", (dim,)),
              ("freq_cis_real", (S, hs // 2)), ("freq_cis_imag", (S, hs // 2))]
    if not shared:
        shapes.append(("wcls", (V, dim)))
    W, off = {}, 0
    for name, shp in shapes:
        n = int(np.prod(shp))
        W[name] = data[off:off + n].reshape(shp)
        off += n
    assert off == data.size, "trailing bytes in checkpoint"
    cfg = dict(dim=dim, hidden_dim=hid, n_layers=L, n_heads=nh, n_kv_heads=nkv,
               vocab_size=V, seq_len=S, shared=shared)
    return cfg, W


# ---------------------------------------------------------------- forward (float64)

def rmsnorm(x, w, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, head_size):
    """x: (T, D) with D a multiple of head_size; rotate adjacent pairs (2i, 2i+1)."""
    T, D = x.shape
    i = np.arange(0, D, 2)
    freq = 10000.0 ** (-(i % head_size) / head_size)            # (D/2,)
    ang = np.arange(T, dtype=np.float64)[:, None] * freq[None]  # (T, D/2)
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = x0 * c - x1 * s
    out[:, 1::2] = x0 * s + x1 * c
    return out


def forward(cfg, W, tokens):
    """Logits (T, V) in float64 for every position of `tokens`."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    dim, nh, nkv = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
    hs = dim // nh
    kv_mul = nh // nkv
    T = len(tokens)
    x = W["emb"][np.asarray(tokens)].copy()                      # (T, dim)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    for l in range(cfg["n_layers"]):
        xb = rmsnorm(x, W["rms_att"][l])
        q = rope(xb @ W["wq"][l].T, hs).reshape(T, nh, hs)
        k = rope(xb @ W["wk"][l].T, hs).reshape(T, nkv, hs)
        v = (xb @ W["wv"][l].T).reshape(T, nkv, hs)
        att_out = np.empty((T, nh, hs))
        for h in range(nh):
            kh, vh = k[:, h // kv_mul], v[:, h // kv_mul]
            sc = (q[:, h] @ kh.T) / np.sqrt(hs)
            sc[mask] = -np.inf
            sc -= sc.max(axis=1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=1, keepdims=True)
            att_out[:, h] = p @ vh
        x = x + att_out.reshape(T, dim) @ W["wo"][l].T
        xb = rmsnorm(x, W["rms_ffn"][l])
        a = xb @ W["w1"][l].T
        b = xb @ W["w3"][l].T
        x = x + ((a / (1.0 + np.exp(-a))) * b) @ W["w2"][l].T
    x = rmsnorm(x, W["rms_final"])
    wcls = W["emb"] if cfg["shared"] else W["wcls"]
    return x @ wcls.T


def greedy(cfg, W, prompt, n_new):
    """Returns (generated ids, margins, logits of the full sequence)."""
    seq = list(prompt)
    gen, margins = [], []
    while len(gen) < n_new and len(seq) < cfg["seq_len"]:
        lg = forward(cfg, W, seq)[-1]
        top2 = np.sort(lg)[-2:]
        nxt = int(np.argmax(lg))
        gen.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        seq.append(nxt)
    return gen, margins, forward(cfg, W, seq)


def acceptable(prompt, gen, margins):
    if min(margins) <= MIN_MARGIN:
        return False
    if 1 in gen:  # run.c stops when it samples BOS
        return False
    if len(set(gen)) < MIN_DISTINCT:
        return False
    full = prompt + gen
    reps = sum(1 for i in range(len(prompt), len(full)) if full[i] == full[i - 1])
    return reps <= MAX_IMMEDIATE_REPEATS


def find_seed(cfg):
    seed = SEED_START
    while True:
        W, prompt = make_weights(cfg, seed)
        gen, margins, lg = greedy(cfg, W, prompt, N_GREEDY)
        if acceptable(prompt, gen, margins):
            return seed, W, prompt, gen, margins, lg
        seed += 1


def write_expect(path, prompt, gen, logits):
    K, M = len(prompt), len(gen)
    V = logits.shape[1]
    with open(path, "w") as f:
        f.write("prompt %d %s\n" % (K, " ".join(map(str, prompt))))
        f.write("greedy %d %s\n" % (M, " ".join(map(str, gen))))
        for pos in range(K + M - 1):
            f.write("logits %d %d %s\n" % (pos, V, " ".join("%.9g" % v for v in logits[pos])))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python3 reference.py OUTDIR\n")
        return 2
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for name, cfg, recorded in MODELS:
        seed, W, prompt, gen, margins, logits = find_seed(cfg)
        if recorded is not None and seed != recorded:
            raise SystemExit("%s: seed search found %d, recorded %d" % (name, seed, recorded))
        binp = os.path.join(outdir, name + ".bin")
        write_checkpoint(binp, cfg, W)
        # read back through the independent reader and recompute
        cfg2, W2 = read_checkpoint(binp)
        lg2 = forward(cfg2, W2, prompt + gen)
        assert np.array_equal(lg2, logits), "checkpoint round trip changed the logits"
        write_expect(os.path.join(outdir, name + ".expect"), prompt, gen, logits)
        print("%s: seed %d, prompt %s, greedy %s, min margin %.4g"
              % (name, seed, prompt, gen, min(margins)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

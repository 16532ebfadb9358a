#!/usr/bin/env python3
"""Write a llama2.c-format tokenizer.bin (stdlib only, deterministic).

usage: python3 make_tokenizer.py OUT.bin [--merges TEXTFILE N]

Ids: 0 "<unk>", 1 "\\n<s>\\n", 2 "\\n</s>\\n", 3..258 byte tokens "<0x00>".."<0xFF>"
(all score 0). With --merges: the 95 printable ASCII characters as single-char tokens
(score -1e6; llama2.c only looks at the scores of merge results), then up to N tokens
learned BPE-style from TEXTFILE, most frequent adjacent pair first, score -rank.
File: int32 max_token_length, then per token float32 score, int32 length, bytes.
"""
import argparse
import collections
import re
import struct
import sys


def base_tokens():
    toks = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
    toks += [(b"<0x%02X>" % i, 0.0) for i in range(256)]
    return toks


def words_of(text):
    """Split like sentencepiece: each word keeps its leading space (the encoder adds a
    dummy space in front of the text). Only printable ASCII takes part in merges."""
    counts = collections.Counter()
    for line in text.splitlines():
        for w in re.findall(r" ?[!-~]+", " " + line):
            counts[w] += 1
    return counts


def learn_merges(text, n):
    """Greedy BPE: merge the most frequent adjacent pair (ties: smallest pair) n times."""
    words = {tuple(w): c for w, c in words_of(text).items()}
    merged, seen = [], set()
    while len(merged) < n:
        pairs = collections.Counter()
        for sym, c in words.items():
            for a, b in zip(sym, sym[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        new_words = {}
        for sym, c in words.items():
            out, i = [], 0
            while i < len(sym):
                if i + 1 < len(sym) and sym[i] == a and sym[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
        if a + b not in seen:  # the same string can come from two different splits
            seen.add(a + b)
            merged.append(a + b)
    return merged


def main():
    ap = argparse.ArgumentParser(description="write a llama2.c tokenizer.bin")
    ap.add_argument("out")
    ap.add_argument("--merges", nargs=2, metavar=("TEXTFILE", "N"))
    args = ap.parse_args()
    toks = base_tokens()
    if args.merges:
        path, n = args.merges
        try:
            n = int(n)
            if n < 0:
                raise ValueError
        except ValueError:
            sys.exit("error: N must be a non-negative integer, not %r." % args.merges[1])
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            sys.exit("error: cannot read %s: %s." % (path, e.strerror))
        toks += [(bytes([c]), -1e6) for c in range(0x20, 0x7F)]
        toks += [(m.encode("ascii"), float(-r)) for r, m in enumerate(learn_merges(text, n))]
    max_len = max(len(t) for t, _ in toks)
    with open(args.out, "wb") as f:
        f.write(struct.pack("<i", max_len))
        for t, s in toks:
            f.write(struct.pack("<fi", s, len(t)))
            f.write(t)
    print("wrote %s: %d tokens, max_token_length %d" % (args.out, len(toks), max_len))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Expected ids for tests/test_bpe, from Hugging Face `tokenizers`.

    python3 tests/make_bpe_fixtures.py MODEL.gguf OUTDIR

(needs the gguf and tokenizers packages; the committed fixtures were made
with tokenizers 0.23.3 from SmolLM2-135M-Instruct.Q4_1.gguf into tests/data.)

It builds the tokenizer the GGUF file describes the way tokenizers would:
models.BPE(vocab, merges) from tokenizer.ggml.tokens and .merges, the
control and user-defined tokens added as special tokens, the pre-tokenizer
that tokenizer.ggml.pre names ("smollm": Digits(individual_digits=True) then
ByteLevel(add_prefix_space=False, use_regex=True); "gpt2": the ByteLevel one
alone) and a ByteLevel decoder. It writes into OUTDIR:

- bpe_cases.txt: each test text (the list below, then random ones) with its
  ids under both pre-tokenizers, and
  for the license texts of /usr/share/common-licenses (read where they lie
  when the test runs) only the file's sha256, its id count and the FNV-1a
  64-bit hash of its ids (int32 little-endian), not the ids themselves;
- bpe_classes.txt: the class every code point has in tokenizers' split
  pattern (letter, number, space or other) and whether its Digits split
  isolates it, found by pre-tokenizing probe strings; test_bpe checks
  unicode_tables.h against it;
- bpe_tiny.txt: a small made-up vocabulary (every byte, a few merges chosen
  to pin down how tokenizers orders merges, two overlapping control tokens)
  with its own cases, so the merge order is tested without the model.

tests/test_bpe reads the vocabulary from the same GGUF file itself.
"""
import argparse
import hashlib
import os
import random
import struct
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL, USER_DEFINED = 3, 4
LICENSES = ["/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GPL-3"]

CASES = [
    # digits and numbers
    "2024", "3.14159", "1,000,000", "In 2024, 42 people paid $1,234.56 each.", "007", "x1y22z333",
    "٣٤٥ Arabic-Indic", "Ⅻ and ½ and ²³", "phone: +1 (555) 010-9999",
    " \U00011DE0 \U00016FF4 x\U00011DE9y (\U00011DE0!)",  # numeric in Unicode 17 (Digits), not 16 (the pattern)
    # runs of spaces, leading and trailing spaces, spaces before a newline
    "a b", "a  b", "a   b", "a    b", "a     b", "a      b", "a       b", "a        b", "a         b",
    "  ", "   ", "         ", "   leading", "trailing   ", "  both  ", "hello  \nworld", "hello \n world",
    "  \n  ", "x \n\n y", "a  1", "  42", "end 7  ",
    # newlines and tabs
    "\n", "\n\n", "\n\n\n", "\r\n", "line1\r\nline2\r\n", "\t", "\tindented", "a\t\tb", "a\n\n\nb",
    "col1\tcol2\n", " \t \n", "non\u00a0breaking", "ideographic\u3000space", "line\u2028separator",
    # contractions
    "don't", "I'll", "she'd", "they're", "we've", "I'm", "it's", "DON'T", "I'LL", "She'S",
    "rock'n'roll", "'s", "''s", "y'all", "the dog's bone", " 's",
    # non-ASCII letters and punctuation
    "café", "über", "niño", "straße", "Ω", "中文", "中文字符和标点。", "日本語のテキスト", "한국어 문장",
    "emoji 😀👍🏽 family 👨‍👩‍👧", "em — dash", "en – dash", "“curly quotes”", "‘single’", "wait…",
    "«guillemets»", "Привет, мир!", "مرحبا بالعالم", "עברית", "ﬁ ligature", "e\u0301 combining",
    "ÀÉÎÕÜ àéîõü", "µ and ª", "€100 £50 ¥30",
    # control tokens written in the text
    "<|im_start|>user\nHi<|im_end|>\n", "<|im_start|><|im_end|>", "<|endoftext|><|endoftext|>",
    "hel<|im_end|>lo", "<|im_start|>assistant\n", " <|im_start|> ", "<|im_start", "<|im_start|",
    "<reponame>x<repo_name>y", "<|im_end|>\n<|im_start|>system\nBe brief.<|im_end|>",
    "2<|im_end|>3", "  <|im_end|>  ",
    # code and punctuation
    "f(x) = x**2; // comment", "a==b!=c", "if (a && b) { return -1; }",
    "def foo(bar):\n    return bar * 2\n", "#include <stdio.h>", "https://example.com/path?q=1&r=2",
    "user@example.com", "C:\\Users\\name", "\"quoted\"", "snake_case and camelCase", "&amp; &lt;",
    "    four spaces", "...!!!???", "(-_-)", "$$x^2$$",
    # controls, the empty string, one space, a long word
    "\x01\x02", "\x7f", "bell\x07", "", " ", "pneumonoultramicroscopicsilicovolcanoconiosis", "a" * 300,
]

# Random texts made of these parts (seeded): where the split pattern's
# alternatives meet (spaces before letters, digits and punctuation, runs of
# mixed white space, apostrophes, control tokens next to anything).
RANDOM_PARTS = ["a", "Zq", "é", "中", "ß", "1", "42", "٣", "½", " ", "  ", "\n", "\t", "\r\n", "\u3000", "\u00a0",
                "'", "'s", "'ll", "'T", "!", ".", ",", "—", "😀", "\u0301", "<|im_start|>", "<|im_end|>", "x", "_", "$"]
N_RANDOM = 300


def random_texts(n, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_PARTS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


# The made-up vocabulary: every byte's character, these merges (rank =
# index) and four control tokens. "a b" is listed twice: tokenizers keeps the
# later rank, so "b c" merges first in "abc". "ab a" ranks before "a b", so
# "abab" gives "aba" + "b" (a merge made by an earlier merge is taken at
# once), where merging every "a b" first would give "ab" + "ab". Of the
# control tokens, "<s>" and "<s>x" overlap; tokenizers decodes "<Ġ>" as
# "< >", so it stays out of the cases (test_bpe checks it stands for its own
# text).
TINY_MERGES = ["ab a", "Ġ t", "t h", "th e", "h e", "Ġt he", "a b", "c c", "b c", "cc c", "x y", "a b", "e r", "h er"]
TINY_CONTROL = ["<s>", "<s>x", "</s>", "<Ġ>"]
TINY_CASES = ["abab", "ab", "abc", "aab", "ababab", "ccccc", "cccccc", "the there", " the", "her", "xy yx",
              "<s>x", "<s>", "<s>y", "a</s>b", "<s<s>x>", "a the<s></s>", "1 22 333"]


def escape(text):
    """Text for a fixture line: backslash, tab, newline, carriage return and
    other control bytes as escapes; everything else (UTF-8) as it is."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def byte_level_chars():
    """GPT-2's byte-to-character map, as a list indexed by byte."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def make_pre_tokenizer(pre):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "gpt2":
        return byte_level
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    sys.exit(f"error: no pre-tokenizer named {pre!r} here")


def make_tokenizer(pieces, types, merges, pre):
    vocab = {p: i for i, p in enumerate(pieces)}
    assert len(vocab) == len(pieces), "a piece appears twice"
    pairs = []
    for m in merges:
        parts = m.split(" ")
        assert len(parts) == 2, f"merge {m!r} does not hold exactly one space"
        pairs.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab, pairs))
    tok.pre_tokenizer = make_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(p, special=True, normalized=False) for p, t in zip(pieces, types) if t in (CONTROL, USER_DEFINED)]
    tok.add_special_tokens(special)
    for a in special:
        assert tok.token_to_id(a.content) == vocab[a.content]
    return tok


def encode(tok, text):
    """The ids, and the byte offsets where the words end (the pre-tokenizer's
    words, and each control token)."""
    enc = tok.encode(text)
    back = tok.decode(enc.ids, skip_special_tokens=False)
    assert back == text, f"tokenizers does not decode {text!r} back: {back!r}"
    ends = {}
    for word, (_, end) in zip(enc.word_ids, enc.offsets):
        ends[word] = max(ends.get(word, 0), end)
    return enc.ids, [len(text[:ends[w]].encode("utf-8")) for w in sorted(ends)]


def case_line(pre, text, tok):
    ids, ends = encode(tok, text)
    return "\t".join(["case", pre, escape(text), " ".join(map(str, ids)), " ".join(map(str, ends))])


def fnv1a_ids(ids):
    h = 0xCBF29CE484222325
    for byte in struct.pack(f"<{len(ids)}i", *ids):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_gguf(path):
    reader = gguf.GGUFReader(path)
    def field(name):
        if name not in reader.fields:
            sys.exit(f"error: {path} has no {name}")
        return reader.fields[name].contents()
    if field("tokenizer.ggml.model") != "gpt2":
        sys.exit(f"error: {path} does not hold a gpt2 (byte-level BPE) tokenizer")
    return (field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"),
            field("tokenizer.ggml.merges"), field("tokenizer.ggml.pre"))


def write_cases(path, pieces, types, merges, texts):
    lines = ["# made by tests/make_bpe_fixtures.py: case<TAB>pre<TAB>text (escaped)<TAB>ids<TAB>word ends (bytes)",
             "# or file<TAB>pre<TAB>path<TAB>sha256<TAB>id count<TAB>FNV-1a 64 of the ids (int32 LE)"]
    for pre in ("smollm", "gpt2"):
        tok = make_tokenizer(pieces, types, merges, pre)
        lines += [case_line(pre, text, tok) for text in texts]
        for lic in LICENSES:
            data = open(lic, "rb").read()
            ids, _ = encode(tok, data.decode("utf-8"))
            lines.append("\t".join(["file", pre, lic, hashlib.sha256(data).hexdigest(), str(len(ids)),
                                    "%016x" % fnv1a_ids(ids)]))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def probe_joined(pre_tokenizer, before, after, code_points):
    """For each code point c: whether the pre-tokenizer keeps `before` and c
    in one word, in the string made of before + c + after for every c."""
    text = "".join(before + chr(c) + after for c in code_points)
    starts = {offsets[0] for _, offsets in pre_tokenizer.pre_tokenize_str(text)}
    unit = len(before) + 1 + len(after)
    return [i * unit + len(before) not in starts for i in range(len(code_points))]


def write_classes(path):
    """Per code point (NUL and surrogates left out): 'L' if the split pattern
    keeps it after "a" (\\p{L}+), 'N' after "1" (\\p{N}+), 'O' after "!"
    ([^\\s\\p{L}\\p{N}]+), else 'S' (\\s); then 'd' if Digits isolates it
    between two letters, else '-'. Ranges of "O-" are left out."""
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    pattern = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    letter = probe_joined(pattern, "a", "\x01", cps)
    number = probe_joined(pattern, "1", "\x01", cps)
    other = probe_joined(pattern, "!", "a", cps)
    digit_kept = probe_joined(pre_tokenizers.Digits(individual_digits=True), "a", "a", cps)
    ranges = []
    for i, c in enumerate(cps):
        kinds = [k for k, hit in zip("LNO", (letter[i], number[i], other[i])) if hit]
        assert len(kinds) <= 1, f"U+{c:04X} joins more than one class"
        cls = (kinds[0] if kinds else "S") + ("-" if digit_kept[i] else "d")
        if ranges and ranges[-1][2] == cls and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, cls])
    lines = ["# made by tests/make_bpe_fixtures.py: first<TAB>last<TAB>class (hex code points, inclusive);",
             "# class: L N S O for the split pattern, then d if Digits isolates it; O- ranges are left out"]
    lines += ["%04X\t%04X\t%s" % tuple(r) for r in ranges if r[2] != "O-"]
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")


def write_tiny(path):
    chars = byte_level_chars()
    merged = [m.replace(" ", "") for m in TINY_MERGES]
    pieces = list(dict.fromkeys(chars + merged))  # every byte, then each merge's result once
    pieces += TINY_CONTROL
    types = [1] * (len(pieces) - len(TINY_CONTROL)) + [CONTROL] * len(TINY_CONTROL)
    lines = ["# made by tests/make_bpe_fixtures.py: piece<TAB>type<TAB>piece (escaped), in id order;",
             "# merge<TAB>merge (escaped), in rank order; case<TAB>pre<TAB>text (escaped)<TAB>ids<TAB>word ends"]
    lines += ["\t".join(["piece", str(t), escape(p)]) for p, t in zip(pieces, types)]
    lines += ["\t".join(["merge", escape(m)]) for m in TINY_MERGES]
    for pre in ("gpt2", "smollm"):
        tok = make_tokenizer(pieces, types, TINY_MERGES, pre)
        lines += [case_line(pre, text, tok) for text in TINY_CASES]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("outdir")
    args = ap.parse_args()
    pieces, types, merges, pre = read_gguf(args.model)
    pieces, types, merges = list(pieces), [int(t) for t in types], list(merges)
    os.makedirs(args.outdir, exist_ok=True)
    write_cases(os.path.join(args.outdir, "bpe_cases.txt"), pieces, types, merges, CASES + random_texts(N_RANDOM))
    write_tiny(os.path.join(args.outdir, "bpe_tiny.txt"))
    write_classes(os.path.join(args.outdir, "bpe_classes.txt"))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The composition tables of docs/results.md: two documents in one request,
measured against three references, from the JSON that infer and study print.

    python3 scripts/compose_table.py DIR QA1 QA2

DIR holds what `scripts/results.sh real-compose` writes:
  qa-QA-MODS.json and qa-QA-MODS-joined.json   infer --qa --json and
      study --joined --qa --json, for each question set QA and MODS one of
      both (every document by its modules), first, second (one document by
      its modules, the other exact);
  eval.json and eval-joined.json   infer --eval --json and study --joined
      --json of both documents' module files.
With infer the full cache is (b), each document prefilled on its own; with
study --joined, (a), the true concatenation (one prefill, the second
document attending to the first). Nectar's composition is (c). (b) against
(a) is the cost of encoding the documents apart, which Nectar inherits; (c)
against (b) is Nectar's own.

Table 1, the questions (each set asked with both documents present): the
share of right choices of (a), (b), each Nectar composition and no document,
and how often each chose as (a) and as (b), with 95% Wilson intervals.
Table 2, each module file's held-out prompts (random split and
evaluation-only tasks) after both documents: Nectar's KL (as a multiple of
no document's) and top-1 agreement against (b) and against (a), and how
often its answer, and (b)'s, equal (a)'s. Standard library only."""
import json
import math
import os
import sys

MODS = (("both", "Nectar, both documents"), ("first", "Nectar, the first only"),
        ("second", "Nectar, the second only"))


def wilson(hits, n, z=1.959964):
    p, d = hits / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def rate(hits, n):
    lo, hi = wilson(hits, n)
    return "%.3f [%.2f, %.2f]" % (hits / n, lo, hi)


def same(a, b):
    return sum(x == y for x, y in zip(a, b))


def load(path):
    with open(path) as f:
        return json.load(f)


def questions(d, qa):
    """One question set's rows: (a), (b), the Nectar compositions, no document."""
    runs = {m: load(os.path.join(d, "qa-%s-%s.json" % (qa, m))) for m, _ in MODS}
    joined = {m: load(os.path.join(d, "qa-%s-%s-joined.json" % (qa, m))) for m, _ in MODS}
    a, b = joined["both"]["choices"]["full"], runs["both"]["choices"]["full"]
    n = len(a)
    acc = runs["both"]["accuracy"]
    rows = [("(a) one prefill of both", round(joined["both"]["accuracy"]["full"] * n), n, "", ""),
            ("(b) each prefilled apart", round(acc["full"] * n), n, rate(same(b, a), n), "")]
    for m, name in MODS:
        c = runs[m]["choices"]["nectar"]
        rows.append(("(c) " + name, round(runs[m]["accuracy"]["nectar"] * n), n, rate(same(c, a), n),
                     rate(same(c, b), n)))
    nodoc = runs["both"]["choices"]["nodoc"]
    rows.append(("no document", round(acc["nodoc"] * n), n, rate(same(nodoc, a), n), rate(same(nodoc, b), n)))
    print("\n%s questions (%d), both documents present\n" % (qa, n))
    print("| reference or composition | right choice [95%] | as (a) chose [95%] | as (b) chose [95%] |")
    print("|---|---|---|---|")
    for name, hits, total, as_a, as_b in rows:
        print("| %s | %s | %s | %s |" % (name, rate(hits, total), as_a or "-", as_b or "-"))


def answers_equal(x, y):
    """Answers of the same prompts in two runs: how many are equal, of how many."""
    by_prompt = {a["prompt"]: a["full"] for a in y}
    pairs = [(a["full"], by_prompt[a["prompt"]]) for a in x if a["prompt"] in by_prompt]
    return sum(p == q for p, q in pairs), len(pairs)


def kl_cell(s):
    return "%.3fx (%.3f / %.3f)" % (s["kl"] / s["kl_nodoc"], s["kl"], s["kl_nodoc"])


def held_out(d):
    apart, joined = load(os.path.join(d, "eval.json")), load(os.path.join(d, "eval-joined.json"))
    print("\nEach module file's held-out prompts after both documents\n")
    print("| prompts | n | Nectar's KL vs (b) | agreement vs (b) | answers = (b)'s | Nectar's KL vs (a) "
          "| agreement vs (a) | answers = (a)'s | (b)'s answers = (a)'s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mb, ma in zip(apart["modules"], joined["modules"]):
        for split in ("random", "tasks"):
            b, a = mb["metrics"][split], ma["metrics"][split]
            n = b["n_answers"]
            eq, pairs = answers_equal(mb["metrics"]["answers"][split], ma["metrics"]["answers"][split])
            print("| document %d (%s), %s | %d | %s | %.3f | %s | %s | %.3f | %s | %s |" % (
                mb["document"], os.path.basename(mb["module"]), split, b["n_prompts"], kl_cell(b), b["agree"],
                rate(round(b["answer_match"] * n), n) if n else "-", kl_cell(a), a["agree"],
                rate(round(a["answer_match"] * n), n) if n else "-", rate(eq, pairs) if pairs else "-"))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    for qa in sys.argv[2:]:
        questions(sys.argv[1], qa)
    held_out(sys.argv[1])


if __name__ == "__main__":
    main()

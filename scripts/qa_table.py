#!/usr/bin/env python3
"""The question-set and evaluation-only-task table of docs/results.md, from
train --json outputs made with --qa (each named LABEL=FILE.json, or FILE.json
and named by its file): one markdown row a fit.

    python3 scripts/qa_table.py "Apache-2.0, rho 10%=apache.json" ...

Columns: the questions: how often the full cache, Nectar and no document
chose the right option, and how often Nectar and no document chose as the
full cache; the evaluation-only tasks: how often Nectar's and no document's
answer equals the full cache's, and Nectar's KL (as a multiple of no
document's) and top-1 agreement; the held-out self-study prompts' KL
multiple, agreement and answers beside them. Every rate with its 95%
interval from train's JSON (Wilson's for counts, the prompts as clusters
for KL and agreement), but no document's answer match, whose Wilson
interval is computed here as src/eval.c computes Nectar's.

A second table splits the questions by the full cache's margin (its
chosen option's mean log-probability per token less the next option's):
how often Nectar and no document chose as the full cache where the full
cache was nearly undecided and where it was sure (only where a fit has
questions). A third counts the greedy answers that end with the model's
stop within the cap and those in a loop, of the full cache, Nectar and no
document, on the held-out self-study prompts and the evaluation-only
tasks, with each run's time. Standard library only."""
import json
import math
import sys


def ci(pair):
    return "[%.2f, %.2f]" % tuple(pair) if pair else "[n/a]"


def wilson(hits, n, z=1.959964):
    p, d = hits / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, mid - half), min(1.0, mid + half)]


def kl_cell(split):
    ratio = split["kl"] / split["kl_nodoc"]
    lo, hi = split["kl_ci"]
    return "%.3fx [%.3f, %.3f]" % (ratio, lo / split["kl_nodoc"], hi / split["kl_nodoc"])


def row(label, r):
    rnd, qa, tasks = r["random"], r.get("qa"), r.get("tasks")
    cells = [label]
    if qa:
        acc, accci, agree, agreeci = qa["accuracy"], qa["accuracy_ci"], qa["agree"], qa["agree_ci"]
        cells.append("%d: " % qa["n"] + " / ".join("%.3f %s" % (acc[k], ci(accci[k]))
                                                  for k in ("full", "nectar", "nodoc")))
        cells.append(" / ".join("%.3f %s" % (agree[k], ci(agreeci[k])) for k in ("nectar", "nodoc")))
    else:
        cells += ["", ""]
    if tasks:
        n = tasks["n_answers"]
        nodoc = round(tasks["answer_match_nodoc"] * n)
        cells.append("%d of %d = %.3f %s / %.3f %s" % (round(tasks["answer_match"] * n), n, tasks["answer_match"],
                     ci(tasks["answer_match_ci"]), nodoc / n, ci(wilson(nodoc, n))))
        cells.append("%s, %.3f %s" % (kl_cell(tasks), tasks["agree"], ci(tasks["agree_ci"])))
    else:
        cells += ["", ""]
    cells.append("%s, %.3f %s, %d of %d" % (kl_cell(rnd), rnd["agree"], ci(rnd["agree_ci"]),
                                           round(rnd["answer_match"] * rnd["n_answers"]), rnd["n_answers"]))
    return "| " + " | ".join(cells) + " |"


MARGIN_BINS = [(0, 0.25), (0.25, 0.5), (0.5, 1.0), (1.0, math.inf)]


def margin_row(label, qa):
    """Per bin of the full cache's margin (nats per token): questions, and Nectar's and no document's choices
    equal to the full cache's."""
    margins = [sorted(opts, reverse=True)[0] - sorted(opts, reverse=True)[1] for opts in qa["logprob_mean"]["full"]]
    choices = qa["choices"]
    cells = [label]
    for lo, hi in MARGIN_BINS:
        inside = [i for i, m in enumerate(margins) if lo <= m < hi]
        same = [sum(choices[k][i] == choices["full"][i] for i in inside) for k in ("nectar", "nodoc")]
        cells.append("%d: %d / %d" % (len(inside), same[0], same[1]))
    return "| " + " | ".join(cells) + " |"


def ends_cell(split):
    """Answers that end and that loop, full / Nectar / no document, of the split's answers."""
    if not split or not split["n_answers"]:  # no split, or no prompt with a question (spans only)
        return ""
    n = split["n_answers"]
    counts = lambda key: " / ".join("%d" % round(split[key][k] * n) for k in ("full", "nectar", "nodoc"))
    return "%s; %s of %d" % (counts("answer_ends"), counts("answer_repeats"), n)


def ends_row(label, r):
    return "| %s | %s | %s | %.0f s |" % (label, ends_cell(r["random"]), ends_cell(r.get("tasks")),
                                          r["total_seconds"])


def main(args):
    if not args:
        sys.exit(__doc__)
    print("| fit | questions: n: right, full / Nectar / no doc [95%] | choice = the full cache's: Nectar / no doc"
          " [95%] | evaluation-only tasks: answers = the full cache's, Nectar / no doc [95%] | their KL (x no doc),"
          " agreement [95%] | held-out self-study: KL (x no doc), agreement [95%], answers = |")
    print("|---|---|---|---|---|---|")
    fits = []
    for arg in args:
        label, _, path = arg.rpartition("=")
        with open(path) as f:
            fits.append((label or path, json.load(f)))
    for label, r in fits:
        print(row(label, r))
    if any(r.get("qa") for _, r in fits):
        print()
        print("| fit | " + " | ".join("full cache's margin %g to %g: n: Nectar / no doc = full" % b
                                       for b in MARGIN_BINS) + " |")
        print("|---" * (len(MARGIN_BINS) + 1) + "|")
        for label, r in fits:
            if r.get("qa"):
                print(margin_row(label, r["qa"]))
    print()
    print("| fit | held-out self-study: answers that end, full / Nectar / no doc; in a loop | evaluation-only"
          " tasks: the same | whole run |")
    print("|---|---|---|---|")
    for label, r in fits:
        print(ends_row(label, r))


if __name__ == "__main__":
    main(sys.argv[1:])

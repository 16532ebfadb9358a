#!/usr/bin/env python3
"""The question-set and evaluation-only-task table of docs/results.md, from
train --json outputs made with --qa (each named LABEL=FILE.json, or FILE.json
and named by its file): one markdown row a fit.

    python3 scripts/qa_table.py "Apache-2.0, rho 10%=apache.json" ...

Columns: the held-out KL of Nectar and of no document (random split) and
Nectar's top-1 agreement, each with its 95% interval; the questions: how
often the full cache, Nectar and no document chose the right option, and how
often Nectar and no document chose as the full cache; the evaluation-only
tasks: Nectar's and no document's answer match (with Nectar's interval) and
their KL ratio; the held-out self-study tasks' answer match beside them.
Standard library only."""
import json
import sys


def ci(pair, digits=3):
    return "[%.*f, %.*f]" % (digits, pair[0], digits, pair[1]) if pair else "[n/a]"


def row(label, r):
    rnd, qa, tasks = r["random"], r.get("qa"), r.get("tasks")
    cells = [label,
             "%.3f / %.3f = %.3fx %s" % (rnd["kl"], rnd["kl_nodoc"], rnd["kl"] / rnd["kl_nodoc"], ci(rnd["kl_ci"])),
             "%.3f %s" % (rnd["agree"], ci(rnd["agree_ci"]))]
    if qa:
        n, acc, agree = qa["n"], qa["accuracy"], qa["agree"]
        cells.append("%.3f / %.3f / %.3f (n %d) %s" % (acc["full"], acc["nectar"], acc["nodoc"], n,
                                                        ci(qa["accuracy_ci"]["nectar"])))
        cells.append("%.3f %s / %.3f" % (agree["nectar"], ci(qa["agree_ci"]["nectar"]), agree["nodoc"]))
    else:
        cells += ["", ""]
    if tasks:
        cells.append("%d of %d = %.3f %s / %.3f" % (round(tasks["answer_match"] * tasks["n_answers"]),
                     tasks["n_answers"], tasks["answer_match"], ci(tasks["answer_match_ci"]),
                     tasks["answer_match_nodoc"]))
        cells.append("%.3fx %s, %.3f" % (tasks["kl"] / tasks["kl_nodoc"], ci(tasks["kl_ci"]), tasks["agree"]))
    else:
        cells += ["", ""]
    cells.append("%d of %d" % (round(rnd["answer_match"] * rnd["n_answers"]), rnd["n_answers"]))
    return "| " + " | ".join(cells) + " |"


def main(args):
    if not args:
        sys.exit(__doc__)
    print("| fit | held-out KL Nectar / no doc [95%] | agreement [95%] | questions right: full / Nectar / no doc"
          " [Nectar's 95%] | Nectar's choice = the full cache's [95%] / no doc's | evaluation-only tasks: answers"
          " equal to the full cache's [95%] / no doc | their KL (x no doc) [95%], agreement | self-study tasks"
          " held out: answers equal |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in args:
        label, _, path = arg.rpartition("=")
        with open(path) as f:
            print(row(label or path, json.load(f)))


if __name__ == "__main__":
    main(sys.argv[1:])

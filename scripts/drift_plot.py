#!/usr/bin/env python3
"""The drift plot of docs/results.md: KL(full cache || model) against the
distance from the document, from `study --drift N --json` outputs,
as an SVG on stdout. A curve per input and mode: Nectar solid, no document
dashed, one colour per input (LABEL=FILE.json, or FILE.json named by its
file); each point at its bin's middle on a log2 axis of local tokens.
With --table first, the same bins as a Markdown table instead.

    python3 scripts/drift_plot.py "default model=drift.json" ... > drift.svg
    python3 scripts/drift_plot.py --table "default model=drift.json" ...

Standard library only."""
import json
import math
import sys

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 820, 400, 60, 330, 20, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def points(bins, key):
    """(log2 of the bin's middle, its KL) for every bin with positions."""
    return [(math.log2((b["lo"] + b["hi"]) / 2), b[key]) for b in bins if b["positions"] > 0]


def read(args):
    """[(label, bins)] of the LABEL=FILE.json arguments."""
    inputs = []
    for arg in args:
        label, _, path = arg.rpartition("=")
        with open(path) as f:
            inputs.append((label or path, json.load(f)["drift"]["bins"]))
    return inputs


def table(inputs):
    print("| model | tokens after the document | positions | KL Nectar [95%] | KL no doc | agreement Nectar / no doc |")
    print("|---|---|---|---|---|---|")
    for label, bins in inputs:
        for b in bins:
            if b["positions"] > 0:
                print("| %s | %d-%d | %d | %.3f [%.3f, %.3f] | %.3f | %.3f / %.3f |" % (
                    label, b["lo"], b["hi"], b["positions"], b["kl"], b["kl_ci"][0], b["kl_ci"][1],
                    b["kl_nodoc"], b["agree"], b["agree_nodoc"]))


def main(args):
    if not args or args == ["--table"]:
        sys.exit(__doc__)
    if args[0] == "--table":
        return table(read(args[1:]))
    curves = []  # (label, colour, dashed, points)
    for i, (label, bins) in enumerate(read(args)):
        colour = COLOURS[i % len(COLOURS)]
        curves.append((label + ", Nectar", colour, False, points(bins, "kl")))
        curves.append((label + ", no document", colour, True, points(bins, "kl_nodoc")))
    xs = [x for c in curves for x, _ in c[3]]
    x0, x1 = math.floor(min(xs)), math.ceil(max(xs))
    y1 = max(y for c in curves for _, y in c[3]) * 1.1
    sx = lambda x: LEFT + (x - x0) / max(x1 - x0, 1) * (WIDTH - LEFT - RIGHT)
    sy = lambda y: HEIGHT - BOTTOM - y / y1 * (HEIGHT - TOP - BOTTOM)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (WIDTH, HEIGHT), '<rect width="100%" height="100%" fill="white"/>']
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT,
                                                                         HEIGHT - BOTTOM))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (LEFT, TOP, LEFT, HEIGHT - BOTTOM))
    for e in range(x0, x1 + 1):  # x ticks at powers of two
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (sx(e), HEIGHT - BOTTOM + 16, 2 ** e))
    for k in range(5):  # y ticks
        y = y1 * k / 4
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (LEFT - 6, sy(y) + 4, y))
    out.append('<text x="%d" y="%d" text-anchor="middle">tokens after the document (bin middle)</text>'
               % ((LEFT + WIDTH - RIGHT) // 2, HEIGHT - 12))
    out.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">mean KL(full || model)'
               '</text>' % ((TOP + HEIGHT - BOTTOM) // 2, (TOP + HEIGHT - BOTTOM) // 2))
    for i, (label, colour, dashed, pts) in enumerate(curves):
        path = " ".join("%.1f,%.1f" % (sx(x), sy(y)) for x, y in pts)
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>' % (path, colour, dash))
        out += ['<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(x), sy(y), colour) for x, y in pts]
        ly = TOP + 14 + 18 * i
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                   % (WIDTH - RIGHT + 10, ly - 4, WIDTH - RIGHT + 34, ly - 4, colour, dash))
        out.append('<text x="%d" y="%d">%s</text>' % (WIDTH - RIGHT + 40, ly, label))
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])

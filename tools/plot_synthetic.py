#!/usr/bin/env python3
"""The figures and tables of the synthetic sweep (issue 14), one command each, from the sweep's summary CSV
(tools/sweep_synthetic.py; its rules: solved = at least 90% accuracy, a group solved by the majority of its seeds).

  plot_synthetic.py a5 SUMMARY --out a5_min_layers.png       fewest layers that solve each length, per mechanism
                                                             (the paper's Figure 2), and the tables behind it
  plot_synthetic.py mqrar SUMMARY --out mqrar_accuracy.png   answer accuracy vs N per mechanism: mean, the seeds,
                                                             their range
  plot_synthetic.py flipflop SUMMARY [--out table.md] [--paper MECH:SET=PERCENT ...]
                                                             error per set: mean, sd, range over seeds, beside the
                                                             paper's
  plot_synthetic.py curves SUMMARY --task T --runs CELLS [--only REGEX] --out curves.png
                                                             evaluation error by training step, one line per cell
                                                             (A5: per sequence)

Only finished cells enter a number; the tables say how many seeds each number has and how many are pending.
"""
import argparse
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_synthetic as sweep  # noqa: E402

MECH_ORDER = ["path", "path-fox", "rope", "fox", "nope"]
# The paper's flip-flop numbers (error %), as docs/model.md cites them (Yang et al. 2025, PaTH, Table 1): only the
# in-distribution ones are recorded in this project; add the others with --paper MECH:SET=PERCENT.
PAPER_FLIPFLOP = {("path", "in_dist"): 0.0, ("rope", "in_dist"): 6.9}
SETS = ["in_dist", "sparse", "dense"]


def mechanisms(rows):
    present = {r["mechanism"] for r in rows}
    return [m for m in MECH_ORDER if m in present] + sorted(present - set(MECH_ORDER))


def finished(rows):
    return [r for r in rows if str(r["finished"]) == "1"]


def spread(values):
    """(mean, sd, min, max) of a list (sd 0 for one value); None for none."""
    if not values:
        return None
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.mean(values), sd, min(values), max(values)


def fmt_spread(values, scale=100.0, digits=1):
    s = spread([v * scale for v in values])
    if s is None:
        return "-"
    mean, sd, lo, hi = s
    return f"{mean:.{digits}f} ± {sd:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f}, n={len(values)})"


def plt_module():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def a5_tables(rows):
    """(lines of markdown, {mechanism: [(length, min layers)]}) for the A5 rows."""
    rows = [r for r in rows if r["task"] == "a5"]
    verdicts = sweep.group_verdicts(rows)
    lengths = sorted({int(r["size"]) for r in rows})
    depths = sorted({int(r["layers"]) for r in rows})
    mechs = mechanisms(rows)
    out, points = [], {}
    out.append("Fewest layers that solve each length (a group solved: the majority of its seeds reach 90% sequence "
               f"accuracy); '>{max(depths)}': no depth that was run solves it; '?': undetermined (a seed still pending). "
               "A depth that leaves a length unsolved counts as leaving the longer lengths unsolved where their own "
               "seeds have no majority (tools/sweep_synthetic.py, MONOTONE_IN_SIZE).")
    out.append("")
    out.append("| length | " + " | ".join(mechs) + " |")
    out.append("|" + " --- |" * (len(mechs) + 1))
    for n in lengths:
        cells = []
        for m in mechs:
            k = sweep.min_layers(verdicts, "a5", n, m)
            points.setdefault(m, []).append((n, k))
            cells.append("?" if k is None else (f">{max(depths)}" if k == math.inf else str(k)))
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    out.append("")
    base = sweep.GRIDS["paper"]["a5"].get("base_seeds")
    out.append("Per depth: seeds solved / seeds finished (of planned), and the sequence accuracy % over the finished "
               "seeds: mean ± sd (min-max, n)." +
               (f" A verdict is the majority of the planned seeds; only the first {base} always run, the others "
                "only where those split (tools/sweep_synthetic.py base_seeds)." if base else ""))
    out.append("")
    out.append("| mechanism | layers | " + " | ".join(f"length {n}" for n in lengths) + " |")
    out.append("|" + " --- |" * (len(lengths) + 2))
    for m in mechs:
        for l in depths:
            cells = []
            for n in lengths:
                g = verdicts.get(("a5", n, m, l))
                if g is None:
                    cells.append("-")
                    continue
                acc = [float(r["seq_accuracy"]) for r in finished(rows)
                       if (int(r["size"]), r["mechanism"], int(r["layers"])) == (n, m, l)]
                verdict = g["verdict"] + (f" (as length {g['implied_by']})" if "implied_by" in g else "")
                cells.append(f"{g['solved']}/{g['solved'] + g['failed']} (of {g['seeds']}) {verdict}; "
                             f"{fmt_spread(acc)}")
            out.append(f"| {m} | {l} | " + " | ".join(cells) + " |")
    return out, points, depths


def cmd_a5(args):
    rows = sweep.read_summary(args.summary)
    lines, points, depths = a5_tables(rows)
    if not points:
        raise SystemExit(f"{args.summary}: no a5 rows")
    print("\n".join(lines))
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    top = max(depths) + 1
    offsets = {m: (i - (len(points) - 1) / 2) * 0.25 for i, m in enumerate(points)}
    for m, pts in points.items():
        xs = [n + offsets[m] for n, k in pts if k is not None]
        ys = [top if k == math.inf else k for n, k in pts if k is not None]
        line, = ax.plot(xs, ys, marker="o", label=m)
        for n, k in pts:  # unsolved: hollow marker at the top row; undetermined: a '?'
            if k == math.inf:
                ax.plot([n + offsets[m]], [top], marker="o", mfc="white", color=line.get_color())
            elif k is None:
                ax.annotate("?", (n + offsets[m], 0.6), color=line.get_color(), ha="center")
    ax.set_yticks(list(range(1, top + 1)))
    ax.set_yticklabels([str(d) for d in range(1, top)] + [f">{top - 1}"])
    ax.set_ylim(0.4, top + 0.4)
    ax.set_xticks(sorted({n for pts in points.values() for n, _ in pts}))
    return save_plot(fig, ax, args, "sequence length", "fewest layers solving A5 (>= 90%)",
                     "A5 word problems: majority of seeds")


def save_plot(fig, ax, args, xlabel, ylabel, title):
    """Labels, grid and legend of a figure, written to args.out (the title overridable with --title)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(args.title or title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"\nplot: {args.out}")
    return 0


def cmd_mqrar(args):
    rows = [r for r in sweep.read_summary(args.summary) if r["task"] == "mqrar"]
    if not rows:
        raise SystemExit(f"{args.summary}: no mqrar rows")
    ns = sorted({int(r["size"]) for r in rows})
    mechs = mechanisms(rows)
    fin = finished(rows)
    print("MQRAR-N answer accuracy %: mean ± sd (min-max, n finished seeds); pending seeds in brackets.\n")
    print("| N | " + " | ".join(mechs) + " |")
    print("|" + " --- |" * (len(mechs) + 1))
    for n in ns:
        cells = []
        for m in mechs:
            acc = [float(r["accuracy"]) for r in fin if (int(r["size"]), r["mechanism"]) == (n, m)]
            pending = sum(1 for r in rows if (int(r["size"]), r["mechanism"]) == (n, m)) - len(acc)
            cells.append(fmt_spread(acc) + (f" [{pending} pending]" if pending else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    offsets = {m: (i - (len(mechs) - 1) / 2) * 0.06 for i, m in enumerate(mechs)}
    for m in mechs:
        xs, means, lo, hi = [], [], [], []
        for n in ns:
            acc = [100 * float(r["accuracy"]) for r in fin if (int(r["size"]), r["mechanism"]) == (n, m)]
            if not acc:
                continue
            mean = statistics.mean(acc)
            xs.append(n + offsets[m])
            means.append(mean)
            lo.append(mean - min(acc))
            hi.append(max(acc) - mean)
            ax.plot([n + offsets[m]] * len(acc), acc, ".", color="gray", alpha=0.6, ms=4)
        if xs:
            ax.errorbar(xs, means, yerr=[lo, hi], marker="o", capsize=3, label=m)
    ax.set_xticks(ns)
    ax.set_ylim(0, 102)
    return save_plot(fig, ax, args, "N (N-back)", "answer accuracy % (mean; bars: seed range)", "MQRAR-N")


def cmd_flipflop(args):
    rows = [r for r in sweep.read_summary(args.summary) if r["task"] == "flipflop"]
    if not rows:
        raise SystemExit(f"{args.summary}: no flipflop rows")
    paper = dict(PAPER_FLIPFLOP)
    for p in args.paper or []:
        try:
            key, value = p.split("=", 1)
            mech, s = key.split(":", 1)
            paper[(mech, s)] = float(value)
        except ValueError:
            raise SystemExit(f"--paper: expected MECH:SET=PERCENT (e.g. rope:sparse=12.5), got '{p}'")
        if s not in SETS:
            raise SystemExit(f"--paper {p}: SET expected one of {', '.join(SETS)}, got '{s}'")
    fin = finished(rows)
    lines = ["Flip-flop error % on the bits after reads: mean ± sd (min-max, n finished seeds); the paper's beside "
             "it (PaTH, Yang et al. 2025, Table 1; '-' where this project has not recorded it).", ""]
    lines.append("| mechanism | seeds | " + " | ".join(f"{s} error" for s in SETS) + " | "
                 + " | ".join(f"paper {s}" for s in SETS) + " |")
    lines.append("|" + " --- |" * (2 + 2 * len(SETS)))
    for m in mechanisms(rows):
        mine = [r for r in fin if r["mechanism"] == m]
        planned = sum(1 for r in rows if r["mechanism"] == m)
        errs = [fmt_spread([float(r[f"{s}_error"]) for r in mine if r.get(f"{s}_error") not in (None, "")], digits=2)
                for s in SETS]
        pap = [f"{paper[(m, s)]:g}" if (m, s) in paper else "-" for s in SETS]
        lines.append(f"| {m} | {len(mine)} of {planned} | " + " | ".join(errs) + " | " + " | ".join(pap) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"\ntable: {args.out}")
    return 0


def cmd_curves(args):
    """Evaluation error against the training step for every cell of a task (each cell's metrics.csv), or of the cells
    whose id matches --only: one panel per evaluation set, one colour per mechanism, one line per seed. Shows whether
    the runs had flattened. A5's error is per sequence (its solved rule's metric: the `_seq_error` columns), the other
    tasks' per scored position."""
    import csv as csv_mod
    rows = [r for r in sweep.read_summary(args.summary) if r["task"] == args.task]
    if args.only:
        rows = [r for r in rows if re.search(args.only, r["cell"])]
    if not rows:
        raise SystemExit(f"{args.summary}: no {args.task} rows" + (f" matching --only {args.only!r}" if args.only else ""))
    suffix = "_seq_error" if args.task == "a5" else "_error"
    curves = {}  # cell -> (mechanism, {set: [(step, error %)]})
    for r in rows:
        path = os.path.join(args.runs, r["cell"], "metrics.csv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            data = list(csv_mod.DictReader(f))
        sets = [k[:-len(suffix)] for k in (data[0] if data else {}) if k.endswith(suffix)
                and (suffix == "_seq_error" or not k.endswith("_seq_error"))]
        curves[r["cell"]] = (r["mechanism"], {s: [(int(d["step"]), 100 * float(d[s + suffix])) for d in data]
                                              for s in sets})
    if not curves:
        raise SystemExit(f"{args.runs}: no metrics.csv of a {args.task} cell")
    sets = sorted({s for _, c in curves.values() for s in c}, key=lambda s: (s != "in_dist", s))
    plt = plt_module()
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.6), squeeze=False)
    colours = {m: f"C{i}" for i, m in enumerate(MECH_ORDER)}
    for ax, s in zip(axes[0], sets):
        seen = set()
        for cell, (m, c) in sorted(curves.items()):
            if s not in c:
                continue
            steps, errs = zip(*c[s])
            ax.plot(steps, errs, color=colours.get(m, "k"), alpha=0.8, lw=1.2, label=None if m in seen else m)
            seen.add(m)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{s} {'sequence ' if suffix == '_seq_error' else ''}error %")
        ax.set_title(s)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(args.title or f"{args.task}: evaluation error during training (one line per seed)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out} ({len(curves)} cells)")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("a5", "mqrar"):
        p = sub.add_parser(name)
        p.add_argument("summary", help="summary.csv of tools/sweep_synthetic.py")
        p.add_argument("--out", required=True, help="PNG to write")
        p.add_argument("--title", default="")
    p = sub.add_parser("flipflop")
    p.add_argument("summary")
    p.add_argument("--out", default="", help="markdown file to write the table to")
    p.add_argument("--paper", action="append", metavar="MECH:SET=PERCENT", help="a number of the paper's Table 1")
    p = sub.add_parser("curves")
    p.add_argument("summary")
    p.add_argument("--task", required=True, choices=["a5", "mqrar", "flipflop"])
    p.add_argument("--runs", required=True, help="the folder holding the cells (their metrics.csv)")
    p.add_argument("--only", default="", help="only the cells whose id matches this regular expression")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="")
    args = ap.parse_args(argv)
    return {"a5": cmd_a5, "mqrar": cmd_mqrar, "flipflop": cmd_flipflop, "curves": cmd_curves}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

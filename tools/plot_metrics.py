#!/usr/bin/python3
"""Plots the training curves of pathattn_train runs and prints their final errors as a table.

Each RUN is an output folder of pathattn_train (metrics.csv, metrics.json). One PNG with one panel per
evaluation set (error, log scale) plus the training loss; runs are labelled by their mechanism.

  /usr/bin/python3 tools/plot_metrics.py RUN [RUN ...] --out curves.png [--table] [--paper path=0 rope=6.9]
"""
import argparse
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(folder):
    with open(os.path.join(folder, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    meta = {}
    path = os.path.join(folder, "metrics.json")
    if os.path.exists(path):
        with open(path) as f:
            meta = json.load(f)
    label = meta.get("mechanism", os.path.basename(os.path.normpath(folder)))
    return label, rows, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="pathattn_train output folders")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("--table", action="store_true", help="print a markdown table of the final errors")
    ap.add_argument("--paper", nargs="*", default=[], help="MECH=PERCENT: the paper's in-distribution error")
    ap.add_argument("--positions", action="store_true",
                    help="print the accuracy at each position of the first set (A5: accuracy per length)")
    args = ap.parse_args()

    runs = [read_run(r) for r in args.runs]
    # Runs that differ in depth are told apart by it (A5 sweeps over layers).
    if len({m.get("layers") for _, _, m in runs}) > 1:
        runs = [(f"{label} L{meta.get('layers')}", rows, meta) for label, rows, meta in runs]
    # One panel per evaluation set: its "<set>_error" column ("<set>_seq_error", the sequence error of synthetic tasks,
    # is not a set of its own).
    sets = [c[: -len("_error")] for c in runs[0][1][0].keys()
            if c.endswith("_error") and not c.endswith("_seq_error")] if runs[0][1] else []
    fig, axes = plt.subplots(1, len(sets) + 1, figsize=(4.2 * (len(sets) + 1), 3.6))
    if len(sets) == 0:
        axes = [axes]
    for label, rows, _ in runs:
        steps = [int(r["step"]) for r in rows]
        axes[0].plot(steps, [float(r["train_loss"]) for r in rows], marker="o", ms=3, label=label)
        for ax, s in zip(axes[1:], sets):
            # Errors of exactly 0 cannot sit on a log axis: draw them at a floor and say so in the label.
            ys = [max(float(r[s + "_error"]) * 100, 1e-2) for r in rows]
            ax.plot(steps, ys, marker="o", ms=3, label=label)
    axes[0].set_title("training loss (scored tokens)")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    for ax, s in zip(axes[1:], sets):
        ax.set_title(f"{s} error (%)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("error %, 0 drawn at 0.01")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)

    if args.table:
        paper = dict(p.split("=", 1) for p in args.paper)
        head = "| mechanism | steps | train s | " + " | ".join(f"{s} error" for s in sets) + " |"
        if paper:
            head += " paper in-dist |"
        print(head)
        print("|" + " --- |" * (head.count("|") - 1))
        for label, rows, meta in runs:
            last = rows[-1]
            errs = " | ".join(f"{100 * float(last[s + '_error']):.3f}%" for s in sets)
            p = paper.get(label)
            line = f"| {label} | {last['step']} | {meta.get('train_seconds', float('nan')):.0f} | {errs} |"
            if paper:
                line += f" {p + '%' if p is not None else 'n/a'} |"
            print(line)
    if args.positions:
        # Unscored leading positions that every run shares (A5's BOS token, --a5-bos) are left out, so that column
        # "len k" is the prefix of k elements with and without BOS.
        accs = [m.get("position_accuracy", []) for _, _, m in runs]
        lead = min(next((i for i, a in enumerate(acc) if a is not None), len(acc)) for acc in accs)
        n = max(len(acc) for acc in accs) - lead
        print("| run | " + " | ".join(f"len {t + 1}" for t in range(n)) + " |")
        print("|" + " --- |" * (n + 1))
        for (label, _, _), acc in zip(runs, accs):
            print(f"| {label} | " + " | ".join(f"{100 * a:.1f}%" if a is not None else "-" for a in acc[lead:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

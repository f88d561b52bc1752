#!/usr/bin/python3
"""Plots language-model runs of pathattn_train (--task lm) and their pathattn_lm_eval results.

Each RUN is a pathattn_train output folder (metrics.csv, metrics.json); its evaluation is RUN/<eval-dir>
(extrap.csv, eval.json; pathattn_lm_eval --out RUN/eval). Runs are labelled by mechanism ("path from rope" for a
run started with --init-from).

  /usr/bin/python3 tools/plot_lm.py RUN [RUN ...] [--curves curves.png] [--extrap extrap.png [--zoom LO,HI]] [--table]

--curves: training loss and validation loss against tokens seen (a run started with --init-from is drawn after its
source run's tokens; the training loss of every progress line of RUN/train.log when there is one, else of the
evaluations in metrics.csv). --extrap: loss against position on windows longer than the training length (the
paper's Figure 3), a dashed line at the training length. --table: a markdown table of the final validation loss and
perplexity and the test loss per range of positions, then, where runs differ only by seed, their mean and standard
deviation per mechanism. Runs of one mechanism with different seeds are labelled "mechanism, seed N".
"""
import argparse
import csv
import json
import math
import os
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_json(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


# A trainer progress line (model/trainer.cpp): "[lm/path] step 150/657  loss 4.3694  lr 7.50e-04 ...".
PROGRESS = re.compile(r"^\[[^\]]*\] step (\d+)/\d+\s+loss ([0-9.eE+-]+|nan|inf)\s")


def read_progress(folder):
    """(step, training loss) of every progress line of folder/train.log; a resumed run repeats none (each
    invocation continues from its checkpoint), but a line seen twice keeps its last value."""
    path = os.path.join(folder, "train.log")
    if not os.path.exists(path):
        return []
    by_step = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = PROGRESS.match(line)
            if m:
                by_step[int(m.group(1))] = float(m.group(2))
    return sorted(by_step.items())


def find_source(folder, init_from):
    """metrics.json of the run whose checkpoint init_from names: where it was (the same machine), or, for runs
    copied elsewhere together, the sibling folder of the same name (runs/lm/rope/ckpt -> <folder>/../rope)."""
    src_dir = os.path.dirname(os.path.normpath(init_from))
    for d in (src_dir, os.path.join(os.path.dirname(os.path.normpath(folder)), os.path.basename(src_dir))):
        meta = read_json(os.path.join(d, "metrics.json"))
        if meta:
            return meta
    return {"mechanism": os.path.basename(src_dir) or "checkpoint"}


def read_run(folder, eval_dir):
    meta = read_json(os.path.join(folder, "metrics.json"))
    label = meta.get("mechanism", os.path.basename(os.path.normpath(folder)))
    offset = 0  # a run started from another's checkpoint continues that run's curve: its tokens come after
    if meta.get("init_from"):
        src = find_source(folder, meta["init_from"])
        label += f" from {src.get('mechanism', 'checkpoint')}"
        offset = src.get("tokens_seen", 0)
    return {"label": label, "group": label, "meta": meta, "offset": offset,
            "rows": read_csv(os.path.join(folder, "metrics.csv")), "progress": read_progress(folder),
            "extrap": read_csv(os.path.join(folder, eval_dir, "extrap.csv")),
            "eval": read_json(os.path.join(folder, eval_dir, "eval.json"))}


def label_seeds(runs):
    """Runs that share a label but not a seed are told apart by it; "group" keeps the shared label."""
    for r in runs:
        seeds = {q["meta"].get("seed") for q in runs if q["group"] == r["group"]}
        if len(seeds) > 1:
            r["label"] = f"{r['group']}, seed {r['meta'].get('seed')}"


def plot_curves(runs, out, title):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in runs:
        per_step = r["meta"].get("tokens_per_step", 1)
        mtok = lambda step: (r["offset"] + step * per_step) / 1e6  # noqa: E731
        train = r["progress"] or [(int(row["step"]), float(row["train_loss"])) for row in r["rows"]]
        axes[0].plot([mtok(s) for s, _ in train], [v for _, v in train], marker="o", ms=2, label=r["label"])
        axes[1].plot([mtok(int(row["step"])) for row in r["rows"]], [float(row["valid_loss"]) for row in r["rows"]],
                     marker="o", ms=2, label=r["label"])
    for ax, name in zip(axes, ["training loss", "validation loss"]):
        ax.set_title(f"{name} (nats/token)")
        ax.set_xlabel("tokens seen (M)")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_extrap(runs, out, title, logx, zoom):
    """Loss by position; with zoom (lo, hi) a second panel shows that loss range, where the curves that do not
    blow up past the training length can be told apart."""
    panels = 2 if zoom else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.2), squeeze=False)
    for k, ax in enumerate(axes[0]):
        seq_len = None
        for r in runs:
            if not r["extrap"]:
                continue
            mid = [(int(row["bucket_start"]) + int(row["bucket_end"])) / 2 for row in r["extrap"]]
            ax.plot(mid, [float(row["loss"]) for row in r["extrap"]], label=r["label"])
            seq_len = r["eval"].get("seq_len", seq_len)
        if seq_len:
            ax.axvline(seq_len, ls="--", color="gray", lw=1, label=f"training length {seq_len}")
        if logx:
            ax.set_xscale("log")
        if k == 1:
            ax.set_ylim(*zoom)
        ax.set_xlabel("position")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title((title or "loss by position") + (f" (loss {zoom[0]:g}-{zoom[1]:g})" if k == 1 else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def table(runs):
    ranges = []
    for r in runs:
        for g in r["eval"].get("ranges", []):
            if (g["begin"], g["end"]) not in ranges:
                ranges.append((g["begin"], g["end"]))
    head = "| run | parameters | tokens (M) | valid loss | valid ppl | " + " | ".join(
        f"test [{b}, {e})" for b, e in ranges) + " |"
    print(head)
    print("|" + " --- |" * (5 + len(ranges)))
    for r in runs:
        m = r["meta"]
        loss = m.get("loss", {}).get("valid")
        tok = m.get("tokens_seen", 0) / 1e6
        by = {(g["begin"], g["end"]): g["loss"] for g in r["eval"].get("ranges", [])}
        cells = [f"{by[k]:.4f}" if by.get(k) is not None else "" for k in ranges]
        ppl = f"{math.exp(loss):.3f}" if loss is not None else ""
        loss_s = f"{loss:.4f}" if loss is not None else ""
        row = [r["label"], str(m.get("parameters", "")), f"{tok:.1f}", loss_s, ppl] + cells
        print("| " + " | ".join(row) + " |")
    seed_table(runs, ranges)


def seed_table(runs, ranges):
    """Mean and sample standard deviation over the seeds of each mechanism that has more than one."""
    groups = {}
    for r in runs:
        groups.setdefault(r["group"], []).append(r)
    groups = {g: rs for g, rs in groups.items() if len({r["meta"].get("seed") for r in rs}) > 1}
    if not groups:
        return
    print()
    print("| mechanism | seeds | valid loss | " + " | ".join(f"test [{b}, {e})" for b, e in ranges) + " |")
    print("|" + " --- |" * (3 + len(ranges)))
    for g, rs in groups.items():
        def cell(values):
            values = [v for v in values if v is not None]
            if len(values) < 2:
                return ""
            return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"
        by = [{(x["begin"], x["end"]): x["loss"] for x in r["eval"].get("ranges", [])} for r in rs]
        row = [g, ", ".join(str(r["meta"].get("seed")) for r in rs),
               cell([r["meta"].get("loss", {}).get("valid") for r in rs])] + [cell([b.get(k) for b in by])
                                                                             for k in ranges]
        print("| " + " | ".join(row) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="pathattn_train --task lm output folders")
    ap.add_argument("--eval-dir", default="eval", help="pathattn_lm_eval's --out, relative to each run")
    ap.add_argument("--curves", help="PNG of the training curves")
    ap.add_argument("--extrap", help="PNG of loss by position")
    ap.add_argument("--logx", action="store_true", help="log scale for position")
    ap.add_argument("--zoom", help="LO,HI: a second panel of the extrapolation plot with this loss range")
    ap.add_argument("--title", default="")
    ap.add_argument("--table", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    runs = [read_run(r, args.eval_dir) for r in args.runs]
    label_seeds(runs)
    if args.curves:
        plot_curves(runs, args.curves, args.title)
    if args.extrap:
        zoom = tuple(float(x) for x in args.zoom.split(",")) if args.zoom else None
        if zoom is not None and (len(zoom) != 2 or not zoom[0] < zoom[1]):
            ap.error(f"--zoom expects LO,HI with LO < HI, got '{args.zoom}'")
        plot_extrap(runs, args.extrap, args.title, args.logx, zoom)
    if args.table:
        table(runs)


if __name__ == "__main__":
    main()

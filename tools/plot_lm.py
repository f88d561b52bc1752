#!/usr/bin/python3
"""Plots language-model runs of pathattn_train (--task lm) and their pathattn_lm_eval results.

Each RUN is a pathattn_train output folder (metrics.csv, metrics.json); its evaluation is RUN/<eval-dir>
(extrap.csv, eval.json; pathattn_lm_eval --out RUN/eval). Runs are labelled by mechanism ("path from rope" for a
run started with --init-from).

  /usr/bin/python3 tools/plot_lm.py RUN [RUN ...] [--curves curves.png] [--extrap extrap.png] [--table]

--curves: training loss and validation loss against tokens seen (a run started with --init-from is drawn after its
source run's tokens). --extrap: loss against position on windows
longer than the training length (the paper's Figure 3), a dashed line at the training length. --table: a markdown
table of the final validation loss and perplexity and the test loss per range of positions.
"""
import argparse
import csv
import json
import math
import os

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


def read_run(folder, eval_dir):
    meta = read_json(os.path.join(folder, "metrics.json"))
    label = meta.get("mechanism", os.path.basename(os.path.normpath(folder)))
    offset = 0  # a run started from another's checkpoint continues that run's curve: its tokens come after
    if meta.get("init_from"):
        src = read_json(os.path.join(os.path.dirname(os.path.normpath(meta["init_from"])), "metrics.json"))
        label += f" from {src.get('mechanism', 'checkpoint')}"
        offset = src.get("tokens_seen", 0)
    return {"label": label, "meta": meta, "offset": offset, "rows": read_csv(os.path.join(folder, "metrics.csv")),
            "extrap": read_csv(os.path.join(folder, eval_dir, "extrap.csv")),
            "eval": read_json(os.path.join(folder, eval_dir, "eval.json"))}


def plot_curves(runs, out, title):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in runs:
        per_step = r["meta"].get("tokens_per_step", 1)
        tokens = [(r["offset"] + int(row["step"]) * per_step) / 1e6 for row in r["rows"]]
        axes[0].plot(tokens, [float(row["train_loss"]) for row in r["rows"]], marker="o", ms=2, label=r["label"])
        axes[1].plot(tokens, [float(row["valid_loss"]) for row in r["rows"]], marker="o", ms=2, label=r["label"])
    for ax, name in zip(axes, ["training loss", "validation loss"]):
        ax.set_title(f"{name} (nats/token)")
        ax.set_xlabel("tokens seen (M)")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_extrap(runs, out, title, logx):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
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
    ax.set_xlabel("position")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title or "loss by position")
    ax.grid(alpha=0.3)
    ax.legend()
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="pathattn_train --task lm output folders")
    ap.add_argument("--eval-dir", default="eval", help="pathattn_lm_eval's --out, relative to each run")
    ap.add_argument("--curves", help="PNG of the training curves")
    ap.add_argument("--extrap", help="PNG of loss by position")
    ap.add_argument("--logx", action="store_true", help="log scale for position")
    ap.add_argument("--title", default="")
    ap.add_argument("--table", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    runs = [read_run(r, args.eval_dir) for r in args.runs]
    if args.curves:
        plot_curves(runs, args.curves, args.title)
    if args.extrap:
        plot_extrap(runs, args.extrap, args.title, args.logx)
    if args.table:
        table(runs)


if __name__ == "__main__":
    main()

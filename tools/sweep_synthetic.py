#!/usr/bin/env python3
"""The synthetic-task sweep of issue 14: a grid of (task, size, mechanism, layers, seed) cells, each one
pathattn_train run, run in bounded, resumable invocations (a device command has 10 minutes), with one results folder
per cell and one summary CSV. docs/results/synthetic/README.md has the GPU commands and the plan.

  sweep_synthetic.py plan    [GRID] [--steps-csv CSV ...] [--gpus G --jobs-per-gpu J --budget S]
  sweep_synthetic.py measure [GRID] --build BUILD --device cpu|cuda --out CSV     step times (bench_step)
  sweep_synthetic.py run     [GRID] --build BUILD --runs RUNS [--results DIR] [--also-done DIR ...] [--budget S]
                             [--device cpu|cuda] [--gpus G] [--jobs-per-gpu J | --jobs N] [--max-steps-per-call N]
                             [--drain]
  sweep_synthetic.py summary [GRID] --runs RUNS [--also-done DIR ...] --out CSV
  sweep_synthetic.py status  [GRID] --runs RUNS [--also-done DIR ...]
  GRID: --grid paper|tiny  [--tasks a5,mqrar,flipflop]  [--only REGEX]  [--set TASK.KEY=VALUE ...]

A cell is finished when its metrics.json says so (the trainer ran all its steps, or met its stopping criterion);
run skips finished cells, resumes the others from their checkpoints (--resume), and stops starting cells when the
budget is nearly spent; each cell gets --time-limit for what is left, so it ends with a checkpoint in time. After
each cell ends, its metrics.csv, metrics.json, train.log, config.txt and cell.json are copied to RESULTS/<cell>/ and
RESULTS/summary.csv is rewritten, so what a command leaves behind is usable even when it is cut off.

Rules (also used by tools/plot_synthetic.py): a cell is solved when its accuracy on the in-distribution set is at
least 90%: for A5 the sequence accuracy (every prefix product of a sequence right; Merrill et al.'s metric), for
MQRAR and flip-flop the accuracy on the scored positions (answers, bits after reads). A (task, size, mechanism,
layers) group is solved when a majority of its planned seeds are (2 of 3; A5: 3 of 5), unsolved when a majority can
no longer be reached, pending otherwise. A5's seeds 4 and 5 (base_seeds 3) run only for a group that its seeds 1-3
leave undecided, a 2-1 split; three that agree are already a majority of five (lazy_seed_skip). The fewest layers
that solve a length is the smallest solved depth, provided every shallower depth is unsolved (a pending shallower
depth leaves it undetermined). So for A5 (by_depth) the cells run depth by depth and the depths above a solved one
are skipped: they cannot change the answer (pruned_by). The remaining seeds of a group whose verdict is already
decided run after every cell that can still change one (next_cell). A5 is also taken as monotone in its length
(MONOTONE_IN_SIZE): a depth that leaves a length unsolved is read as leaving every longer length unsolved (a model
that gets length n right gets each of its shorter prefixes right, since every position is scored), so a pending
group with an unsolved shorter length at its depth counts as unsolved (group_verdicts, "implied_by"), and with
by_length its cells are skipped (pruned_by_length): a depth at which length 5 fails is not run at lengths 10-20.
Cells that ran keep their own verdict.
"""
import argparse
import copy
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

MECHANISMS = ["path", "path-fox", "rope", "fox"]
SOLVED_THRESHOLD = 0.9

# The grids. "paper": the GPU sizes of docs/results/synthetic/README.md. "tiny": a few seconds on one CPU core (how
# the driver is tested). Each task: the grid's axes (sizes, layers, mechanisms, seeds) and the run's options.
GRIDS = {
    "paper": {
        # Merrill et al. (arXiv 2404.08819): all 60 elements of A5 as tokens, the prefix product at every position;
        # width 512, 8 heads as their released code's defaults; stop at 99% sequence accuracy as their code does.
        # by_depth: the cells run depth by depth, and a (length, mechanism) skips the depths above one that a
        # majority of its seeds solved (the fewest layers is then decided below them; see pruned_by).
        # by_length: inside a depth every seed of a length runs before the next length, and the longer lengths of a
        # depth whose shorter length is unsolved are skipped (pruned_by_length; MONOTONE_IN_SIZE says why).
        # bos: a BOS token first, as Merrill et al.'s tokenizer does (model/task.h says why it matters). On since the
        # twenty-seventh session: without it PaTH failed three layers at length 10 on both seeds and solved it on 3
        # of 5 with it (docs/results/synthetic/README.md). The cells run without it are in
        # docs/results/synthetic/cells-a5-nobos (the cell ids do not say it: --set a5.bos=0 reads them).
        # base_seeds: a group's verdict is the majority of its five seeds, but only its first three always run;
        # seeds 4 and 5 run only while those leave it undecided (a 2-1 split), so that no verdict rests on which
        # three seeds were drawn when they disagree (twenty-eighth session: PaTH at three layers, length 10, solved
        # 1 of seeds 1-3 and 3 of seeds 1-5; lazy_seed_skip, waits_for_base_seeds).
        "a5": dict(sizes=[5, 10, 15, 20], layers=[1, 2, 3, 4], mechanisms=MECHANISMS, seeds=[1, 2, 3, 4, 5],
                   width=512, heads=8, batch=256, steps=10000, lr=5e-4, warmup=500, weight_decay=0.01,
                   eval_every=500, eval_size=2048, eval_batch=512, stop=0.01, by_depth=True, by_length=True,
                   bos=True, base_seeds=3),
        # PaTH paper's MQRAR-N: 2 layers, width 256, 2 heads, 32 keys and 32 values, length 768, N = 1..4.
        "mqrar": dict(sizes=[1, 2, 3, 4], layers=[2], mechanisms=MECHANISMS, seeds=[1, 2, 3],
                      width=256, heads=2, length=768, keys=32, values=32, p_query=0.25, batch=64, steps=10000,
                      lr=1e-3, warmup=500, weight_decay=0.1, eval_every=500, eval_size=1024, eval_batch=128,
                      stop=0.01),
        # Flip-flop (Liu et al. 2023): 512 tokens, p(ignore) 0.8 for training, sparse (0.98) and dense (0.1) sets.
        # The model size is this project's choice (see the README): check it against the paper's before a run.
        # 4000 steps (33M tokens): the 12 cells fit one device command (measured on the H200 with 4 cells sharing
        # it: 24 s per 1000 steps each; the in-distribution error of PaTH and FoX is 0 from step 500-1000).
        "flipflop": dict(sizes=[256], layers=[2], mechanisms=MECHANISMS, seeds=[1, 2, 3],
                         width=128, heads=2, p_ignore=0.8, batch=16, steps=4000, lr=1e-3, warmup=200,
                         weight_decay=0.1, eval_every=500, eval_size=4096, eval_batch=256, stop=-1),
    },
    "tiny": {
        "a5": dict(sizes=[3], layers=[1], mechanisms=["path", "rope"], seeds=[1],
                   width=16, heads=2, batch=8, steps=8, lr=3e-3, warmup=2, weight_decay=0.01,
                   eval_every=4, eval_size=8, eval_batch=8, stop=-1, by_depth=True, by_length=False, bos=False),
        "mqrar": dict(sizes=[1], layers=[1], mechanisms=["path", "rope"], seeds=[1],
                      width=16, heads=2, length=16, keys=4, values=4, p_query=0.25, batch=4, steps=6,
                      lr=3e-3, warmup=2, weight_decay=0.1, eval_every=3, eval_size=4, eval_batch=4, stop=-1),
        "flipflop": dict(sizes=[8], layers=[1], mechanisms=["path", "rope"], seeds=[1],
                         width=16, heads=2, p_ignore=0.8, batch=4, steps=6, lr=3e-3, warmup=2,
                         weight_decay=0.1, eval_every=3, eval_size=4, eval_batch=4, stop=-1),
    },
}
SIZE_NAME = {"a5": "length", "mqrar": "n", "flipflop": "pairs"}
SIZE_TAG = {"a5": "len", "mqrar": "n", "flipflop": "p"}
LIST_KEYS = ("sizes", "layers", "mechanisms", "seeds")
# The GPU step benchmark (docs/perf/results.md): a PaTH training step of the bench_step default configuration
# (width 768, 12 layers, 12 heads, SwiGLU 2048, vocab 8192, 8 x 4096 tokens, bf16 on one H200) took 303.3 ms.
BENCH_SHAPE = dict(task="lm", width=768, layers=12, heads=12, mlp=2048, vocab=8192, T=4096, batch=8,
                   mechanism="path")
BENCH_STEP_S = 0.3033


class Cell:
    def __init__(self, task, size, mechanism, layers, seed, opts, rank=0):
        self.task, self.size, self.mechanism, self.layers, self.seed = task, size, mechanism, layers, seed
        self.opts = opts  # the task's options of the grid (without the list axes)
        self.rank = rank  # the seed's place in the grid's seed list (base_seeds: the first ones always run)

    @property
    def lazy(self):
        """A seed beyond the task's base_seeds: it runs only for a group that its first seeds leave undecided."""
        return self.rank >= self.opts.get("base_seeds", math.inf)

    @property
    def id(self):
        return f"{self.task}-{SIZE_TAG[self.task]}{self.size}-l{self.layers}-{self.mechanism}-s{self.seed}"

    @property
    def group(self):
        return (self.task, self.size, self.mechanism, self.layers)

    def vocab(self):
        if self.task == "a5":
            return 61 if self.opts.get("bos") else 60
        return {"flipflop": 5}.get(self.task) or 2 * self.opts["keys"] + self.opts["values"]

    def seq_len(self):
        if self.task == "a5":
            return self.size + (1 if self.opts.get("bos") else 0)
        return {"flipflop": 2 * self.size - 1}.get(self.task) or self.opts["length"] - 1

    def train_args(self):
        """pathattn_train's options of this cell (everything but where it runs)."""
        o = self.opts
        args = ["--task", self.task, "--mechanism", self.mechanism, "--layers", self.layers, "--width", o["width"],
                "--heads", o["heads"], "--batch", o["batch"], "--steps", o["steps"], "--lr", o["lr"],
                "--warmup", o["warmup"], "--weight-decay", o["weight_decay"], "--eval-every", o["eval_every"],
                "--eval-size", o["eval_size"], "--eval-batch", o["eval_batch"], "--seed", self.seed,
                "--log-every", max(1, o["eval_every"] // 2)]
        if self.task == "a5":
            args += ["--a5-length", self.size, "--stop-seq-error", o["stop"]] + (["--a5-bos"] if o.get("bos") else [])
        elif self.task == "mqrar":
            args += ["--mqrar-n", self.size, "--mqrar-length", o["length"], "--mqrar-keys", o["keys"],
                     "--mqrar-values", o["values"], "--mqrar-p-query", o["p_query"], "--stop-error", o["stop"]]
        else:
            args += ["--ff-pairs", self.size, "--ff-p-ignore", o["p_ignore"], "--stop-error", o["stop"]]
        return [str(a) for a in args]

    def record(self):
        return {"cell": self.id, "task": self.task, "size": self.size, "mechanism": self.mechanism,
                "layers": self.layers, "seed": self.seed, "args": self.train_args()}


def parse_value(text, like):
    """A --set value, typed as the grid's value it replaces."""
    if isinstance(like, list):
        items = [t for t in text.split(",") if t]
        return [parse_value(t, like[0]) if like else t for t in items]
    if isinstance(like, bool):
        if text not in ("0", "1", "false", "true"):
            raise SystemExit(f"--set: expected 0, 1, false or true, got '{text}'")
        return text in ("1", "true")
    for kind in (int, float):
        if isinstance(like, kind):
            try:
                return kind(text)
            except ValueError:
                raise SystemExit(f"--set: expected a {kind.__name__}, got '{text}'")
    return text


def make_grid(args):
    """The cells of --grid, --tasks, --set and --only, in run order (task by task, then seed, size, layers,
    mechanism: the first seed of every cell comes before the second; for a task with by_depth, layers first, then
    seed, size, mechanism: every seed of a depth before the next depth, so that pruned_by can skip deeper cells; with
    by_length too, layers, size, seed, mechanism: every seed of a length before the next length of the same depth,
    so that pruned_by_length can skip longer ones)."""
    if args.grid not in GRIDS:
        raise SystemExit(f"--grid: expected one of {', '.join(GRIDS)}, got '{args.grid}'")
    grid = copy.deepcopy(GRIDS[args.grid])
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if t not in grid:
            raise SystemExit(f"--tasks: expected a comma list of {', '.join(grid)}, got '{t}'")
    for s in args.set or []:
        m = re.fullmatch(r"(\w+)\.(\w+)=(.*)", s)
        if not m or m.group(1) not in grid or m.group(2) not in grid[m.group(1)]:
            keys = ", ".join(sorted(grid.get(m.group(1), {}))) if m and m.group(1) in grid else ""
            raise SystemExit(f"--set: expected TASK.KEY=VALUE with TASK in {', '.join(grid)}"
                             + (f" and KEY in {keys}" if keys else "") + f", got '{s}'")
        task, key, value = m.groups()
        grid[task][key] = parse_value(value, grid[task][key])
    for t in tasks:
        for m in grid[t]["mechanisms"]:
            if m not in MECHANISMS + ["nope"]:
                raise SystemExit(f"--set {t}.mechanisms: expected path, path-fox, rope, fox or nope, got '{m}'")
    cells = []
    for t in tasks:
        g = grid[t]
        opts = {k: v for k, v in g.items() if k not in LIST_KEYS}
        task_cells = [Cell(t, size, mech, layers, seed, opts, rank) for rank, seed in enumerate(g["seeds"])
                      for size in g["sizes"] for layers in g["layers"] for mech in g["mechanisms"]]
        if opts.get("by_depth"):  # stable: seed, size, mechanism order kept inside each depth
            task_cells.sort(key=lambda c: g["layers"].index(c.layers))
        if opts.get("by_depth") and opts.get("by_length"):  # stable: seed, mechanism order inside each length
            task_cells.sort(key=lambda c: (g["layers"].index(c.layers), sorted(g["sizes"]).index(c.size)))
        cells += task_cells
    if args.only:
        rx = re.compile(args.only)
        cells = [c for c in cells if rx.search(c.id)]
    return cells


def check_device(cells, device):
    """The CUDA op takes head dimensions 64 and 128 only: refuse a PaTH cell that would fail on its first step."""
    if device != "cuda":
        return
    for c in cells:
        d = c.opts["width"] // c.opts["heads"]
        if c.mechanism.startswith("path") and d not in (64, 128):
            raise SystemExit(f"cell {c.id}: head dimension width / heads = {d}; the CUDA op takes D = 64 or 128 "
                             f"(--set {c.task}.width=... / {c.task}.heads=...)")


# ---- cell state ----

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def recorded_args(rec):
    """A cell.json's training options without --ckpt-every: how often a run checkpoints does not change its results
    (a resumed run continues the same curve bit for bit), so it is the call's choice (run --ckpt-every), not part of
    the cell; records written before that hold it."""
    args = list(rec.get("args") or [])
    if "--ckpt-every" in args:
        i = args.index("--ckpt-every")
        del args[i:i + 2]
    return args


def cell_state(cell, dirs):
    """(state, folder, metrics) of a cell among the folders that may hold it (the first that has it finished, else
    the first that has it at all). state: finished | started | new. A folder whose cell.json records other options
    is an error: its results would be mixed with this grid's."""
    found = None
    for d in dirs:
        folder = os.path.join(d, cell.id)
        rec = read_json(os.path.join(folder, "cell.json"))
        if rec is None:
            continue
        if recorded_args(rec) != cell.train_args():
            raise SystemExit(f"{folder}: recorded with other options than this grid's:\n  recorded {rec.get('args')}\n"
                             f"  this grid {cell.train_args()}\nmove it away, or run this grid with another --runs")
        metrics = read_json(os.path.join(folder, "metrics.json"))
        if metrics and metrics.get("finished"):
            return "finished", folder, metrics
        if found is None:
            found = ("started", folder, metrics)
    return found or ("new", None, None)


# ---- rules ----

def solved(row):
    """True / False for a finished cell (a summary row or its dict), None when it has no final result."""
    if str(row.get("finished")) not in ("1", "True", "true"):
        return None
    key = "seq_accuracy" if row["task"] == "a5" else "accuracy"
    value = row.get(key)
    if value in (None, ""):
        return None
    return float(value) >= SOLVED_THRESHOLD


# Tasks whose sizes are monotone in difficulty (module docstring): A5's length.
MONOTONE_IN_SIZE = ("a5",)


def group_verdicts(rows, monotone=MONOTONE_IN_SIZE):
    """{(task, size, mechanism, layers): dict(solved, failed, pending, seeds, verdict)} over the summary's rows (every
    planned seed of a group has a row). verdict: solved (a majority of the seeds solved), unsolved (a majority can
    no longer be reached), pending. For a task in monotone, a pending group whose shorter size at the same depth is
    unsolved is unsolved too, with implied_by = that shorter size (its own seeds had no majority either way)."""
    groups = {}
    for r in rows:
        key = (r["task"], int(r["size"]), r["mechanism"], int(r["layers"]))
        g = groups.setdefault(key, dict(solved=0, failed=0, pending=0, seeds=0))
        g["seeds"] += 1
        s = solved(r)
        g["pending" if s is None else ("solved" if s else "failed")] += 1
    for g in groups.values():
        majority = g["seeds"] // 2 + 1
        if g["solved"] >= majority:
            g["verdict"] = "solved"
        elif g["seeds"] - g["failed"] < majority:
            g["verdict"] = "unsolved"
        else:
            g["verdict"] = "pending"
    for key in sorted(groups, key=lambda k: (k[0], k[2], k[3], k[1])):  # ascending sizes: implications chain
        task, size, mech, layers = key
        g = groups[key]
        if task not in monotone or g["verdict"] != "pending":
            continue
        shorter = [n for (t, n, m, l), h in groups.items()
                   if (t, m, l) == (task, mech, layers) and n < size and h["verdict"] == "unsolved"]
        if shorter:
            g["verdict"], g["implied_by"] = "unsolved", max(shorter)
    return groups


def min_layers(verdicts, task, size, mechanism):
    """The fewest layers that solve (task, size) for the mechanism: an int; math.inf when no planned depth does;
    None when undetermined (a depth below the first solved one, or every depth, is still pending)."""
    depths = sorted(l for (t, s, m, l) in verdicts if (t, s, m) == (task, size, mechanism))
    for l in depths:
        v = verdicts[(task, size, mechanism, l)]["verdict"]
        if v == "solved":
            return l
        if v == "pending":
            return None
    return math.inf if depths else None


def pruned_by(cell, verdicts):
    """The shallower depth whose group already solves the cell's (task, size, mechanism) by a majority of seeds, or
    None. Such a cell need not run when its task has by_depth: min_layers is then decided at that depth or below
    it, whatever the deeper depths give (it stops at the first solved depth)."""
    if not cell.opts.get("by_depth"):
        return None
    solved_depths = [l for (t, s, m, l), g in verdicts.items()
                     if (t, s, m) == (cell.task, cell.size, cell.mechanism) and l < cell.layers
                     and g["verdict"] == "solved"]
    return min(solved_depths) if solved_depths else None


def pruned_by_length(cell, verdicts):
    """The shorter length whose unsolved group at the cell's depth makes the cell's group unsolved (group_verdicts'
    implied_by), or None. Such a cell need not run when its task has by_length: its group's verdict, and so the
    fewest layers of its length, is already decided by that implication."""
    if not (cell.opts.get("by_depth") and cell.opts.get("by_length")):
        return None
    return verdicts.get(cell.group, {}).get("implied_by")


def lazy_seed_skip(cell, verdicts):
    """Whether a seed beyond base_seeds (Cell.lazy) need not run: its group is decided (solved or unsolved, by its
    own seeds or by a shorter length) without it. Its first base_seeds seeds always run (the spread over seeds);
    the later ones only settle a split."""
    return cell.lazy and verdicts.get(cell.group, {}).get("verdict") in ("solved", "unsolved")


def skip_reason(cell, verdicts):
    """Why a cell need not run (pruned_by, pruned_by_length, lazy_seed_skip), or None."""
    depth = pruned_by(cell, verdicts)
    if depth is not None:
        return f"depth {depth} solves it by a majority of seeds"
    shorter = pruned_by_length(cell, verdicts)
    if shorter is not None:
        return f"length {shorter} is unsolved at this depth"
    if lazy_seed_skip(cell, verdicts):
        return f"its group is decided by its first {cell.opts['base_seeds']} seeds"
    return None


def waits_for_base_seeds(cell, verdicts):
    """Whether a seed beyond base_seeds waits: fewer than base_seeds of its group have a result yet, so the group
    may still be decided without it."""
    if not cell.lazy:
        return False
    g = verdicts.get(cell.group, {})
    return g.get("solved", 0) + g.get("failed", 0) < cell.opts["base_seeds"]


def waits_for_shorter(cell, verdicts):
    """With by_length: whether a shorter length of the cell's depth and mechanism is still pending (its verdict may
    yet skip the cell). A shorter length that a shallower depth already solves does not count: its cells at this
    depth are skipped (pruned_by) and never decide anything, and by the depth-first reading (by_depth) it is solved
    here too, so it cannot make this cell unneeded. (Counting it made every cell of depth 3 wait behind length 5's
    skipped depth-3 group on 2026-12-06, and the sweep fell back to longer lengths at depth 2 whose shorter length
    was still running: 10 cells of ~300 s that length 10's verdict then made unneeded.)"""
    if not (cell.opts.get("by_depth") and cell.opts.get("by_length")):
        return False
    for (t, n, m, l), g in verdicts.items():
        if (t, m, l) != (cell.task, cell.mechanism, cell.layers) or n >= cell.size or g["verdict"] != "pending":
            continue
        solved_shallower = any((t2, n2, m2) == (t, n, m) and l2 < l and h["verdict"] == "solved"
                               for (t2, n2, m2, l2), h in verdicts.items())
        if not solved_shallower:
            return True
    return False


def next_cell(todo, verdicts):
    """The index in todo of the cell to start next: the first whose group's verdict is still pending and that waits
    neither for a shorter length (waits_for_shorter) nor for its group's first seeds (waits_for_base_seeds); else
    the first pending one that waits only for a shorter length; else the first cell of a decided group that is not a
    later seed; else the first pending one; else the first.
    A cell of a decided group (a majority of its seeds already solved it, or can no longer) cannot change a verdict
    or a fewest-layers entry; it still runs, for the seeds' spread, but after every cell that can (e.g. A5's third
    seeds at depth 2, lengths 15 and 20, where two seeds already failed, wait for depth 3's first seeds). A cell
    whose shorter length is pending may become unneeded when that length ends, so cells that cannot go first; a
    later seed (Cell.lazy) is unneeded unless its group's first seeds split, so it goes last of all."""
    pending = [i for i, c in enumerate(todo) if verdicts.get(c.group, {}).get("verdict") not in ("solved", "unsolved")]
    for i in pending:
        if not waits_for_shorter(todo[i], verdicts) and not waits_for_base_seeds(todo[i], verdicts):
            return i
    for i in pending:
        if not waits_for_base_seeds(todo[i], verdicts):
            return i
    for i, c in enumerate(todo):
        if not c.lazy:
            return i
    return pending[0] if pending else 0


NOT_NEEDED_WHY = "a shallower depth solves them, a shorter length is unsolved, or their group is decided without them"


def not_needed(cells, rows):
    """The ids of the unfinished cells that skip_reason makes unneeded, given the summary rows of the same cells."""
    verdicts = group_verdicts(rows)
    return {c.id for c, r in zip(cells, rows) if str(r["finished"]) != "1" and skip_reason(c, verdicts) is not None}


# ---- summary ----

SUMMARY_FIELDS = ["cell", "task", "size_name", "size", "mechanism", "layers", "seed", "width", "heads", "batch",
                  "steps", "steps_done", "finished", "stop_reason", "train_seconds", "sharing", "device", "precision",
                  "parameters", "tokens_seen", "eval_size", "accuracy", "seq_accuracy", "solved",
                  "in_dist_error", "in_dist_seq_error", "sparse_error", "sparse_seq_error", "dense_error",
                  "dense_seq_error", "folder"]


def summary_rows(cells, dirs):
    rows = []
    for c in cells:
        state, folder, m = cell_state(c, dirs)
        r = dict(cell=c.id, task=c.task, size_name=SIZE_NAME[c.task], size=c.size, mechanism=c.mechanism,
                 layers=c.layers, seed=c.seed, width=c.opts["width"], heads=c.opts["heads"], batch=c.opts["batch"],
                 steps=c.opts["steps"], steps_done=0, finished=0, stop_reason="", folder=folder or "")
        if folder:  # how many cells shared its device when it last ran (cell.json; not in older records)
            r["sharing"] = (read_json(os.path.join(folder, "cell.json")) or {}).get("sharing", "")
        if m:
            err, seq = m.get("error", {}), m.get("sequence_error", {})
            r.update(steps_done=m.get("steps_done", 0), finished=int(bool(m.get("finished"))),
                     stop_reason=m.get("stop_reason", ""), train_seconds=m.get("train_seconds", ""),
                     device=m.get("device", ""), precision=m.get("precision", ""),
                     parameters=m.get("parameters", ""), tokens_seen=m.get("tokens_seen", ""),
                     eval_size=c.opts["eval_size"])
            for s in ("in_dist", "sparse", "dense"):
                if err.get(s) is not None:
                    r[f"{s}_error"] = err[s]
                if seq.get(s) is not None:
                    r[f"{s}_seq_error"] = seq[s]
            if err.get("in_dist") is not None:
                r["accuracy"] = 1 - err["in_dist"]
            if seq.get("in_dist") is not None:
                r["seq_accuracy"] = 1 - seq["in_dist"]
        s = solved(r)
        r["solved"] = "" if s is None else int(s)
        rows.append(r)
    return rows


def write_summary(cells, dirs, out):
    rows = summary_rows(cells, dirs)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.10g}" if isinstance(v, float) else v)
                        for k, v in ((k, r.get(k, "")) for k in SUMMARY_FIELDS)})
    os.replace(tmp, out)
    return rows


def read_summary(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ---- cost model ----

def param_count(task_vocab, width, layers, heads, mechanism, mlp=0):
    """Parameters of model/transformer.cpp's model (the layer of docs/model.md), for the FLOP estimate."""
    E, H = width, heads
    M = mlp or ((8 * E // 3 + 7) // 8) * 8
    per = 4 * E * E + 3 * E * M + 2 * E  # q, k, v, o; SwiGLU; two RMSNorms
    if mechanism.startswith("path"):
        per += E * 32 + 32 * E + 3 * E + E * H  # w_proj (low rank), w_conv1d, bt_proj
    if mechanism in ("path-fox", "fox"):
        per += E * H  # g_proj
    return 2 * task_vocab * E + layers * per + E


def step_flops(vocab, width, layers, heads, mechanism, T, batch, mlp=0):
    """Training FLOPs of one step: 6 x parameters x tokens (the embedding lookup excluded) plus causal attention,
    6 T^2 E per layer and sequence (x 1.5 for PaTH's query step at D = 64, docs/perf/results.md)."""
    P = param_count(vocab, width, layers, heads, mechanism, mlp) - vocab * width
    attn = 6.0 * T * T * width * layers * batch * (1.5 if mechanism.startswith("path") else 1.0)
    return 6.0 * P * T * batch + attn


def gpu_rate():
    b = BENCH_SHAPE
    return step_flops(b["vocab"], b["width"], b["layers"], b["heads"], b["mechanism"], b["T"], b["batch"],
                      b["mlp"]) / BENCH_STEP_S


def shape_key(c):
    o = c.opts
    return (c.task, c.seq_len(), o["batch"], o["width"], o["heads"], c.layers)


def read_steps_csv(paths):
    """{(shape key, device, mechanism): ms} from measure's CSVs (mechanism 'data' for the host's batch draw)."""
    out = {}
    for p in paths or []:
        with open(p) as f:
            for r in csv.DictReader(f):
                key = (r["task"], int(r["T"]), int(r["batch"]), int(r["width"]), int(r["heads"]), int(r["layers"]))
                if r.get("step_ms"):
                    out[(key, r["device"], r["mechanism"])] = float(r["step_ms"])
    return out


def launch_floor_s(layers, args):
    """The assumed launch-bound floor of a step on the GPU: (base + per-layer kernels) x the cost of one launch."""
    return (args.kernels_base + args.kernels_per_layer * layers) * args.launch_us * 1e-6


def data_ms(table, c):
    """The host's batch draw (bench_step --data-task), measured at this T and batch on any device and layer count."""
    for (key, dev, mech), ms in table.items():
        if mech == "data" and key[:3] == shape_key(c)[:3]:
            return ms, dev
    return None, None


def estimate_cell(c, table, args):
    """Estimated GPU seconds of one cell if it runs all its steps (the worst case; early stopping shortens it), and
    the pieces: dict(step_s, source, flops_s, launch_s, data_s, cpu_ms, eval_s, total_s)."""
    o = c.opts
    flops = step_flops(c.vocab(), o["width"], c.layers, o["heads"], c.mechanism, c.seq_len(), o["batch"])
    flops_s, launch_s = flops / gpu_rate(), launch_floor_s(c.layers, args)
    d_ms, _ = data_ms(table, c)
    data_s = (d_ms or 0.0) / 1e3
    key = shape_key(c)
    gpu_ms = table.get((key, "cuda", c.mechanism))
    cpu_ms = table.get((key, "cpu", c.mechanism))
    if gpu_ms is not None:
        step_s, source = gpu_ms / 1e3 + data_s, "measured (cuda)"
    else:
        step_s = max(flops_s, launch_s) + data_s
        source = "launch-bound estimate" if launch_s >= flops_s else "FLOP estimate"
    evals = o["steps"] // o["eval_every"] + 1
    n_sets = 3 if c.task == "flipflop" else 1
    forwards = n_sets * math.ceil(o["eval_size"] / o["eval_batch"])
    # An evaluation forward: a third of a step's launches (no backward, no optimizer) and of its FLOPs per sequence.
    eval_s = evals * forwards * max(flops_s * o["eval_batch"] / o["batch"], launch_s) / 3
    total = o["steps"] * step_s + eval_s + args.startup_s
    return dict(step_s=step_s, source=source, flops=flops, flops_s=flops_s, launch_s=launch_s, data_s=data_s,
                cpu_ms=cpu_ms, eval_s=eval_s, total_s=total)


def cmd_plan(args):
    cells = make_grid(args)
    table = read_steps_csv(args.steps_csv)
    by_task = {}
    for c in cells:
        by_task.setdefault(c.task, []).append(c)
    print(f"# Plan: grid {args.grid}, {len(cells)} cells. GPU rate from the H200 step benchmark: "
          f"{gpu_rate() / 1e12:.0f} TFLOP/s (a 98M PaTH step at 8 x 4096 in {BENCH_STEP_S * 1e3:.0f} ms).")
    print(f"# Launch floor (assumed until `measure --device cuda` replaces it): ({args.kernels_base:.0f} + "
          f"{args.kernels_per_layer:.0f} x layers) kernels x {args.launch_us:g} us; {args.startup_s:g} s per process.")
    print("# These models are tiny: their GPU steps are launch-bound (the floor exceeds the FLOP time), so a CPU step")
    print("# time does not scale to the GPU by a FLOP ratio; it is shown as measured, beside the estimate.\n")
    grand = 0.0
    for task, cs in by_task.items():
        print(f"## {task}: {len(cs)} cells")
        print("| shape (T, batch, width, heads, layers) | mechanism | params | GFLOP/step | CPU step ms (measured) "
              "| data ms | GPU step ms | source | steps | GPU s per cell (all steps) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        seen, total = set(), 0.0
        for c in cs:
            e = estimate_cell(c, table, args)
            total += e["total_s"]
            k = (shape_key(c), c.mechanism)
            if k in seen:
                continue
            seen.add(k)
            o = c.opts
            cpu = f"{e['cpu_ms']:.1f}" if e["cpu_ms"] is not None else "-"
            d = data_ms(table, c)[0]
            print(f"| {c.seq_len()}, {o['batch']}, {o['width']}, {o['heads']}, {c.layers} | {c.mechanism} | "
                  f"{param_count(c.vocab(), o['width'], c.layers, o['heads'], c.mechanism) / 1e6:.2f}M | "
                  f"{e['flops'] / 1e9:.1f} | {cpu} | {'-' if d is None else f'{d:.2f}'} | "
                  f"{e['step_s'] * 1e3:.1f} | {e['source']} | {o['steps']} | {e['total_s']:.0f} |")
        print(f"\n{task}: {total:.0f} GPU-process seconds if every cell runs all its steps ({total / 3600:.2f} h)\n")
        grand += total
    slots = args.gpus * args.jobs_per_gpu
    eff, eff_src = args.efficiency, "an assumed"
    for (key, dev, mech), ms in table.items():
        if dev == "cuda" and mech.startswith("path@") and (key, dev, "path") in table:
            j = int(mech.split("@")[1])
            eff, eff_src = table[(key, dev, "path")] / ms, f"a measured ({j} processes on one GPU)"
    wall = grand / (slots * eff)
    print(f"Total: {grand:.0f} GPU-process seconds ({grand / 3600:.2f} h), worst case (no early stop).")
    print(f"On {args.gpus} GPU(s) x {args.jobs_per_gpu} processes each at {eff_src} {eff:.2f} efficiency per process "
          f"(processes share a GPU by time slicing): {wall:.0f} s wall, about {math.ceil(wall / args.budget)} "
          f"commands of {args.budget} s.")
    return 0


def built_program(args, name):
    """The model program `name` in the --build tree, or exit saying how to build it."""
    path = os.path.join(args.build, "model", name)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"--build: {path} not found (make -C {args.build} {name})")
    return path


# ---- measure ----

def cmd_measure(args):
    cells = make_grid(args)
    check_device(cells, args.device)
    bench = built_program(args, "bench_step")
    shapes = {}
    for c in cells:
        shapes.setdefault(shape_key(c), (c, set()))[1].add(c.mechanism)
    rows = []
    warm, steps = (1, 2) if args.device == "cpu" else (5, 20)
    data_done = set()
    for key, (c, mechs) in shapes.items():
        o = c.opts
        tmp = args.out + ".part.csv"
        cmd = [bench, "--device", args.device, "--mechanisms", ",".join(m for m in MECHANISMS if m in mechs),
               "--width", str(o["width"]), "--layers", str(c.layers), "--heads", str(o["heads"]),
               "--T", str(c.seq_len()), "--batch", str(o["batch"]), "--vocab", str(c.vocab()),
               "--warmup", str(warm), "--steps", str(steps), "--threads", str(args.threads), "--csv", tmp]
        if key[:3] not in data_done:
            cmd += ["--data-task", c.task]
            data_done.add(key[:3])
        t0 = time.time()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(f"{' '.join(cmd)}\n{r.stdout.strip()}\n({time.time() - t0:.0f} s)", flush=True)
        if r.returncode not in (0, 2):
            raise SystemExit(f"bench_step failed (rc {r.returncode})")
        with open(tmp) as f:
            for b in csv.DictReader(f):
                if not b["step_ms_median"]:
                    continue
                mech = "data" if b["mechanism"].startswith("data:") else b["mechanism"]
                rows.append(dict(task=key[0], T=key[1], batch=key[2], width=key[3], heads=key[4], layers=key[5],
                                 device=args.device, mechanism=mech, step_ms=b["step_ms_median"],
                                 params=b["params"], threads=args.threads))
        os.remove(tmp)
    if args.concurrent > 1 and rows:
        # J copies of one PaTH shape at once on one device: how much of a lone process's speed each keeps when cells
        # share a GPU (plan: the efficiency). The shape: the most common one of the most numerous task.
        counts = {}
        for c in cells:
            counts[shape_key(c)] = counts.get(shape_key(c), 0) + 1
        key = max(counts, key=counts.get)
        c = shapes[key][0]
        o = c.opts
        procs = []
        for j in range(args.concurrent):
            part = f"{args.out}.conc{j}.csv"
            cmd = [bench, "--device", args.device, "--mechanisms", "path", "--width", str(o["width"]),
                   "--layers", str(c.layers), "--heads", str(o["heads"]), "--T", str(c.seq_len()),
                   "--batch", str(o["batch"]), "--vocab", str(c.vocab()), "--warmup", str(warm),
                   "--steps", str(steps * 2), "--threads", str(args.threads), "--csv", part]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="0") if args.device == "cuda" else None
            procs.append((part, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)))
        ms = []
        for part, p in procs:
            p.wait()
            with open(part) as f:
                ms += [float(b["step_ms_median"]) for b in csv.DictReader(f) if b["step_ms_median"]]
            os.remove(part)
        if ms:
            rows.append(dict(task=key[0], T=key[1], batch=key[2], width=key[3], heads=key[4], layers=key[5],
                             device=args.device, mechanism=f"path@{args.concurrent}",
                             step_ms=sum(ms) / len(ms), params="", threads=args.threads))
            print(f"{args.concurrent} concurrent processes of shape {key}: {sum(ms) / len(ms):.2f} ms per step each",
                  flush=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["task"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


# ---- run ----

def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return max(1, len([l for l in out.stdout.splitlines() if l.startswith("GPU")]))
    except OSError:
        return 1


def copy_results(cell, folder, results):
    dest = os.path.join(results, cell.id)
    if os.path.abspath(dest) == os.path.abspath(folder):
        return  # --results is --runs: the files are there already
    os.makedirs(dest, exist_ok=True)
    for name in ("metrics.csv", "metrics.json", "train.log", "cell.json"):
        src = os.path.join(folder, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))
    for name in ("config.txt", "data.txt", "step.txt"):
        src = os.path.join(folder, "ckpt", name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))


def seconds_per_step(rows, task, layers, sharing=0):
    """The median train_seconds / steps_done of the finished cells of a task and depth (any length: the small
    models' steps are launch-bound, so a step costs about the same at every length), or None when none has run.
    With sharing (the cells that will share a device now) each cell's rate is scaled by sharing / the sharing it
    ran with (cell.json, recorded since the thirty-sixth session; a cell without it is taken as is): under MPS the
    GPU is saturated by 4 or more of these cells, so a cell's rate is about inverse to their number (a four-layer
    A5 cell: ~14 steps/s with 12 sharing an H100, 20-29 with 6, 32-48 with 4)."""
    def rate(r):
        then = int(r.get("sharing") or 0)
        scale = sharing / then if sharing > 0 and then > 0 else 1.0
        return float(r["train_seconds"]) / int(r["steps_done"]) * scale
    rates = sorted(rate(r) for r in rows
                   if r["task"] == task and int(r["layers"]) == layers and str(r["finished"]) == "1"
                   and r.get("train_seconds") not in (None, "") and int(r.get("steps_done") or 0) > 0)
    return rates[len(rates) // 2] if rates else None


def fits_before_the_end(cell, rows, seconds_left, sharing=0):
    """--drain: whether the cell's remaining steps at its depth's measured rate (seconds_per_step, scaled to this
    call's sharing) fit in seconds_left. A cell stopped by a call's end restarts from step 0 when the machine is
    released with its checkpoint, so in the session's last call a cell that cannot finish is GPU time taken from the
    cells that can (the GPU is shared, and at 12 cells under MPS it is saturated: 12 three-layer cells take ~420 s,
    4-6 take 150-210 s). The rate is the full schedule's (a cell that meets its stopping criterion ends sooner): a
    cell refused here might have finished, one started here will very likely finish. A depth with no finished cell
    yet takes the rate of the deepest shallower depth that has one, scaled by the ratio of depths (a step's launches
    grow with the layers; with 12 cells sharing an H100, 1 / 2 / 3 layers took ~140 / ~320 / ~420 s per 10000 steps,
    so the linear scale errs toward not starting: the twenty-ninth session's last call started eleven four-layer
    cells with no rate for their depth and all were cut off). With no rate at any depth, the cell starts."""
    rate = seconds_per_step(rows, cell.task, cell.layers, sharing)
    if rate is None:
        shallower = [(l, seconds_per_step(rows, cell.task, l, sharing)) for l in range(cell.layers - 1, 0, -1)]
        l, r = next(((l, r) for l, r in shallower if r is not None), (None, None))
        rate = r * cell.layers / l if r is not None else None
    if rate is None:
        return True
    row = next((r for r in rows if r["cell"] == cell.id), None)
    done = int(row.get("steps_done") or 0) if row else 0
    return (cell.opts["steps"] - done) * rate <= seconds_left


def cmd_run(args):
    cells = make_grid(args)
    check_device(cells, args.device)
    train = built_program(args, "pathattn_train")
    results = args.results or args.runs
    dirs = [args.runs] + (args.also_done or []) + ([results] if results != args.runs else [])
    os.makedirs(args.runs, exist_ok=True)
    os.makedirs(results, exist_ok=True)
    if args.device == "cuda":
        gpus = args.gpus or gpu_count()
        slots = gpus * args.jobs_per_gpu
    else:
        gpus, slots = 0, args.jobs
    sharing = slots // gpus if gpus else slots  # cells that share one device (a GPU, or the CPU's cores)
    threads = args.threads or max(1, min(4 if args.device == "cuda" else 64, (os.cpu_count() or 1) // slots))
    todo, finished = [], 0
    for c in cells:
        state, _, _ = cell_state(c, dirs)
        if state == "finished":
            finished += 1
        else:
            todo.append(c)
    summary = os.path.join(results, "summary.csv")
    rows = write_summary(cells, dirs, summary)
    verdicts = group_verdicts(rows)
    t0 = time.time()
    deadline = t0 + args.budget if args.budget > 0 else math.inf
    print(f"sweep: {len(cells)} cells, {finished} finished, {len(todo)} to run; {slots} at a time "
          f"({'%d GPU(s)' % gpus if gpus else 'cpu'}), {threads} threads each; budget "
          f"{'%g s' % args.budget if args.budget > 0 else 'none'}", flush=True)
    running = {}  # slot -> (cell, Popen, started, log)
    free = list(range(slots))
    done_here = pruned = 0
    drained = []  # --drain: cells left for the next session (they would not finish in this call)
    while todo or running:
        now = time.time()
        while free and todo and deadline - now >= args.min_start:
            c = todo.pop(next_cell(todo, verdicts))
            why = skip_reason(c, verdicts)
            if why is not None:
                pruned += 1
                print(f"[{now - t0:5.0f} s] {c.id}: skipped ({why})", flush=True)
                continue
            if args.drain and not fits_before_the_end(c, rows, deadline - now - args.margin, sharing):
                drained.append(c.id)
                continue
            slot = free.pop(0)
            folder = os.path.join(args.runs, c.id)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "cell.json"), "w") as f:
                json.dump(dict(c.record(), sharing=sharing), f, indent=1)
            ckpt_every = c.opts["eval_every"] if args.ckpt_every < 0 else args.ckpt_every
            cmd = [train] + c.train_args() + ["--out", folder, "--resume", "--device", args.device,
                                              "--threads", str(threads), "--ckpt-every", str(ckpt_every)]
            if deadline < math.inf:
                cmd += ["--time-limit", str(max(1, int(deadline - now - args.margin)))]
            if args.max_steps_per_call > 0:
                cmd += ["--stop-after", str(args.max_steps_per_call)]
            env = dict(os.environ)
            if args.device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = str(slot % gpus)
            log = open(os.path.join(folder, "train.log"), "a")
            log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            log.flush()
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[slot] = (c, p, time.time(), log)
        for slot, (c, p, started, log) in list(running.items()):
            rc = p.poll()
            if rc is None and time.time() > deadline + args.grace:
                p.kill()  # past the budget: the trainer did not stop at its --time-limit; resume from its checkpoint
                rc = p.wait()
            if rc is None:
                continue
            log.close()
            del running[slot]
            free.append(slot)
            folder = os.path.join(args.runs, c.id)
            m = read_json(os.path.join(folder, "metrics.json"))
            fresh = m is not None and os.path.getmtime(os.path.join(folder, "metrics.json")) >= started - 1
            if rc != 0:
                tail = open(os.path.join(folder, "train.log")).read().strip().splitlines()[-1:]
                what = f"failed (rc {rc}): {tail[0] if tail else ''}"
            elif fresh and m.get("finished"):
                err = m.get("sequence_error" if c.task == "a5" else "error", {}).get("in_dist")
                what = (f"finished ({m.get('stop_reason')}) at step {m.get('steps_done')}, "
                        f"{'sequence ' if c.task == 'a5' else ''}error {100 * err:.2f}%" if err is not None else
                        f"finished ({m.get('stop_reason')}) at step {m.get('steps_done')}")
                done_here += 1
            elif fresh:
                what = f"stopped at step {m.get('steps_done')} ({m.get('stop_reason')}); resume to continue"
            else:
                what = "killed before it wrote metrics.json; resumes from its last checkpoint"
            copy_results(c, folder, results)
            rows = write_summary(cells, dirs, summary)
            verdicts = group_verdicts(rows)
            print(f"[{time.time() - t0:5.0f} s] {c.id}: {what} ({time.time() - started:.0f} s)", flush=True)
        if not running and todo and deadline - time.time() < args.min_start:
            break
        time.sleep(args.poll)
    rows = write_summary(cells, dirs, summary)
    n_fin = sum(1 for r in rows if str(r["finished"]) == "1")
    n_pruned = len(not_needed(cells, rows))
    print(f"sweep: {done_here} finished in this call ({pruned} skipped), {n_fin} of {len(cells)} finished in all, "
          f"{n_pruned} not needed ({NOT_NEEDED_WHY}), "
          f"{len(cells) - n_fin - n_pruned} left; "
          f"{time.time() - t0:.0f} s; summary {summary}", flush=True)
    if drained:
        print(f"sweep: --drain left {len(drained)} cells unstarted (they would not finish in the budget at their "
              f"depth's measured rate): {' '.join(drained[:12])}{' ...' if len(drained) > 12 else ''}", flush=True)
    return 0


def cmd_summary(args):
    cells = make_grid(args)
    rows = write_summary(cells, [args.runs] + (args.also_done or []), args.out)
    print(f"wrote {args.out}: {len(rows)} cells, {sum(1 for r in rows if str(r['finished']) == '1')} finished")
    return 0


def cmd_status(args):
    cells = make_grid(args)
    rows = summary_rows(cells, [args.runs] + (args.also_done or []))
    unneeded = not_needed(cells, rows)
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = [r for r in rows if r["task"] == task]
        fin = sum(1 for r in rs if str(r["finished"]) == "1")
        skip = sum(1 for r in rs if r["cell"] in unneeded)
        started = sum(1 for r in rs if str(r["finished"]) != "1" and r["folder"] and r["cell"] not in unneeded)
        print(f"{task}: {fin} finished, {started} started, {len(rs) - fin - started - skip} not started"
              + (f", {skip} not needed ({NOT_NEEDED_WHY})" if skip else "")
              + f" (steps done {sum(int(r['steps_done'] or 0) for r in rs)} of {sum(int(r['steps']) for r in rs)})")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def grid_args(p):
        p.add_argument("--grid", default="paper", help="paper (the GPU sizes) | tiny (seconds on a CPU)")
        p.add_argument("--tasks", default="flipflop,mqrar,a5", help="comma list of a5, mqrar, flipflop (run order)")
        p.add_argument("--only", default="", help="only the cells whose id matches this regular expression")
        p.add_argument("--set", action="append", metavar="TASK.KEY=VALUE",
                       help="override a grid value, e.g. a5.steps=20000 or a5.sizes=5,10,15,20,25 (repeatable)")

    p = sub.add_parser("plan", help="cells, estimated GPU time per cell and in all")
    grid_args(p)
    p.add_argument("--steps-csv", action="append", help="step times from `measure` (cpu and/or cuda; repeatable)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--jobs-per-gpu", type=int, default=4)
    p.add_argument("--efficiency", type=float, default=0.5,
                   help="throughput of one of the processes sharing a GPU, relative to one alone (assumed)")
    p.add_argument("--budget", type=int, default=540, help="seconds of training per device command")
    p.add_argument("--launch-us", type=float, default=6.0, help="assumed cost of one kernel launch (us)")
    p.add_argument("--kernels-per-layer", type=float, default=300.0,
                   help="assumed kernels per layer and step (forward, backward, clipping, AdamW)")
    p.add_argument("--kernels-base", type=float, default=150.0, help="assumed kernels per step outside the layers")
    p.add_argument("--startup-s", type=float, default=8.0, help="assumed start-up seconds of a process on the GPU")

    p = sub.add_parser("measure", help="step times of each distinct cell shape (bench_step) into a CSV")
    grid_args(p)
    p.add_argument("--build", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrent", type=int, default=0,
                   help="also time this many copies of one PaTH shape at once on one device (the plan's efficiency)")
    p.add_argument("--out", required=True)

    p = sub.add_parser("run", help="run the unfinished cells within a budget (resumable)")
    grid_args(p)
    p.add_argument("--build", required=True, help="build folder holding model/pathattn_train")
    p.add_argument("--runs", required=True, help="one folder per cell: checkpoints, metrics, train.log")
    p.add_argument("--results", default="", help="where finished and stopped cells' metrics and summary.csv go "
                   "(without checkpoints; default: --runs)")
    p.add_argument("--also-done", action="append", help="folders of cells finished elsewhere (skipped, summarised)")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--gpus", type=int, default=0, help="GPUs to spread over (0: all that nvidia-smi lists)")
    p.add_argument("--jobs-per-gpu", type=int, default=4, help="concurrent cells per GPU (cuda)")
    p.add_argument("--jobs", type=int, default=1, help="concurrent cells (cpu)")
    p.add_argument("--threads", type=int, default=0, help="threads per cell (0: cores / concurrent cells, "
                   "at most 4 on cuda)")
    p.add_argument("--budget", type=float, default=0, help="seconds this call may take (0: no limit)")
    p.add_argument("--margin", type=float, default=25, help="seconds kept for a cell's last evaluation, "
                   "checkpoint and exit within the budget")
    p.add_argument("--min-start", type=float, default=45, help="no cell starts with less than this left")
    p.add_argument("--grace", type=float, default=15, help="seconds past the budget before a cell is killed")
    p.add_argument("--ckpt-every", type=int, default=-1,
                   help="steps between checkpoints (-1: the evaluation interval; 0: only when the run stops)")
    p.add_argument("--max-steps-per-call", type=int, default=0, help="--stop-after for every cell (0: none)")
    p.add_argument("--drain", action="store_true", help="the session's last call: start only cells whose remaining "
                   "steps fit in the budget at their depth's measured seconds per step (fits_before_the_end)")
    p.add_argument("--poll", type=float, default=0.5)

    p = sub.add_parser("summary", help="write the summary CSV")
    grid_args(p)
    p.add_argument("--runs", required=True)
    p.add_argument("--also-done", action="append")
    p.add_argument("--out", required=True)

    p = sub.add_parser("status", help="cells finished, started, not started, per task")
    grid_args(p)
    p.add_argument("--runs", required=True)
    p.add_argument("--also-done", action="append")

    args = ap.parse_args(argv)
    return {"plan": cmd_plan, "measure": cmd_measure, "run": cmd_run, "summary": cmd_summary,
            "status": cmd_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

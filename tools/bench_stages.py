#!/usr/bin/env python3
"""Per-call stage times from a `PATHATTN_CUDA_PROFILE=1 bench_fwd --bwd` log, as one line per table row.

A call under the workspace limit runs as several head slices, each printing its stages: this adds a call's slices
and prints, per shape, the median over calls of every stage of the forward and of the backward in each summation
mode (the bench runs the deterministic calls first, then the fast ones, the same number of each).

    python3 tools/bench_stages.py bench.log [more.log ...]
"""
import re
import statistics
import sys

CALL = re.compile(r"\[pathattn profile\] workspace (forward|backward):")
STAGE = re.compile(r"\[pathattn profile\] (\w+)\s+([0-9.]+) ms")
ROW = re.compile(r"^ +\d+ +\d+ +\d+ +\d+ ")


def medians(calls, keys):
    return " ".join("%s=%.2f" % (k, statistics.median(c.get(k, 0.0) for c in calls)) for k in keys)


def summarize(path):
    calls = []  # [kind, {stage: ms summed over the call's slices}]
    for line in open(path):
        m = CALL.match(line)
        if m:
            calls.append([m.group(1), {}])
            continue
        m = STAGE.match(line)
        if m and calls:
            stages = calls[-1][1]
            stages[m.group(1)] = stages.get(m.group(1), 0.0) + float(m.group(2))
            continue
        if ROW.match(line):
            fwd = [c for kind, c in calls if kind == "forward"]
            bwd = [c for kind, c in calls if kind == "backward"]
            half = len(bwd) // 2
            parts = []
            if fwd:  # "blocks": the two-level forward's block preprocess (PATHATTN_FWD_BLOCK), when it ran
                keys = ("prep", "blocks", "main") if any("blocks" in c for c in fwd) else ("prep", "main")
                parts.append("fwd " + medians(fwd, keys))
            # "bwd_blocks" and "bwd_bgrad": the two-level backward's block preprocess and gradient sweep
            # (PATHATTN_BWD_BLOCK), around bwd_main, when they ran
            keys = ("prep", "bwd_prep", "bwd_blocks", "bwd_main", "bwd_bgrad", "bwd_local") \
                if any("bwd_blocks" in c for c in bwd) else ("prep", "bwd_prep", "bwd_main", "bwd_local")
            if half:
                parts.append("bwd det " + medians(bwd[:half], keys))
                parts.append("bwd fast " + medians(bwd[half:], keys))
            print("B T H D = %s | %s" % (" ".join(line.split()[:4]), " | ".join(parts)))
            calls = []


for p in sys.argv[1:]:
    print("==", p)
    summarize(p)

#!/usr/bin/env python3
"""An idealised model of the deterministic turns' waits in the wgmma main backward kernels (docs/perf/notes.md,
fortieth session): how much of the deterministic mode's time over the fast mode the order of the adds can cost,
for a task list and a block size, without a GPU.

PAIRS (sequence, head) pairs of NC key chunks each; W resident CTAs take the tasks in list order (plan.cu: a pair's
chunks from the last; GROUP pairs interleaved rank by rank, as bwd_pair_group's 16384 / T clamped to 1..8). A task
follows cuda/bwd_blocks.h's levels: phase 1 one carry step per level (cost `carry` pair-steps), phase 2 from the
farthest level: a near level is one (key chunk, query chunk) pair, a far level `block` pairs; after each pair the
task adds to that query row's counter, after each level i > 0 to the step gradient of level i - 1 (cost 0.5). An add
waits until every contributor earlier in the list has added and its pass is visible; a pass becomes visible `delay`
pair-steps after the add (the kernels defer it to the warp's next step: about one step). Times are in pair-steps.
Left out: the fences' own stalls, L2, GQA, the two-chunk tasks of the D = 64 kernel, unequal step costs.

  tools/turns_model.py NC BLOCK WORKERS [DELAY [PAIRS GROUP]]
      e.g. 256 8 132 1 4 1   (T 16384, blocks of 8, D = 128's one CTA per SM, one pass delay, 4 pairs one by one)
           64 8 132 1 16 4   (T 4096: four pairs interleaved)
"""
import heapq
import itertools
import sys


def levels(c, last, block):
    """(unit, first query chunk, last query chunk) of each level of key chunk c's task, nearest first."""
    if block <= 0:
        return [(m, m, m) for m in range(c + 1, last + 1)]
    s = (c // block) * block
    e = min(s + block - 1, last)
    out = [(m, m, m) for m in range(c + 1, e + 1)]
    u = e + 1
    while u <= last:
        out.append((u, u, min(u + block - 1, last)))
        u += block
    return out


def simulate(order, last, block, workers, carry=0.3, waits=True, delay=0.0):
    """Makespan and summed wait of the task list `order` ((pair, chunk) tuples) on `workers` CTAs."""
    ops = {}
    for task in order:
        pair, c = task
        lv = levels(c, last, block)
        seq = [("work", carry * len(lv))]
        for i in range(len(lv) - 1, -1, -1):
            _, lo, hi = lv[i]
            for m in range(hi, lo - 1, -1):
                seq += [("work", 1.0), ("add", (pair, "q", m))]
            if i > 0:
                seq += [("work", 0.5), ("add", (pair, "step", lv[i - 1][0]))]
        ops[task] = seq
    contributors = {}
    for task in order:  # turn order = list order (a task waits only for tasks taken before it: no deadlock)
        for op in ops[task]:
            if op[0] == "add":
                contributors.setdefault(op[1], []).append(task)
    turn = {(k, task): i for k, ts in contributors.items() for i, task in enumerate(ts)}
    count = {k: 0 for k in contributors}
    blocked, events, tick = {}, [], itertools.count()
    nxt, end, waited = 0, 0.0, 0.0
    for w in range(workers):
        if nxt < len(order):
            heapq.heappush(events, (0.0, next(tick), w, order[nxt], 0))
            nxt += 1
    while events:
        t, _, w, task, k = heapq.heappop(events)
        if w < 0:  # a pass becomes visible: the counter moves on and its next waiter resumes
            count[task] += 1
            for bt, bw, bc, bk in blocked.pop((task, count[task]), []):
                waited += t - bt
                heapq.heappush(events, (t, next(tick), bw, bc, bk))
            continue
        seq = ops[task]
        if k < len(seq):
            kind, arg = seq[k]
            if kind == "work":
                heapq.heappush(events, (t + arg, next(tick), w, task, k + 1))
            elif waits and count[arg] != turn[(arg, task)]:
                blocked.setdefault((arg, turn[(arg, task)]), []).append((t, w, task, k))
            else:
                heapq.heappush(events, (t + (delay if waits else 0.0), next(tick), -1, arg, 0))
                heapq.heappush(events, (t, next(tick), w, task, k + 1))
            continue
        end = max(end, t)
        if nxt < len(order):
            heapq.heappush(events, (t, next(tick), w, order[nxt], 0))
            nxt += 1
    assert not blocked, "a wait that never ends"
    return end, waited


def task_list(nc, pairs, group):
    """plan.cu's backward list: groups of `group` pairs, inside a group rank by rank, each pair from its last chunk."""
    out = []
    for p0 in range(0, pairs, group):
        for r in range(nc):
            for p in range(p0, min(pairs, p0 + group)):
                out.append((p, nc - 1 - r))
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    nc, block, workers = (int(a) for a in sys.argv[1:4])
    delay = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    pairs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    group = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    order = task_list(nc, pairs, group)
    t, waited = simulate(order, nc - 1, block, workers, delay=delay)
    free, _ = simulate(order, nc - 1, block, workers, waits=False)
    print(f"NC {nc}, blocks of {block or 'none'}, {workers} CTAs, {pairs} pairs in groups of {group}, pass visible "
          f"{delay} pair-steps after its add: makespan {t:.1f} against {free:.1f} without waits "
          f"(+{100 * (t / free - 1):.1f}%), summed wait {waited:.1f}")


if __name__ == "__main__":
    main()

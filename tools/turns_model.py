#!/usr/bin/env python3
"""An idealised model of the deterministic turns' waits in the wgmma main backward kernels (docs/perf/notes.md,
fortieth session): how much of the deterministic mode's time over the fast mode the order of the adds can cost,
for a task list and a block size, without a GPU.

One (sequence, head) pair of NC key chunks; W resident CTAs take the tasks in list order (plan.cu: from the last
chunk). A task follows cuda/bwd_blocks.h's levels: phase 1 one carry step per level (cost A pair-steps), phase 2 from
the farthest level: a near level is one (key chunk, query chunk) pair, a far level `block` pairs; after each pair the
task adds to that query row's counter, after each level i > 0 to the step gradient of level i - 1 (cost 0.5). An add
waits until every contributor earlier in the list has added and its pass is visible; a pass becomes visible `delay`
pair-steps after the add (the kernels defer it to the warp's next step: about one step). Times are in pair-steps;
what the model leaves out: the fences' own stalls, L2, GQA, several pairs interleaved (pair_group), the two-chunk
tasks of the D = 64 kernel.

  tools/turns_model.py NC BLOCK WORKERS [DELAY]     e.g. 256 8 132 1  (8 x 16384, blocks of 8, D = 128's one CTA per SM)
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
    """Makespan and summed wait of the task list `order` (chunk indices) on `workers` CTAs."""
    ops = {}
    for c in order:
        lv = levels(c, last, block)
        seq = [("work", carry * len(lv))]
        for i in range(len(lv) - 1, -1, -1):
            _, lo, hi = lv[i]
            for m in range(hi, lo - 1, -1):
                seq += [("work", 1.0), ("add", ("q", m))]
            if i > 0:
                seq += [("work", 0.5), ("add", ("step", lv[i - 1][0]))]
        ops[c] = seq
    contributors = {}
    for c in order:  # turn order = list order (a task waits only for tasks taken before it: no deadlock)
        for op in ops[c]:
            if op[0] == "add":
                contributors.setdefault(op[1], []).append(c)
    turn = {(k, c): i for k, cs in contributors.items() for i, c in enumerate(cs)}
    count = {k: 0 for k in contributors}
    blocked, events, tick = {}, [], itertools.count()
    nxt, end, waited = 0, 0.0, 0.0
    for w in range(workers):
        if nxt < len(order):
            heapq.heappush(events, (0.0, next(tick), w, order[nxt], 0))
            nxt += 1
    while events:
        t, _, w, c, k = heapq.heappop(events)
        if w < 0:  # a pass becomes visible: the counter moves on and its next waiter resumes
            count[c] += 1
            for bt, bw, bc, bk in blocked.pop((c, count[c]), []):
                waited += t - bt
                heapq.heappush(events, (t, next(tick), bw, bc, bk))
            continue
        seq = ops[c]
        if k < len(seq):
            kind, arg = seq[k]
            if kind == "work":
                heapq.heappush(events, (t + arg, next(tick), w, c, k + 1))
            elif waits and count[arg] != turn[(arg, c)]:
                blocked.setdefault((arg, turn[(arg, c)]), []).append((t, w, c, k))
            else:
                heapq.heappush(events, (t + (delay if waits else 0.0), next(tick), -1, arg, 0))
                heapq.heappush(events, (t, next(tick), w, c, k + 1))
            continue
        end = max(end, t)
        if nxt < len(order):
            heapq.heappush(events, (t, next(tick), w, order[nxt], 0))
            nxt += 1
    assert not blocked, "a wait that never ends"
    return end, waited


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    nc, block, workers = (int(a) for a in sys.argv[1:4])
    delay = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    last = nc - 1
    order = list(range(last, -1, -1))
    t, waited = simulate(order, last, block, workers, delay=delay)
    free, _ = simulate(order, last, block, workers, waits=False)
    print(f"NC {nc}, blocks of {block or 'none'}, {workers} CTAs, pass visible {delay} pair-steps after its add: "
          f"makespan {t:.1f} against {free:.1f} without waits (+{100 * (t / free - 1):.1f}%), summed wait {waited:.1f}")


if __name__ == "__main__":
    main()

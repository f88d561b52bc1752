#!/usr/bin/env python3
"""Where a kernel's register spills sit, from its SASS (cuobjdump -sass -fun NAME BINARY): every local-memory access
(STL / LDL) with its address, how many barriers (BAR.SYNC) come before it, and whether it lies inside a loop (a
backward branch jumps over it), with the loop's size in instructions. ptxas -v gives only the byte counts; a spill
once per task around a rare step costs nothing, one inside a product's k loop costs every iteration
(docs/perf/notes.md v14, v15).

  cuobjdump -sass -fun NAME build-gpu/bench/cuda/bench_fwd | tools/sass_spills.py [--max 40]
"""
import argparse
import re
import sys

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def parse(lines):
    """[(address, opcode, operands)] in order."""
    out = []
    for line in lines:
        m = INSN.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    return out


def loops(insns):
    """(start, end) address ranges of backward branches: end = the branch, start = its target."""
    spans = []
    for addr, op, args in insns:
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", args)
            if t and int(t.group(1), 16) <= addr:
                spans.append((int(t.group(1), 16), addr))
    return spans


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=40, help="spill lines to list (all are counted)")
    args = ap.parse_args()
    insns = parse(sys.stdin)
    if not insns:
        print("sass_spills: no instructions read (wrong -fun name?)")
        return 1
    spans = loops(insns)
    bars = 0
    rows = []
    for i, (addr, op, a) in enumerate(insns):
        if op.startswith("BAR.SYNC") or op == "BAR":
            bars += 1
        if op.startswith("STL") or op.startswith("LDL"):
            inner = [(s, e) for s, e in spans if s <= addr <= e]
            size = min(((e - s) // 16 + 1 for s, e in inner), default=0)
            rows.append((addr, op, a, bars, len(inner), size))
    in_loop = [r for r in rows if r[4] > 0]
    print(f"sass_spills: {len(insns)} instructions, {sum(1 for r in rows if r[1].startswith('STL'))} STL and "
          f"{sum(1 for r in rows if r[1].startswith('LDL'))} LDL; {len(in_loop)} of them inside a loop; "
          f"{len(spans)} backward branches, {bars} barriers")
    for addr, op, a, nb, depth, size in rows[: args.max]:
        where = f"in {depth} loop(s), innermost {size} instructions" if depth else "straight-line"
        print(f"  {addr:06x} {op:<10} {a:<32} after barrier {nb:<4} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

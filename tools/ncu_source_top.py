#!/usr/bin/env python3
"""Where a kernel's warps wait, by instruction: reads Nsight Compute's source page as CSV (from
`ncu --import REP --page source --csv --print-source sass`) and prints the stall samples summed by opcode (LDG, LDS,
HMMA, BAR, ...) and by source line where the report has them (-lineinfo), then the most-sampled instructions.

    tools/ncu_source_top.py source.csv [--top N]

Columns are found by name fragments ("Source", "Address", "Warp Stall Sampling (All"), since their exact titles
differ between ncu versions; the header row is the first line that names a stall-sampling column.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="", errors="replace")))
    head = next((i for i, r in enumerate(rows) if any("Stall Sampling" in c for c in r)), None)
    if head is None:
        sys.exit(f"{a.csv}: no stall-sampling column (first lines: {rows[:3]})")
    cols = rows[head]
    find = lambda frag: next((i for i, c in enumerate(cols) if frag in c), None)  # noqa: E731
    c_src, c_addr = find("Source"), find("Address")
    c_all = find("Warp Stall Sampling (All")
    c_not = find("Warp Stall Sampling (Not")
    if c_src is None or c_all is None:
        sys.exit(f"{a.csv}: columns not found in {cols}")
    body = [r for r in rows[head + 1:] if len(r) > max(c_src, c_all)]
    total = sum(number(r[c_all]) for r in body) or 1.0
    by_op = defaultdict(float)
    for r in body:
        text = r[c_src].strip()
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", text)
        by_op[m.group(2) if m else text[:12]] += number(r[c_all])
    print(f"# stall samples by opcode ({int(total)} samples in all)")
    for op, s in sorted(by_op.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{op:>14} {100 * s / total:6.2f}%")
    print(f"\n# the {a.top} most-sampled instructions (% of all samples; not-issued %)")
    for r in sorted(body, key=lambda r: -number(r[c_all]))[:a.top]:
        nis = f"{100 * number(r[c_not]) / total:6.2f}" if c_not is not None else "     -"
        addr = r[c_addr] if c_addr is not None else ""
        print(f"{100 * number(r[c_all]) / total:6.2f} {nis}  {addr:>8}  {r[c_src].strip()[:90]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Whether a test_cuda_backward run printed the same errors as an earlier one (docs/perf/errors_bwd_<rev>.txt).

Each case prints its gradients' relative errors against f64 and the low-precision baseline to four digits; a change
that keeps the gradients' bits (a reordering of independent work, a buffer moved) prints the same numbers in every
deterministic case. Only the kernel's own numbers are compared (each line up to "baseline"): the baseline is the same
computation in low precision on the host CPU, whose last digit moved between the H100 and H200 machines' hosts with
the same binary (not the thread count: tests/recurrence.h sums in a fixed order; likely glibc's exp, whose variant
is picked by CPU features), so it is reported apart. The
fast mode's cases ("deterministic = false") add in atomic order and may differ run to run, so they are counted apart.
Prints one line: the cases compared, how many differ, and the first few that do.

    tools/same_errors.py errors_bwd.log docs/perf/errors_bwd_55b7279.txt
"""
import re
import sys


def cases(path):
    out, name = {}, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if re.match(r"^B[0-9]", line):
                name = line
                out[name] = []
            elif name is not None and re.match(r"^  d[a-z]+ +rel err", line):
                ours, _, base = line.partition("baseline")
                out[name].append((ours.rstrip(), base))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    now, ref = cases(sys.argv[1]), cases(sys.argv[2])
    common = [c for c in ref if c in now]
    differ = [c for c in common if [o for o, _ in now[c]] != [o for o, _ in ref[c]]]
    base_only = sum(1 for c in common if c not in differ and now[c] != ref[c])
    det = [c for c in differ if "deterministic = false" not in c]
    fast = len(differ) - len(det)
    tag = sys.argv[2].rsplit("_", 1)[-1].removesuffix(".txt")
    msg = (f"errors against {tag}: {len(common)} cases compared ({len(ref) - len(common)} missing), "
           f"{len(det)} deterministic cases differ, {fast} fast-mode cases differ "
           f"(and {base_only} in the host baseline alone)")
    if det:
        msg += "; first: " + ", ".join(det[:3])
    print(msg)


if __name__ == "__main__":
    main()

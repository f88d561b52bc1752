#!/usr/bin/env python3
"""Checks ptxas's reports of the CUDA kernels (kept per object by tools/nvcc_logged.sh) for serialised wgmma.

ptxas warns when it serialises a kernel's wgmma instructions (C7512: "insufficient register resources"; C7520:
"program dependence on compiler-inserted WG.AR in divergent path"): each wgmma then waits for the one before, which
cost the backward's main kernels 10-16% where it was measured (docs/perf/notes.md v11, v20). The warning is info
text in a build log nobody reads; this makes it a test. A kernel may stay serialised only if KNOWN names it, with
the reason.

  check_ptxas.py LOG_DIR        exit 1 if a kernel outside KNOWN is serialised, or if LOG_DIR lacks the reports
                                of the wgmma kernels (so that a build without them cannot pass silently)
  check_ptxas.py --self-test    the check on made-up reports: one it must pass, two it must fail
"""
import os
import re
import sys
import tempfile

SERIALISED = re.compile(r"\((C75\d\d)\)[^\n]*wgmma\.mma_async instructions are serialized[^\n]*function '([^']+)'")
ENTRY = re.compile(r"Compiling entry function '([^']+)'")

# Kernels allowed to stay serialised (mangled-name patterns), each with its reason.
KNOWN = {
    # The two-chunk backward kernel with the gate, deterministic, blocks and the bulk turns (opt-in at D = 64,
    # PATHATTN_BWD_TURNS=bulk): its row sums tip the register allocation wherever they are placed (notes.md "The
    # turns' tiles as bulk reductions").
    r"bwd_main_pair_kernelI(13__nv_bfloat16|6__half)Lb1ELb1ELb1ELb1E": "gated bulk block instance (opt-in)",
}
# Reports that must be there: the objects of the wgmma kernels, each with its kernels' entries.
REQUIRED = {
    "bwd_bf16_64.cu.o.log": "bwd_main_pair_kernel",
    "bwd_f16_64.cu.o.log": "bwd_main_pair_kernel",
    "bwd_bf16_128.cu.o.log": "bwd_main_wide_kernel",
    "bwd_f16_128.cu.o.log": "bwd_main_wide_kernel",
    "fwd.cu.o.log": "fwd_wgmma_kernel",
}


def check(log_dir):
    """Returns a list of problems (empty: the check passes)."""
    problems = []
    logs = {}
    if os.path.isdir(log_dir):
        for name in sorted(os.listdir(log_dir)):
            if name.endswith(".log"):
                with open(os.path.join(log_dir, name), errors="replace") as f:
                    logs[name] = f.read()
    for name, kernel in REQUIRED.items():
        entries = ENTRY.findall(logs.get(name, ""))
        if not any(kernel in e for e in entries):
            problems.append(f"{log_dir}/{name}: no ptxas report of {kernel} (not built, or built before the build "
                            f"kept reports: rebuild it, e.g. touch its source under src/cuda/launch)")
    for name, text in logs.items():
        for code, fn in sorted(set(SERIALISED.findall(text))):
            if not any(re.search(pat, fn) for pat in KNOWN):
                problems.append(f"{name}: ptxas serialised the wgmma of {fn} ({code})")
    return problems


def self_test():
    entry = "ptxas info    : Compiling entry function '_ZN8pathattn4cuda{k}' for 'sm_90a'\n"
    warn = ("ptxas info    : ({c}) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "insufficient register resources for the function '_ZN8pathattn4cuda{k}'\n")
    pair_det = "20bwd_main_pair_kernelI13__nv_bfloat16Lb0ELb1ELb0ELb0EEEv"
    pair_known = "20bwd_main_pair_kernelI6__halfLb1ELb1ELb1ELb1EEEv"
    clean = {name: entry.format(k=k) for name, k in REQUIRED.items()}
    cases = [
        ("clean reports", clean, True),
        ("a known serialised kernel", {**clean, "bwd_f16_64.cu.o.log": clean["bwd_f16_64.cu.o.log"] +
                                       warn.format(c="C7520", k=pair_known)}, True),
        ("a serialised det pair kernel", {**clean, "bwd_bf16_64.cu.o.log": clean["bwd_bf16_64.cu.o.log"] +
                                          warn.format(c="C7512", k=pair_det)}, False),
        ("a missing report", {k: v for k, v in clean.items() if k != "fwd.cu.o.log"}, False),
    ]
    ok = True
    for what, files, passes in cases:
        with tempfile.TemporaryDirectory() as d:
            for name, text in files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            got = not check(d)
        if got != passes:
            print(f"self-test: {what}: the check {'passed' if got else 'failed'}, expected the opposite")
            ok = False
    print("self-test:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    if argv[1] == "--self-test":
        return self_test()
    problems = check(argv[1])
    for p in problems:
        print(p)
    print(f"check_ptxas: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Baselines beside our CUDA forward at the same shapes: torch SDPA (flash backend, causal, bf16) and fla's Triton
PaTH forward (fla.ops.path_attn.parallel_path_attn), timed the same way as bench_fwd (CUDA events, warm-up,
median of many runs, inputs rotated between 3 sets). Reads bench_fwd's CSV and prints the side-by-side table.

    PYTHONPATH=third_party_fetched/fla python3 bench/cuda/baselines.py --ours ours.csv [--md table.md]

With bench_fwd --bwd's CSV (its bwd_ms column) a second table: forward+backward, ours as bench_fwd's forward plus its
deterministic backward (the default; timed apart, no autograd), SDPA's and fla's through torch autograd
(bench_train.py's closures, no gate), so that the backward is compared without building the torch extension.

fla is imported from a checkout on PYTHONPATH (never vendored). Its gate convention differs (it scales g); no
gate is used here, so that does not matter.
"""
import argparse
import csv
import sys

import torch
import torch.nn.functional as F

from bench_train import impl_fns, make_sets, time_ms  # one timing method and one f+b closure per implementation


def sdpa_ms(B, T, H, D, iters):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sets = [[torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(3)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
        return time_ms(lambda x: F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=True), sets, iters)


def fla_fn():
    from fla.ops.path_attn.parallel import parallel_path_attn
    return parallel_path_attn


def fla_ms(B, T, H, D, iters):
    fn = fla_fn()
    sets = []
    for _ in range(3):
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        w = F.normalize(torch.randn(B, T, H, D, device="cuda", dtype=torch.float32), dim=-1)
        beta = 2 * torch.sigmoid(torch.randn(B, T, H, device="cuda", dtype=torch.float32))
        sets.append((q, k, v, w, beta))
    with torch.no_grad():
        return time_ms(lambda x: fn(x[0], x[1], x[2], x[3], x[4], g=None), sets, iters)


def fb_ms(name, B, T, H, D, iters):
    """Forward+backward of SDPA or fla through torch autograd (bench_train.py's closures), no gate."""
    _, fb = impl_fns(name)
    return time_ms(fb, make_sets(B, T, H, D, gate=False), iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="CSV written by bench_fwd --csv")
    ap.add_argument("--md", help="also write the table as markdown here")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")
    fla_error = None
    if not args.no_fla:
        try:
            fla_fn()
        except Exception as e:  # report, keep the SDPA column
            fla_error = f"{type(e).__name__}: {e}"
            print("# fla unavailable:", fla_error)
    rows, fb_rows = [], []
    with open(args.ours) as f:
        for r in csv.DictReader(f):
            B, T, H, D = (int(r[k]) for k in ("B", "T", "H", "D"))
            ours = float(r["ms"])
            sd = sdpa_ms(B, T, H, D, args.iters)
            fl = None
            use_fla = not args.no_fla and fla_error is None
            if use_fla:
                try:
                    fl = fla_ms(B, T, H, D, max(5, args.iters // 2))
                except Exception as e:
                    print(f"# fla failed at {B}x{T} H={H} D={D}: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
            rows.append((B, T, H, D, ours, float(r["tflops_fa"]), sd, fl))
            if r.get("bwd_ms"):
                sd_fb = fb_ms("sdpa", B, T, H, D, args.iters)
                fl_fb = None
                if use_fla:
                    try:
                        fl_fb = fb_ms("fla", B, T, H, D, max(5, args.iters // 2))
                    except Exception as e:
                        print(f"# fla f+b failed at {B}x{T} H={H} D={D}: {type(e).__name__}: {e}")
                torch.cuda.empty_cache()
                fb_rows.append((B, T, H, D, ours + float(r["bwd_ms"]), ours + float(r["bwd_fast_ms"]), sd_fb, fl_fb))
            print(f"#  done {B}x{T} H={H} D={D}", flush=True)
    head = "| B x T | H | D | ours ms | ours TFLOP/s (FA count) | SDPA flash ms | ours / SDPA | fla PaTH ms | fla / ours |"
    sep = "|---|---|---|---|---|---|---|---|---|"
    lines = [head, sep]
    for B, T, H, D, ours, tf, sd, fl in rows:
        fls = f"{fl:.3f}" if fl is not None else "-"
        flr = f"{fl / ours:.2f}x" if fl is not None else "-"
        lines.append(f"| {B} x {T} | {H} | {D} | {ours:.3f} | {tf:.0f} | {sd:.3f} | {ours / sd:.2f}x | {fls} | {flr} |")
    if fb_rows:
        lines += ["", "| B x T | H | D | ours f+b ms (det) | ours f+b ms (fast) | SDPA flash f+b ms | ours / SDPA (det) "
                  "| fla PaTH f+b ms | fla / ours (det) |", "|---|---|---|---|---|---|---|---|---|"]
        for B, T, H, D, det, fast, sd, fl in fb_rows:
            fls = f"{fl:.3f}" if fl is not None else "-"
            flr = f"{fl / det:.2f}x" if fl is not None else "-"
            lines.append(f"| {B} x {T} | {H} | {D} | {det:.3f} | {fast:.3f} | {sd:.3f} | {det / sd:.2f}x | {fls} | {flr} |")
    print("\n".join(lines))
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

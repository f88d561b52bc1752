"""The layer's w path on the GPU: pathattn.short_conv_w (fused, docs/math.md Eq. 44-46) beside the torch composition
it replaced in PaTHAttention (fla's ShortConvolution as the layer's: K shifted products in u's dtype + SiLU, then
.float() and F.normalize), forward and forward+backward, with the bytes the fused op must move and its rate against
a device copy measured in the same run (the bandwidth ceiling).

    PATHATTN_LIBRARY=... PYTHONPATH=python python3 bench/cuda/bench_short_conv.py [--shapes B,T,H,D ...] [--md FILE]
"""
import argparse

import torch
import torch.nn.functional as F

import pathattn
from pathattn.layer import ShortConvolution
from bench_decode import time_us  # the sibling script's timer (this folder is on sys.path)


def timed(fn, iters):
    """Median ms of fn over iters CUDA-event timings (bench_decode.py's timer)."""
    return time_us(fn, iters, warmup=3) / 1e3


def copy_bandwidth():
    """GB/s of a 1 GiB device-to-device copy (read + write counted), the ceiling for an element-wise pass."""
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), 10)
    return 2 * x.numel() * 4 / ms / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8,4096,12,64", "32,4096,32,64", "16,4096,16,128"])
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    ceiling = copy_bandwidth()
    rows = [f"copy ceiling (1 GiB f32 copy, read + write): {ceiling:.0f} GB/s on {torch.cuda.get_device_name()}", "",
            "| B x T | H x D | K | fused fwd ms | torch fwd ms | fused f+b ms | torch f+b ms | torch / fused (f+b) "
            "| fused f+b GB/s (% of copy) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in a.shapes:
        B, T, H, D = (int(x) for x in s.split(","))
        C = H * D
        conv = ShortConvolution(C, a.K).cuda().to(torch.bfloat16)
        u = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dw = torch.randn(B, T, H, D, device="cuda")

        def fused():
            return pathattn.short_conv_w(u, conv.weight, D)

        def composed():
            return F.normalize(conv(u).float().view(B, T, H, D), p=2.0, dim=-1)

        def fb(f):
            def run():
                u.grad = None
                conv.weight.grad = None
                f().backward(dw)
            return run

        with torch.no_grad():
            t_ff, t_cf = timed(fused, a.iters), timed(composed, a.iters)
        t_fb, t_cb = timed(fb(fused), a.iters), timed(fb(composed), a.iters)
        # Bytes the fused op must move: forward reads u (bf16) and writes w (f32); backward reads u and dw, writes du.
        n = B * T * C
        bytes_fb = n * (2 + 4) + n * (2 + 4 + 2)
        gbs = bytes_fb / t_fb / 1e6
        rows.append(f"| {B} x {T} | {H} x {D} | {a.K} | {t_ff:.3f} | {t_cf:.3f} | {t_fb:.3f} | {t_cb:.3f} | "
                    f"{t_cb / t_fb:.1f}x | {gbs:.0f} ({100 * gbs / ceiling:.0f}%) |")
    print("\n".join(rows))
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

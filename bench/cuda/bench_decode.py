"""Decode-step benchmark: our CUDA decode (torch.ops.pathattn.decode on a device cache) beside fla's PaTH decode
path and torch SDPA decoding one query on a cache of the same length, in one run; bf16 q/k/v, one new token per
sequence, no gate.

* ours: pathattn's op on an f32 cache k, v [B, Tmax, H, D] with int32 lengths on the device: one pass that
  carries every cached key through the new token's H_t in place, attends, and appends (docs/cuda.md, "Decode").
  Bytes it must move: B L H D x 12 (k read + written, v read, f32).
* ours bf16: the same op on a bf16 cache (k rounded at every carry: bench/cuda/decode_drift.py measures what
  that costs in accuracy; v exact): B L H D x 6 bytes.
* ours ckpt: the same op on the checkpointed bf16 cache with period 64 (docs/spec.md §4, docs/cuda.md "Decode"):
  old rows read with the carried-back query, not rewritten, all carried once every 64 tokens: B L H D x (4 + 4 / 64)
  bytes per step on average. Its time is the mean over 128 consecutive steps (two refreshes), not a median, so that
  the refresh counts.
* fla: what fla's PaTHAttention layer does per decoding step (fla/layers/path_attn.py at bc3b101): the rank-one
  update k - beta (k . w) w of the whole bf16 cache as one torch.compile'd elementwise function (as fla compiles
  it), torch.cat of the cache with the new key and value (a new copy of both every step), then fla's
  attn_decoding_one_step (Triton) on the packed result. The layer's unpad gather is left out (kinder to fla).
* SDPA: torch.nn.functional.scaled_dot_product_attention of one query over bf16 k, v [B, H, L, D] (GQA), plain
  softmax attention: the floor a PaTH decode step is compared with (it reads the cache once and writes nothing).

Timing: CUDA events around each step, 5 warm-ups, median of --iters. Our cache grows by one token per step (Tmax
leaves room); fla and SDPA attend a cache of length L each step.

On the GPU machine (after `tools/gpu_check.sh torch` has built build-gpu-torch):

    export PATHATTN_LIBRARY=$(find build-gpu-torch -name libpathattn_torch.so | head -1)
    PYTHONPATH=python:third_party_fetched/fla python3 bench/cuda/bench_decode.py [--md decode.md]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

COPY_TBPS = 4.3  # measured copy bandwidth of the H200 (docs/perf/results.md)


def time_us(step, iters, warmup=5):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def new_token(B, H, HQ, D, gen):
    dev = "cuda"
    q = torch.randn(B, 1, HQ, D, device=dev, generator=gen).to(torch.bfloat16)
    k = torch.randn(B, 1, H, D, device=dev, generator=gen).to(torch.bfloat16)
    v = torch.randn(B, 1, H, D, device=dev, generator=gen).to(torch.bfloat16)
    w = F.normalize(torch.randn(B, 1, H, D, device=dev, generator=gen), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, 1, H, device=dev, generator=gen))
    return q, k, v, w, beta


def ours_cache(B, L, H, D, Tmax, gen, dtype):
    """A cache k, v [B, Tmax, H, D] of L tokens per sequence (unit-norm keys) and its lengths, on the device."""
    ck = torch.randn(B, Tmax, H, D, device="cuda", generator=gen)
    ck = (ck / ck.norm(dim=-1, keepdim=True)).to(dtype)
    cv = torch.randn(B, Tmax, H, D, device="cuda", generator=gen).to(dtype)
    return ck, cv, torch.full((B,), L, dtype=torch.int32, device="cuda")


def bench_ours(B, L, H, HQ, D, iters, gen, cache_dtype=torch.float32):
    import pathattn  # noqa: F401  (registers torch.ops.pathattn)

    ck, cv, lengths = ours_cache(B, L, H, D, L + iters + 8, gen, cache_dtype)
    q, k, v, w, beta = new_token(B, H, HQ, D, gen)
    step = lambda: torch.ops.pathattn.decode(q, k, v, w, beta, None, None, ck, cv, None, lengths)  # noqa: E731
    us = time_us(step, iters)
    o, _ = step()
    assert torch.isfinite(o).all(), "ours: non-finite output"
    return us


def bench_ours_bf16(B, L, H, HQ, D, iters, gen):
    return bench_ours(B, L, H, HQ, D, iters, gen, torch.bfloat16)


def bench_ours_ckpt(B, L, H, HQ, D, iters, gen, period=64):
    """The checkpointed bf16 cache: the mean step over 2 periods (after 5 warm-up steps), refreshes included."""
    import pathattn  # noqa: F401

    steps = 2 * period
    ck, cv, lengths = ours_cache(B, L, H, D, L + steps + 16, gen, torch.bfloat16)
    ckpt = lengths.clone()  # nothing pending: the prefill's state
    carry = torch.eye(D, device="cuda").expand(B, H, D, D).contiguous()
    q, k, v, w, beta = new_token(B, H, HQ, D, gen)
    cache = (ck, cv, None, lengths, ckpt, carry, period)
    step = lambda: torch.ops.pathattn.decode(q, k, v, w, beta, None, None, *cache)  # noqa: E731
    for _ in range(5):
        step()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        step()
    b.record()
    b.synchronize()
    o, _ = step()
    assert torch.isfinite(o).all(), "ours ckpt: non-finite output"
    return a.elapsed_time(b) * 1e3 / steps


def bench_fla(B, L, H, HQ, D, iters, gen):
    from fla.ops.attn.decoding import attn_decoding_one_step

    @torch.compile(dynamic=True)
    def carry(kc, w, beta):  # the rank-one update of every cached key, in f32, back to the cache's dtype
        kf = kc.float()
        return (kf - beta[..., None] * (kf * w).sum(-1, keepdim=True) * w).to(kc.dtype)

    past_k = torch.randn(B, L, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    past_v = torch.randn(B, L, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    q, k, v, w, beta = new_token(B, H, HQ, D, gen)
    cu = torch.arange(0, B + 1, device="cuda", dtype=torch.long) * (L + 1)

    def step():
        kc = torch.cat([carry(past_k, w, beta), k], dim=1)
        vc = torch.cat([past_v, v], dim=1)
        return attn_decoding_one_step(q.view(1, B, HQ, D), kc.view(1, B * (L + 1), H, D), vc.view(1, B * (L + 1), H, D),
                                      None, cu_seqlens=cu, do_gate_scale=True)

    return time_us(step, iters)


def bench_sdpa(B, L, H, HQ, D, iters, gen):
    k = torch.randn(B, H, L, D, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(B, H, L, D, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(B, HQ, 1, D, device="cuda", generator=gen).to(torch.bfloat16)
    return time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=(HQ != H)), iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--B", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--L", type=int, nargs="+", default=[4096, 16384, 32768, 131072])
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--HQ", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--max-gb", type=float, default=60.0, help="skip shapes whose caches would need more")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip the remaining shapes after this long")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--md", help="also write the table as markdown here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA device")
    have_fla = not args.no_fla
    if have_fla:
        try:
            import fla.ops.attn.decoding  # noqa: F401
        except Exception as e:  # noqa: BLE001
            print(f"# fla not importable ({e}): its column is left out")
            have_fla = False

    head = ["D", "B", "L", "ours us", "ours TB/s", "% of copy", "bf16 us", "bf16 %", "ckpt us", "ckpt %", "fla us",
            "SDPA us", "fla / ours", "ours / SDPA", "bf16 / SDPA", "ckpt / SDPA"]
    rows, t0 = [], time.time()
    print(f"# bench_decode.py on {torch.cuda.get_device_name()}, torch {torch.__version__}; H = {args.H}, "
          f"HQ = {args.HQ}, bf16 q/k/v, ours f32 cache (bf16: k and v bf16; ckpt: bf16, checkpointed, period 64), "
          f"fla and SDPA bf16 caches; median of {args.iters} steps (ckpt: mean of 128)")
    print("  ".join(f"{h:>10}" for h in head))
    for D in args.D:
        for L in args.L:
            for B in args.B:
                gb = B * L * args.H * D * (2 * 4 + 3 * 2 * 2) / 1e9  # ours f32 k, v; fla bf16 k, v and their copies
                if gb > args.max_gb or time.time() - t0 > args.budget_s:
                    print(f"  D {D} B {B} L {L}: skipped ({'memory' if gb > args.max_gb else 'time budget'})")
                    continue
                gen = torch.Generator(device="cuda").manual_seed(0)
                cells = {}
                for name, fn in (("ours", bench_ours), ("bf16", bench_ours_bf16), ("ckpt", bench_ours_ckpt),
                                 ("fla", bench_fla), ("sdpa", bench_sdpa)):
                    if name == "fla" and not have_fla:
                        cells[name] = None
                        continue
                    try:
                        cells[name] = fn(B, L, args.H, args.HQ, D, args.iters, gen)
                    except Exception as e:  # noqa: BLE001  (one failed cell must not end the table)
                        print(f"  {name} D {D} B {B} L {L}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                        cells[name] = None
                    torch.cuda.empty_cache()
                ours, b16, ckp = cells["ours"], cells["bf16"], cells["ckpt"]
                fla_us, sdpa = cells["fla"], cells["sdpa"]
                tbps = B * L * args.H * D * 12 / (ours * 1e-6) / 1e12 if ours else None
                tb16 = B * L * args.H * D * 6 / (b16 * 1e-6) / 1e12 if b16 else None
                tckp = B * L * args.H * D * (4 + 4 / 64) / (ckp * 1e-6) / 1e12 if ckp else None
                f = lambda x, p=1: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
                ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}x"  # noqa: E731
                row = [str(D), str(B), str(L), f(ours), f(tbps, 2), f(tbps and 100 * tbps / COPY_TBPS, 0), f(b16),
                       f(tb16 and 100 * tb16 / COPY_TBPS, 0), f(ckp), f(tckp and 100 * tckp / COPY_TBPS, 0),
                       f(fla_us), f(sdpa), ratio(fla_us, ours), ratio(ours, sdpa), ratio(b16, sdpa), ratio(ckp, sdpa)]
                rows.append(row)
                print("  ".join(f"{c:>10}" for c in row), flush=True)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
            for r in rows:
                fh.write("| " + " | ".join(r) + " |\n")


if __name__ == "__main__":
    main()

"""Training-step benchmark: forward, forward+backward and peak extra memory of forward+backward, our PaTH
attention (pathattn.path_attention on CUDA) beside torch SDPA (flash backend) and fla's Triton PaTH
(fla.ops.path_attn.parallel.parallel_path_attn), all in one run, at bf16, causal.

Shapes (B x T at (H, D)): H = 32, D = 64 at 32 x 1024, 32 x 4096, 8 x 16384; H = 16, D = 128 at 16 x 4096,
4 x 16384; each without and with the forget gate (g = logsigmoid(N(0, 1)), [B, T, HQ] f32). HQ = H. q, k, v, do
bf16; w f32 unit-norm; beta = 2 sigmoid(N(0, 1)) f32.

Timing as bench_fwd / baselines.py: 3 warm-ups, CUDA events around each call, median of --iters (fla: median of
max(5, iters / 2)), inputs rotated among 3 sets. forward: one call under torch.no_grad(). forward+backward: one
forward with autograd and torch.autograd.grad(o, inputs, do) with a fixed random do; the inputs with gradients are
q, k, v, w, beta, g (SDPA: q, k, v). Peak memory: one more forward+backward after the timings,
max_memory_allocated() minus memory_allocated() before it (inputs and do already allocated), in GB (1e9 bytes);
our workspace goes through torch's caching allocator, so it is counted.

SDPA has no gate: its cells in the gated rows are its plain numbers (the same measurement as the plain row).
fla's gate convention differs from ours: fla computes softmax(scale (q.k + G_i - G_j)), we compute
softmax(scale q.k + G_i - G_j) (g is not multiplied by scale), so fla is given g / scale (a separate leaf made
before timing): both compute the same function.

FLOP counts (flop_counts below) and % of 790 TFLOP/s (the bf16 dense peak measured on this H200 model) are printed
for ours (PaTH count) and SDPA (FlashAttention count); the header prints the formulas. Each (shape, implementation)
cell is in its own try/except: an out-of-memory is reported as 'OOM', any other failure as 'error' (the message is
printed as a note), and memory is freed before the next one. After --budget-s seconds (default 300) the remaining
cells are skipped ('skip').

--check: at B = 2, T = 512, H = 4, D = 64 with the gate, o and every gradient of ours (CUDA, bf16) and fla's (gate
matched) against a float64 CPU evaluation through pathattn.path_attention (the CPU reference path takes f64 for every
input), and ours against fla: relative Frobenius errors. Exit status 1 when one of ours is off by more than 5e-2
and by more than twice fla's error.

--dry-run: the shapes and FLOP counts only (no GPU, no pathattn library needed; runs on torch 1.13 CPU).

On the GPU machine (from the repository root, after `tools/gpu_check.sh torch` has built build-gpu-torch):

    export PYTHONUNBUFFERED=1 PATHATTN_LIBRARY=$(find build-gpu-torch -name libpathattn_torch.so | head -1)
    PYTHONPATH=python:third_party_fetched/fla python3 bench/cuda/bench_train.py --check
    PYTHONPATH=python:third_party_fetched/fla python3 bench/cuda/bench_train.py --md train.md --csv train.csv

Options: --shapes B,T,H,D [...] (a subset of the table above, or any other shape), --gate {both,off,on},
--iters N (default 20), --budget-s S (default 300), --no-fla, --no-sdpa, --fast (also ours with deterministic=False:
its f+b and ratios as three more columns), --md FILE, --csv FILE.
"""
import argparse
import csv
import gc
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PEAK_TFLOPS = 790.0  # bf16 dense, measured on this H200 model (docs/perf/notes.md)
CHUNK = 64  # C: the chunk size of our kernels (rows of one query / key chunk)
SHAPES = [  # (B, T, H, D), HQ = H, DV = D
    (32, 1024, 32, 64),
    (32, 4096, 32, 64),
    (8, 16384, 32, 64),
    (16, 4096, 16, 128),
    (4, 16384, 16, 128),
]
IMPLS = ("ours", "fast", "sdpa", "fla")  # fast: ours with deterministic=False (--fast)

FLOP_FORMULAS = """\
FLOP counts (C = 64 rows per chunk, N = T / C chunks, pairs = N (N - 1) / 2 (query chunk, earlier key chunk)
per sequence; the diagonal blocks count half, as FlashAttention's causal count does):
  SDPA fwd       = 4 B HQ T^2 D / 2                      (two GEMMs over half the square; D = DV)
  SDPA fwd+bwd   = 3.5 x fwd                             (FlashAttention's convention: bwd = 2.5 x fwd)
  PaTH fwd       = B [pairs HQ (2C^2 D [S = Q~ K^T] + 2C D^2 [Q~ E^T step, Eq. 32] + 2C^2 DV [P V])
                      + N HQ (2C^2 D + 2C^2 DV) / 2]      (~ SDPA fwd x (1 + D / 2C))
  PaTH bwd       = B [pairs (H 2C D^2 [phase-1 carry of K^]
                             + HQ (2C^2 D [S] + 2C^2 DV [dP] + 2C^2 DV [dV]
                                   + 2C^2 D [E += dS^T Q^] + 2C^2 D [dQ^ += dS K~])
                             + H (2C D^2 [dP chain] + 2C D^2 [E step]))
                      + N HQ (3 2C^2 D + 2 2C^2 DV) / 2]   (diagonal: the five C x C products, halved)
  PaTH fwd+bwd   = PaTH fwd + PaTH bwd
  TFLOP/s: ours by the PaTH count, SDPA by the FlashAttention count; % of {peak:.0f} TFLOP/s (bf16 dense peak)"""


def flop_counts(B, T, HQ, H, D, DV=None, C=CHUNK):
    """Counted FLOPs (multiply-add = 2) of one call, as a dict: sdpa_fwd, sdpa_fb, path_fwd, path_fb.

    SDPA (FlashAttention's convention): forward 2 GEMMs (Q K^T, P V) over the causal half of T x T; fwd+bwd is
    3.5x the forward (the backward's 5 GEMMs = 2.5x). PaTH (docs/math.md): per (query chunk, earlier key chunk)
    pair of C rows the forward does S = Q~ K^T (2 C^2 D), the query step Q~ E^T (2 C D^2, Eq. 32) and P V
    (2 C^2 DV) per query head; the diagonal chunk does S and P V over its causal half. The backward per pair:
    the phase-1 carry of the key chunk (2 C D^2 per kv head), per query head S recomputed, dP = dO V^T, dV += P^T dO,
    E += dS^T Q^, dQ^ += dS K~ (2 C^2 D or 2 C^2 DV each), and per kv head the chain back through the carry
    (dP: 2 C D^2, E step: 2 C D^2); the diagonal chunk does FlashAttention's five products over its causal half.
    The preprocess (UT transforms, O(T C D) per head) is not counted."""
    DV = D if DV is None else DV
    N = math.ceil(T / C)
    pairs = N * (N - 1) / 2
    sdpa_fwd = 2.0 * B * HQ * T * T * (D + DV) / 2  # = 4 B HQ T^2 D / 2 at DV = D
    path_fwd = B * (pairs * HQ * (2 * C * C * D + 2 * C * D * D + 2 * C * C * DV)
                    + N * HQ * (2 * C * C * D + 2 * C * C * DV) / 2)
    path_bwd = B * (pairs * (H * 2 * C * D * D
                             + HQ * (2 * C * C * D + 2 * C * C * DV + 2 * C * C * DV + 2 * C * C * D + 2 * C * C * D)
                             + H * (2 * C * D * D + 2 * C * D * D))
                    + N * HQ * (3 * 2 * C * C * D + 2 * 2 * C * C * DV) / 2)
    return {"sdpa_fwd": sdpa_fwd, "sdpa_fb": 3.5 * sdpa_fwd, "path_fwd": path_fwd, "path_fb": path_fwd + path_bwd}


# ---------------------------------------------------------------------------------------------------------------
# timing


def time_ms(fn, sets, iters, warmup=3):
    """Median of `iters` CUDA-event timings of fn(set), after `warmup` calls, rotating among the input sets."""
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    out = []
    for i in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(sets[i % len(sets)])
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1))
    return statistics.median(out)


def peak_gb(fn, x):
    """Peak memory above what is allocated before one call of fn(x), in GB (1e9 bytes)."""
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(x)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1e9


def free_memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


# ---------------------------------------------------------------------------------------------------------------
# inputs and the three implementations


def make_sets(B, T, H, D, gate, n_sets=3, seed=0):
    """n_sets input sets on CUDA: leaves with requires_grad (q, k, v, do bf16; w, beta, g f32), and g / scale for
    fla as a leaf of its own."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    scale = D ** -0.5
    sets = []
    for _ in range(n_sets):
        def rnd(*shape, dtype=torch.bfloat16):
            return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        x = {
            "q": rnd(B, T, H, D), "k": rnd(B, T, H, D), "v": rnd(B, T, H, D),
            "w": F.normalize(rnd(B, T, H, D, dtype=torch.float32), dim=-1),
            "beta": 2 * torch.sigmoid(rnd(B, T, H, dtype=torch.float32)),
            "g": F.logsigmoid(rnd(B, T, H, dtype=torch.float32)) if gate else None,
        }
        x["g_fla"] = x["g"] / scale if gate else None
        for n in ("q", "k", "v", "w", "beta", "g", "g_fla"):
            if x[n] is not None:
                x[n] = x[n].contiguous().requires_grad_(True)
        x["do"] = rnd(B, T, H, D)
        sets.append(x)
    return sets


def grad_inputs(x, names):
    return [x[n] for n in names if x[n] is not None]


def impl_fns(name):
    """(forward(x) -> o, forward_backward(x) -> grads) of one implementation."""
    if name in ("ours", "fast"):
        import pathattn

        det = name == "ours"  # fast: the CUDA backward's cross-block sums in any order (docs/cuda.md)

        def fwd(x):
            return pathattn.path_attention(x["q"], x["k"], x["v"], x["w"], x["beta"], x["g"], deterministic=det)

        names = ("q", "k", "v", "w", "beta", "g")
    elif name == "sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fwd(x):  # [B, T, H, D] -> [B, H, T, D] views; no gate (SDPA has none)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(x["q"].transpose(1, 2), x["k"].transpose(1, 2),
                                                   x["v"].transpose(1, 2), is_causal=True)
            return o.transpose(1, 2)

        names = ("q", "k", "v")
    elif name == "fla":
        from fla.ops.path_attn.parallel import parallel_path_attn

        def fwd(x):  # fla scales the gate: g / scale gives our function
            return parallel_path_attn(x["q"], x["k"], x["v"], x["w"], x["beta"], g=x["g_fla"])[0]

        names = ("q", "k", "v", "w", "beta", "g_fla")
    else:
        raise ValueError(name)

    def fwd_nograd(x):
        with torch.no_grad():
            return fwd(x)

    def fwd_bwd(x):
        o = fwd(x)
        return torch.autograd.grad(o, grad_inputs(x, names), x["do"])

    return fwd_nograd, fwd_bwd


def measure(name, sets, iters, notes, tag):
    """{'fwd': ms, 'fb': ms, 'mem': GB} of one implementation at one input list. A stage that fails is 'OOM' or
    'error' (and so are the stages after it, which need it), with a note; memory is freed after a failure."""
    fwd, fb = impl_fns(name)
    it = iters if name != "fla" else max(5, iters // 2)
    stages = (("fwd", lambda: time_ms(fwd, sets, it)), ("fb", lambda: time_ms(fb, sets, it)),
              ("mem", lambda: peak_gb(fb, sets[0])))
    r = {}
    if name == "fast":  # the same forward as ours: only its backward differs, so its forward is not timed again
        stages, r["fwd"] = stages[1:], "-"
    for i, (key, stage) in enumerate(stages):
        failed = None
        try:
            r[key] = stage()
        except Exception as e:
            failed = "OOM" if is_oom(e) else "error"
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            notes.append(f"{tag} {name} ({key}): {failed}: {type(e).__name__}: {first}")
            print(f"#   {name} ({key}): {failed}: {type(e).__name__}: {first}", flush=True)
        if failed:  # here the exception, and the frames holding its tensors, are gone
            free_memory()
            for k2, _ in stages[i:]:
                r[k2] = failed
            break
    return r


# ---------------------------------------------------------------------------------------------------------------
# formatting


def fmt_ms(c):
    return f"{c:.3f}" if isinstance(c, float) else c


def fmt_ratio(a, b):
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "-"


def fmt_tf(flops, ms):
    if not isinstance(ms, float):
        return "-"
    tf = flops / (ms * 1e-3) / 1e12
    return f"{tf:.0f} ({100 * tf / PEAK_TFLOPS:.0f}%)"


def fmt_gb(c):
    return f"{c:.2f}" if isinstance(c, float) else c


def tables(rows):
    """Two tables (times; throughput and memory) as lists of rows of strings, with their headers."""
    h1 = ["B x T", "H", "D", "gate", "ours fwd", "SDPA fwd", "fla fwd", "ours/SDPA", "fla/ours",
          "ours f+b", "SDPA f+b", "fla f+b", "ours/SDPA", "fla/ours"]
    h2 = ["B x T", "H", "D", "gate", "ours fwd TF/s", "SDPA fwd TF/s", "ours f+b TF/s", "SDPA f+b TF/s",
          "mem ours GB", "mem SDPA GB", "mem fla GB"]
    fast = any(r["fast"] for r in rows)  # --fast: our fast-mode f+b beside the others
    if fast:
        h1 += ["ours fast f+b", "fast/SDPA", "fla/fast"]
    t1, t2 = [], []
    for r in rows:
        B, T, H, D, gate = r["shape"]
        o, s, f = r["ours"], r["sdpa"], r["fla"]
        fl = flop_counts(B, T, H, H, D)
        key = [f"{B} x {T}", str(H), str(D), "on" if gate else "off"]
        star = lambda c: fmt_ms(c) + ("*" if gate and isinstance(c, float) else "")  # noqa: E731
        t1.append(key + [fmt_ms(o.get("fwd", "-")), star(s.get("fwd", "-")), fmt_ms(f.get("fwd", "-")),
                         fmt_ratio(o.get("fwd"), s.get("fwd")), fmt_ratio(f.get("fwd"), o.get("fwd")),
                         fmt_ms(o.get("fb", "-")), star(s.get("fb", "-")), fmt_ms(f.get("fb", "-")),
                         fmt_ratio(o.get("fb"), s.get("fb")), fmt_ratio(f.get("fb"), o.get("fb"))])
        if fast:
            q = r["fast"]
            t1[-1] += [fmt_ms(q.get("fb", "-")), fmt_ratio(q.get("fb"), s.get("fb")), fmt_ratio(f.get("fb"), q.get("fb"))]
        t2.append(key + [fmt_tf(fl["path_fwd"], o.get("fwd")), fmt_tf(fl["sdpa_fwd"], s.get("fwd")),
                         fmt_tf(fl["path_fb"], o.get("fb")), fmt_tf(fl["sdpa_fb"], s.get("fb")),
                         fmt_gb(o.get("mem", "-")), fmt_gb(s.get("mem", "-")), fmt_gb(f.get("mem", "-"))])
    return (h1, t1), (h2, t2)


def plain(head, body):
    w = [max(len(head[i]), *(len(r[i]) for r in body)) if body else len(head[i]) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(head)] + [line(r) for r in body])


def markdown(head, body):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


TABLE_NOTES = """\
Times in ms (median of CUDA-event timings, inputs rotated over 3 sets); f+b = forward + backward (all input
gradients); ratios are time ratios. * SDPA has no forget gate: gated rows show its plain numbers. fla is given
g / scale (its gate is multiplied by scale, ours is not). TF/s (% of {peak:.0f}): ours by the PaTH count, SDPA by
FlashAttention's. mem: peak extra memory of one forward + backward (GB = 1e9 bytes). OOM / error / skip: see notes."""


# ---------------------------------------------------------------------------------------------------------------
# modes


def parse_shapes(args):
    if not args.shapes:
        shapes = SHAPES
    else:
        shapes = []
        for s in args.shapes:
            parts = [int(p) for p in s.replace("x", ",").split(",")]
            if len(parts) != 4:
                sys.exit(f"--shapes takes B,T,H,D (got {s!r})")
            shapes.append(tuple(parts))
    gates = {"both": (False, True), "off": (False,), "on": (True,)}[args.gate]
    return [(B, T, H, D, g) for (B, T, H, D) in shapes for g in gates]


def header(cases):
    lines = [FLOP_FORMULAS.format(peak=PEAK_TFLOPS), "",
             f"{'B':>3} {'T':>6} {'H':>3} {'D':>4} {'gate':>4} {'SDPA fwd TF':>11} {'SDPA f+b TF':>11} "
             f"{'PaTH fwd TF':>11} {'PaTH f+b TF':>11} {'PaTH/SDPA fwd':>13} {'f+b':>5} {'inputs GB':>9}"]
    for B, T, H, D, gate in cases:
        fl = flop_counts(B, T, H, H, D)
        # one input set: q, k, v, do bf16, w f32, beta f32, g and g / scale f32
        gb = (4 * B * T * H * D * 2 + B * T * H * D * 4 + B * T * H * 4 + (2 * B * T * H * 4 if gate else 0)) / 1e9
        lines.append(f"{B:>3} {T:>6} {H:>3} {D:>4} {'on' if gate else 'off':>4} {fl['sdpa_fwd'] / 1e12:>11.2f} "
                     f"{fl['sdpa_fb'] / 1e12:>11.2f} {fl['path_fwd'] / 1e12:>11.2f} {fl['path_fb'] / 1e12:>11.2f} "
                     f"{fl['path_fwd'] / fl['sdpa_fwd']:>13.2f} {fl['path_fb'] / fl['sdpa_fb']:>5.2f} {gb:>9.2f}")
    lines.append("(TF = 1e12 FLOP per call; inputs GB = one input set of 3, gradients not included)")
    return "\n".join(lines)


def run_bench(args, cases):
    t_start = time.time()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, iters {args.iters}, budget {args.budget_s} s")
    impls = [i for i in IMPLS if not (i == "fla" and args.no_fla) and not (i == "sdpa" and args.no_sdpa)
             and not (i == "fast" and not args.fast)]
    unavailable = {}
    for name in impls:
        try:
            impl_fns(name)
        except Exception as e:  # report, keep the other columns
            unavailable[name] = f"{type(e).__name__}: {e}"
            print(f"# {name} unavailable: {unavailable[name]}")
    notes = [f"{n} unavailable: {m}" for n, m in unavailable.items()]
    sdpa_plain = {}  # (B, T, H, D) -> the plain row's SDPA result, reused in the gated row
    rows = []
    for B, T, H, D, gate in cases:
        row = {"shape": (B, T, H, D, gate), **{name: {} for name in IMPLS}}
        rows.append(row)
        tag = f"{B}x{T} H={H} D={D} gate={'on' if gate else 'off'}"
        if time.time() - t_start > args.budget_s:
            notes.append(f"{tag}: skipped (budget of {args.budget_s:.0f} s spent)")
            for name in impls:
                row[name] = {"fwd": "skip", "fb": "skip", "mem": "skip"}
            continue
        failed = None
        try:
            sets = make_sets(B, T, H, D, gate)
        except Exception as e:
            failed = "OOM" if is_oom(e) else "error"
            notes.append(f"{tag}: inputs: {failed}: {type(e).__name__}: {e}")
            print(f"# {tag}: inputs: {failed}: {type(e).__name__}: {e}", flush=True)
        if failed:
            sets = None
            free_memory()
            for name in impls:
                row[name] = {"fwd": failed, "fb": failed, "mem": failed}
            continue
        for name in impls:
            if name in unavailable:
                row[name] = {"fwd": "n/a", "fb": "n/a", "mem": "n/a"}
                continue
            if name == "sdpa" and (B, T, H, D) in sdpa_plain:  # no gate in SDPA: the plain row's numbers
                row[name] = sdpa_plain[(B, T, H, D)]
                continue
            if time.time() - t_start > args.budget_s:
                row[name] = {"fwd": "skip", "fb": "skip", "mem": "skip"}
                notes.append(f"{tag} {name}: skipped (budget of {args.budget_s:.0f} s spent)")
                continue
            t0 = time.time()
            try:
                row[name] = measure(name, sets, args.iters, notes, tag)
            except Exception as e:  # impl_fns itself (import) failing here: unexpected, but never fatal
                row[name] = {"fwd": "error", "fb": "error", "mem": "error"}
                notes.append(f"{tag} {name}: error: {type(e).__name__}: {e}")
            free_memory()
            r = row[name]
            if name == "sdpa" and all(isinstance(r[k], float) for k in ("fwd", "fb", "mem")):
                sdpa_plain[(B, T, H, D)] = r
            print(f"#   {tag} {name}: fwd {fmt_ms(r['fwd'])} ms, f+b {fmt_ms(r['fb'])} ms, mem {fmt_gb(r['mem'])} GB "
                  f"({time.time() - t0:.0f} s)", flush=True)
        sets = None
        free_memory()
        print(f"# done {tag} ({time.time() - t_start:.0f} s)", flush=True)

    (h1, t1), (h2, t2) = tables(rows)
    text_notes = TABLE_NOTES.format(peak=PEAK_TFLOPS)
    if notes:
        text_notes += "\nNotes:\n" + "\n".join("- " + n for n in notes)
    print()
    print(header(cases))
    print()
    print(plain(h1, t1))
    print()
    print(plain(h2, t2))
    print()
    print(text_notes)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16, causal, HQ = H\n\n")
            f.write(markdown(h1, t1) + "\n\n" + markdown(h2, t2) + "\n\n" + text_notes + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["B", "T", "H", "D", "gate", "impl", "fwd_ms", "fb_ms", "mem_gb", "flops_fwd", "flops_fb"])
            for row in rows:
                B, T, H, D, gate = row["shape"]
                fl = flop_counts(B, T, H, H, D)
                for name in IMPLS:
                    r = row[name]
                    if not r:
                        continue
                    ff, fb = (fl["sdpa_fwd"], fl["sdpa_fb"]) if name == "sdpa" else (fl["path_fwd"], fl["path_fb"])
                    wr.writerow([B, T, H, D, int(gate), name, r["fwd"], r["fb"], r["mem"], f"{ff:.6g}", f"{fb:.6g}"])
    return 0


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return (a - b).norm().item() / max(b.norm().item(), 1e-300)


def run_check(args):
    """Ours (CUDA bf16) and fla (g / scale) against pathattn on the CPU in float64, at one small gated shape."""
    import pathattn

    B, T, H, D = 2, 512, 4, 64
    scale = D ** -0.5
    gen = torch.Generator().manual_seed(1)
    bf = lambda t: t.to(torch.bfloat16).double()  # noqa: E731  (bf16-rounded values: every path sees the same inputs)
    x64 = {
        "q": bf(torch.randn(B, T, H, D, generator=gen)), "k": bf(torch.randn(B, T, H, D, generator=gen)),
        "v": bf(torch.randn(B, T, H, D, generator=gen)),
        "w": F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1).float().double(),
        "beta": (2 * torch.sigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))).float().double(),
        "g": F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64)).float().double(),
    }
    do64 = bf(torch.randn(B, T, H, D, generator=gen))
    names = ("q", "k", "v", "w", "beta", "g")

    def leaves(device, low):
        def dtype(n):
            if low is None:
                return torch.float64
            return low if n in ("q", "k", "v") else torch.float32
        return {n: t.to(device=device, dtype=dtype(n)).requires_grad_(True) for n, t in x64.items()}

    t0 = time.time()
    ref = leaves("cpu", None)
    o_ref = pathattn.path_attention(ref["q"], ref["k"], ref["v"], ref["w"], ref["beta"], ref["g"])
    g_ref = torch.autograd.grad(o_ref, [ref[n] for n in names], do64)
    print(f"# reference: CPU float64 through pathattn.path_attention ({time.time() - t0:.1f} s)")
    results = {"ref": [o_ref] + list(g_ref)}
    try:
        x = leaves("cuda", torch.bfloat16)
        o = pathattn.path_attention(x["q"], x["k"], x["v"], x["w"], x["beta"], x["g"])
        results["ours"] = [o] + list(torch.autograd.grad(o, [x[n] for n in names], do64.to("cuda", torch.bfloat16)))
    except Exception as e:
        print(f"# ours failed: {type(e).__name__}: {e}")
    if not args.no_fla:
        try:
            from fla.ops.path_attn.parallel import parallel_path_attn
            x = leaves("cuda", torch.bfloat16)
            g_fla = (x["g"].detach() / scale).requires_grad_(True)
            o = parallel_path_attn(x["q"], x["k"], x["v"], x["w"], x["beta"], g=g_fla)[0]
            gr = torch.autograd.grad(o, [x["q"], x["k"], x["v"], x["w"], x["beta"], g_fla],
                                     do64.to("cuda", torch.bfloat16))
            results["fla"] = [o] + list(gr[:5]) + [gr[5] / scale]  # d/dg = d/d(g / scale) / scale
        except Exception as e:
            print(f"# fla failed: {type(e).__name__}: {e}")
    cols = ["o"] + ["d" + n for n in names]
    pairs = [("ours", "ref"), ("fla", "ref"), ("ours", "fla")]
    print(f"relative errors ||a - b|| / ||b|| at B={B} T={T} H={H} D={D}, gate on, bf16 q/k/v/do, f32 w/beta/g")
    print(f"{'a vs b':>12} " + " ".join(f"{c:>9}" for c in cols))
    errs = {}
    for a, b in pairs:
        if a not in results or b not in results:
            print(f"{a + ' vs ' + b:>12} " + " ".join(f"{'-':>9}" for _ in cols))
            continue
        errs[(a, b)] = [rel(u, v) for u, v in zip(results[a], results[b])]
        print(f"{a + ' vs ' + b:>12} " + " ".join(f"{e:9.2e}" for e in errs[(a, b)]))
    # Each of ours within 5e-2 of float64, or within 2x fla's error there (FlashAttention's rule for bf16).
    ours, fla = errs.get(("ours", "ref")), errs.get(("fla", "ref"))
    bad = [] if ours is not None else ["ours did not run"]
    for i, c in enumerate(cols if ours is not None else []):
        if not (ours[i] <= 5e-2 or (fla is not None and ours[i] <= 2 * fla[i])):
            bad.append(f"{c} {ours[i]:.2e}")
    ok = not bad
    print("check: " + ("ok (ours vs float64 within 5e-2, or within 2x fla's error)" if ok
                       else "FAILED: " + ", ".join(bad) + " (bound: 5e-2, or 2x fla's error)"))
    return 0 if ok else 1


def main():
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # for child processes (Triton's compiler); this one:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", help="B,T,H,D (or BxTxHxD) each; default: the five shapes above")
    ap.add_argument("--gate", choices=("both", "off", "on"), default="both")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining cells after this many seconds")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--fast", action="store_true", help="also ours with deterministic=False (the fast backward)")
    ap.add_argument("--md", help="also write the tables as markdown here")
    ap.add_argument("--csv", help="also write one row per (shape, gate, implementation) here")
    ap.add_argument("--check", action="store_true", help="gradients of ours and fla against CPU float64, small shape")
    ap.add_argument("--dry-run", action="store_true", help="print the shapes and FLOP counts only (no GPU)")
    args = ap.parse_args()
    cases = parse_shapes(args)
    if args.dry_run:
        print(header(cases))
        return 0
    if not torch.cuda.is_available():
        print("bench_train: needs a CUDA device (use --dry-run here)")
        return 2
    if args.check:
        return run_check(args)
    print(header(cases), flush=True)
    return run_bench(args, cases)


if __name__ == "__main__":
    sys.exit(main())

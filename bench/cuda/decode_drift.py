"""How far a decoded sequence drifts from the exact one over many steps, per cache dtype: our CUDA decode
(torch.ops.pathattn.decode) with an f32 cache and with a bf16 cache (keys rounded to bf16 after every carry, values
bf16, exact), against the f64 recurrence (docs/math.md Eq. 3-4: every cached key carried by each new H_t, then
softmax attention of q_t over the carried keys), from an empty cache, one token per step.

Why it matters: the decode rewrites every cached key at every step, so a bf16 cache rounds the oldest key once per
step. Rounding errors of successive steps are independent, so the key error grows like sqrt(age) (|H_t| <= 1 for
beta in [0, 2] does not amplify it, nor shrink it: at beta = 2, H_t is a reflection); an f32 cache does the same
with a 2^16 times smaller unit.

Printed: per window of steps, the relative L2 error of o against the f64 truth for each cache, beside the floor that
o's own bf16 rounding sets (the f64 truth rounded to bf16); then the final cache's key error by the age of the key.
Inputs as a trained layer gives them: bf16 q, k, v (normal), w unit vectors, beta = 2 sigmoid(N(0, 1)) (spec §5),
no gate. Run on the GPU machine after `tools/gpu_check.sh torch`:

    PATHATTN_LIBRARY=$(find build-gpu-torch -name libpathattn_torch.so | head -1) PYTHONPATH=python \\
        python3 bench/cuda/decode_drift.py [--steps 10000] [--D 64 128]
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

DEV = "cuda"  # (a CPU run of decode_f64 checks it against the reference forward)


def inputs(N, H, HQ, D, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    q = r(1, N, HQ, D).to(torch.bfloat16)
    k = r(1, N, H, D).to(torch.bfloat16)
    v = r(1, N, H, D).to(torch.bfloat16)
    w = F.normalize(r(1, N, H, D), dim=-1)
    beta = 2 * torch.sigmoid(r(1, N, H))
    return q, k, v, w, beta


def decode_ours(x, H, HQ, D, cache_dtype):
    import pathattn

    q, k, v, w, beta = x
    N = q.shape[1]
    cache = pathattn.DecodeCache(1, N, H, D, HQ=HQ, device=DEV, k_dtype=cache_dtype, v_dtype=cache_dtype)
    outs = []
    for t in range(N):
        sl = slice(t, t + 1)
        outs.append(pathattn.decode(q[:, sl], k[:, sl], v[:, sl], w[:, sl], beta[:, sl], cache))
    return torch.cat(outs, 1)[0].double(), cache.k[0].double()  # o [N, HQ, D], cache keys [N, H, D]


def decode_f64(x, H, HQ, D):
    """The recurrence in f64: keys carried in place step by step, as the decode does, on the same rounded inputs."""
    q, k, v, w, beta = (t[0].double() for t in x)
    N, G = q.shape[0], HQ // H
    scale = 1.0 / math.sqrt(D)
    K = torch.zeros(N, H, D, dtype=torch.float64, device=DEV)
    o = torch.empty(N, HQ, D, dtype=torch.float64, device=DEV)
    for t in range(N):
        if t > 0:  # c_j <- c_j - beta_t (w_t . c_j) w_t for every cached key (Eq. 3)
            Kc = K[:t]
            a = torch.einsum("jhd,hd->jh", Kc, w[t]) * beta[t]
            Kc -= a[..., None] * w[t]
        K[t] = k[t]
        qt = q[t].view(H, G, D)  # query heads h G .. h G + G - 1 read kv head h
        p = torch.softmax(torch.einsum("hgd,jhd->hgj", qt, K[: t + 1]) * scale, dim=-1)
        o[t] = torch.einsum("hgj,jhd->hgd", p, v[: t + 1]).reshape(HQ, D)
    return o, K


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--HQ", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_drift.py needs a CUDA device")
    N, H, HQ = args.steps, args.H, args.HQ
    print(f"# decode_drift.py on {torch.cuda.get_device_name()}, torch {torch.__version__}: {N} steps from an empty "
          f"cache, H = {H}, HQ = {HQ}, bf16 q/k/v, beta = 2 sigmoid(N(0,1)), no gate; relative L2 errors vs f64")
    for D in args.D:
        x = inputs(N, H, HQ, D, args.seed)
        truth_o, truth_k = decode_f64(x, H, HQ, D)
        o32, k32 = decode_ours(x, H, HQ, D, torch.float32)
        o16, k16 = decode_ours(x, H, HQ, D, torch.bfloat16)
        floor = truth_o.to(torch.bfloat16).double()
        print(f"\nD = {D}: o per window of steps")
        print(f"{'steps':>14} {'f32 cache':>11} {'bf16 cache':>11} {'bf16 floor':>11} {'bf16 / floor':>13}")
        edges = [0, 10, 100, 1000, 3000, N // 2, N - 1000, N]
        edges = sorted({e for e in edges if 0 <= e <= N})
        for a, b in zip(edges[:-1], edges[1:]):
            if b <= a:
                continue
            e32, e16, ef = (rel(o[a:b], truth_o[a:b]) for o in (o32, o16, floor))
            print(f"{f'[{a}, {b})':>14} {e32:11.2e} {e16:11.2e} {ef:11.2e} {e16 / ef:12.2f}x")
        print(f"D = {D}: the final cache's keys by age (steps each was carried)")
        print(f"{'age':>14} {'f32 cache':>11} {'bf16 cache':>11}")
        for a, b in ((0, 10), (10, 100), (100, 1000), (1000, N // 2), (N // 2, N)):
            if b > N or b <= a:
                continue
            rows = slice(N - b, N - a)  # row j has age N - 1 - j
            print(f"{f'[{a}, {b})':>14} {rel(k32[rows], truth_k[rows]):11.2e} {rel(k16[rows], truth_k[rows]):11.2e}")
        del x, truth_o, truth_k, o32, k32, o16, k16, floor
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

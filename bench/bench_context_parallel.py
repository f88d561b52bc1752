"""Forward+backward of context-parallel PaTH attention (pathattn.context_parallel_attention) on n ranks, in one run
beside one rank at T / n (issue 13's measure: efficiency = t(one rank, T / n) / t(n ranks, T); causal attention's
work grows as T^2, so this cannot reach 100%) and one rank at the whole T (strong scaling: t(one rank, T) /
(n t(n ranks, T))). Prints a table; --csv writes the rows.

    torchrun --nproc_per_node 2 bench/bench_context_parallel.py --T 8192 --heads 8 --dim 64        # GPUs (NCCL)
    OMP_NUM_THREADS=1 /usr/bin/python3 bench/bench_context_parallel.py --spawn 2 --device cpu --T 512 \\
        --heads 2 --dim 32 --iters 2                                                 # CPUs (gloo), no torchrun

(--spawn N starts N local processes itself: Debian's torch 1.13 torch.distributed.run fails under Python 3.11.)

Inputs as bench/cuda/bench_train.py's (bf16 q, k, v on CUDA, f32 on the CPU; w unit-norm f32, beta = 2 sigmoid,
no gate unless --gate). Timing: warm-ups, then the median over --iters of a barrier-to-barrier forward + backward
(every rank's own loss), wall clock on the CPU and CUDA events on GPUs. The cross-segment blocks are dense PyTorch
attention in this version (docs/python.md "Context parallelism"), so long T per rank needs memory for an L x L tile.
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import pathattn  # noqa: E402
from pathattn.context_parallel import context_parallel_attention  # noqa: E402


def inputs(B, L, H, D, gate, device, dtype, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=mk(B, L, H, D).to(device, dtype), k=mk(B, L, H, D).to(device, dtype), v=mk(B, L, H, D).to(device, dtype),
             w=torch.nn.functional.normalize(mk(B, L, H, D), dim=-1).to(device),
             beta=(2 * torch.sigmoid(mk(B, L, H))).to(device))
    if gate:
        x["g"] = torch.nn.functional.logsigmoid(mk(B, L, H)).to(device)
    for t in x.values():
        t.requires_grad_()
    return x


def timed(fn, iters, device):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192, help="whole sequence length (split over the ranks)")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--gate", action="store_true")
    ap.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--csv")
    ap.add_argument("--spawn", type=int, default=0, help="start this many local processes (instead of torchrun)")
    a = ap.parse_args()
    if a.spawn and "RANK" not in os.environ:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as sock:  # a free port for the rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(a.spawn))
        mp.spawn(_spawned, args=(sys.argv[1:],), nprocs=a.spawn, join=True)
        return
    backend = "nccl" if a.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    if a.T % world:
        raise SystemExit(f"--T {a.T} must be a multiple of the world size {world}")
    L = a.T // world
    x = inputs(a.B, L, a.heads, a.dim, a.gate, a.device, dtype, seed=rank)

    def cp():
        o = context_parallel_attention(**x, layout=a.layout)
        o.float().sum().backward()

    def one():  # the same rank's segment alone: what each rank would do with no other segments
        o = pathattn.path_attention(**x)
        o.float().sum().backward()

    t_cp = timed(cp, a.iters, a.device)
    t_one = timed(one, a.iters, a.device)
    # The whole sequence on rank 0 alone (the others wait at the barriers).
    xf = inputs(a.B, a.T, a.heads, a.dim, a.gate, a.device, dtype, seed=0) if rank == 0 else None

    def full():
        if rank == 0:
            pathattn.path_attention(**xf).float().sum().backward()

    t_full = timed(full, a.iters, a.device)
    all_t = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    mine = torch.tensor([t_cp, t_one], dtype=torch.float64)
    if backend == "nccl":
        mine, all_t = mine.cuda(), [t.cuda() for t in all_t]
    dist.all_gather(all_t, mine)
    if rank == 0:
        worst_cp = max(float(t[0]) for t in all_t)
        worst_one = max(float(t[1]) for t in all_t)
        eff = worst_one / worst_cp
        print(f"# context-parallel PaTH f+b, {a.device} ({backend}), B {a.B}, T {a.T} over {world} ranks (L = {L}), "
              f"H {a.heads}, D {a.dim}, gate {a.gate}, layout {a.layout}; median of {a.iters}, slowest rank")
        strong = t_full / (world * worst_cp)
        print(f"{'ranks':>5} {'T':>8} {'cp ms':>10} {'one rank T/n ms':>16} {'eff (T/n)':>10} {'one rank T ms':>14} "
              f"{'strong eff':>11}")
        print(f"{world:>5} {a.T:>8} {worst_cp:>10.2f} {worst_one:>16.2f} {eff:>10.0%} {t_full:>14.2f} {strong:>11.0%}")
        if a.csv:
            with open(a.csv, "a", newline="") as f:
                csv.writer(f).writerow([a.device, a.layout, world, a.B, a.T, a.heads, a.dim, int(a.gate), worst_cp, worst_one,
                                        eff, t_full, strong])
    dist.destroy_process_group()


def _spawned(rank, argv):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    sys.argv = [sys.argv[0]] + argv
    main()


if __name__ == "__main__":
    main()

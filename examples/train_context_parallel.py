"""Data parallel x context parallel training of a small PaTH language model (pathattn.PaTHAttention layers) with
torch.distributed: world = dp x cp ranks; each global batch is split over the dp groups and each sequence over the
cp ranks of a group (layout contiguous or zigzag); DDP averages the gradients over all ranks. The data order is the
one of a single process: step s draws the same global batch [B, T] from a generator seeded with (seed, s), so the
loss curve does not depend on the world size (tests/python/test_context_parallel.py checks it against one process).

    torchrun --nproc_per_node 4 examples/train_context_parallel.py --cp 2 --steps 100 --T 8192     # GPUs (NCCL)
    OMP_NUM_THREADS=1 /usr/bin/python3 examples/train_context_parallel.py --spawn 2 --cp 2 --steps 20 --device cpu

The task: next-token prediction on sequences of a noisy repeating pattern (each sequence repeats a random motif of
--motif tokens; a token is replaced by a random one with probability 0.1), which attention learns quickly. Prints
one line per --log steps: step, loss (mean over every token of the global batch), tokens/s; --losses FILE writes the
losses one per line (rank 0).
"""
import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import pathattn  # noqa: E402
from pathattn.context_parallel import owned_segments  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = pathattn.PaTHAttention(hidden_size=width, num_heads=heads, use_low_rank_w=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, cp_group, cp_layout):
        x = x + self.attn(self.n1(x), cp_group=cp_group, cp_layout=cp_layout)
        return x + self.mlp(self.n2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, width, heads, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens, cp_group=None, cp_layout="contiguous"):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, cp_group, cp_layout)
        return self.head(x)


def global_batch(step, seed, B, T, vocab, motif):
    """The step's whole batch [B, T + 1] (inputs and shifted targets), the same for every world size."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    pat = torch.randint(0, vocab, (B, motif), generator=gen)
    seq = pat.repeat(1, (T + 1 + motif - 1) // motif)[:, : T + 1]
    noise = torch.rand(B, T + 1, generator=gen) < 0.1
    return torch.where(noise, torch.randint(0, vocab, (B, T + 1), generator=gen), seq)


def rows_of(t, c_index, cp, layout):
    """This cp rank's rows of [B, T] (the layout of pathattn.context_parallel.owned_segments)."""
    segs = owned_segments(c_index, cp, layout)
    n = len(segs) * cp
    Ls = t.shape[1] // n
    return torch.cat([t[:, s * Ls : (s + 1) * Ls] for s in segs], 1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cp", type=int, default=1, help="context-parallel ranks per group (world = dp x cp)")
    ap.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--B", type=int, default=4, help="global batch (sequences per step), a multiple of dp")
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--motif", type=int, default=7)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", type=int, default=5)
    ap.add_argument("--losses", help="rank 0 writes the losses here, one per line")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="CPU only")
    ap.add_argument("--spawn", type=int, default=0, help="start this many local processes (instead of torchrun)")
    ap.add_argument("--single", action="store_true", help="no torch.distributed: one process, no context parallel")
    a = ap.parse_args(argv)
    if a.spawn and "RANK" not in os.environ:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(a.spawn))
        mp.spawn(_spawned, args=(argv if argv is not None else sys.argv[1:],), nprocs=a.spawn, join=True)
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if a.single:
        rank, world, cp, cp_group = 0, 1, 1, None
    else:
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        cp = a.cp
        if world % cp:
            raise SystemExit(f"--cp {cp} must divide the world size {world}")
        groups = [dist.new_group(list(range(i * cp, (i + 1) * cp))) for i in range(world // cp)]
        cp_group = groups[rank // cp]
    dp = world // cp
    if a.B % dp:
        raise SystemExit(f"--B {a.B} must be a multiple of the data-parallel size {dp}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(a.seed)  # the same initial parameters on every rank
    model = TinyLM(a.vocab, a.width, a.heads, a.layers).to(device)
    if a.device == "cpu" and a.dtype == "float64":
        model = model.double()
    ddp = model if a.single else torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr)
    d_index, c_index, Bl = rank // cp, rank % cp, a.B // dp
    losses, t0, tokens = [], time.perf_counter(), 0
    for step in range(a.steps):
        batch = global_batch(step, a.seed, a.B, a.T, a.vocab, a.motif)
        x, y = batch[:, :-1], batch[:, 1:]
        xs = x[d_index * Bl : (d_index + 1) * Bl]
        ys = y[d_index * Bl : (d_index + 1) * Bl]
        if cp_group is not None:
            xs, ys = rows_of(xs, c_index, cp, a.layout), rows_of(ys, c_index, cp, a.layout)
        xs, ys = xs.to(device), ys.to(device)
        opt.zero_grad()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if a.device == "cuda" else contextlib.nullcontext()
        with autocast:
            logits = ddp(xs, cp_group, a.layout) if cp_group is not None else ddp(xs)
        # The sum over this rank's tokens / every token of the global batch, times the world (DDP averages).
        logits = logits.float() if a.device == "cuda" else logits  # (bf16 under autocast)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), ys.reshape(-1), reduction="sum") / (a.B * a.T)
        (loss * world).backward()
        opt.step()
        total = loss.detach().clone()
        if not a.single:
            dist.all_reduce(total)
        losses.append(total.item())
        tokens += a.B * a.T
        if rank == 0 and (step % a.log == 0 or step == a.steps - 1):
            dt = time.perf_counter() - t0
            print(f"step {step:5d}  loss {losses[-1]:.4f}  {tokens / dt:,.0f} tokens/s  (dp {dp} x cp {cp}, {a.layout})",
                  flush=True)
    if rank == 0 and a.losses:
        with open(a.losses, "w") as f:
            f.write("\n".join(f"{v:.12g}" for v in losses) + "\n")
    if not a.single:
        dist.destroy_process_group()


def _spawned(rank, argv):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    main(argv)


if __name__ == "__main__":
    main()

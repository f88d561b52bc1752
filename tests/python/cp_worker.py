# Worker processes of test_context_parallel.py (spawned: a module of its own, importable in a fresh interpreter).
# Each rank builds the same random full-sequence inputs, runs context_parallel_attention on its segment, and checks
# its rows of o, lse and every input gradient against path_attention over the whole sequence in one process.
import os

import torch
import torch.distributed as dist

from helpers import random_inputs


def init(rank, world, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def segment(t, rank, L, layout="contiguous", world=None):
    """This rank's L rows of a full-sequence tensor under the layout (pathattn.context_parallel.owned_segments)."""
    if t is None:
        return None
    if layout == "contiguous":
        return t[:, rank * L : (rank + 1) * L]
    from pathattn.context_parallel import owned_segments

    Ls = L // 2
    return torch.cat([t[:, s * Ls : (s + 1) * Ls] for s in owned_segments(rank, world, layout)], 1)


def op_worker(rank, world, init_file, case):
    """context_parallel_attention equals path_attention over the whole sequence: o, lse and the gradients of q, k,
    v, w, beta, g (a loss of o and of lse, so that the lse path is in the backward too)."""
    import pathattn
    from pathattn.context_parallel import context_parallel_attention

    init(rank, world, init_file)
    try:
        B, L, H, HQ, D, DV, gate, dtype, atol = (case[n] for n in ("B", "L", "H", "HQ", "D", "DV", "gate", "dtype", "atol"))
        layout = case.get("layout", "contiguous")
        T = L * world
        seg = lambda t: segment(t, rank, L, layout, world)  # noqa: E731
        x = random_inputs(B, T, H, HQ, D, DV, gate=gate, dtype=dtype, seed=case.get("seed", 5))
        x.pop("cu_seqlens", None)
        if case.get("beta_two"):
            x["beta"] = torch.full_like(x["beta"], 2.0)
        gen = torch.Generator().manual_seed(99)
        do = torch.randn(B, T, HQ, DV, generator=gen, dtype=dtype)
        dlse = torch.randn(B, T, HQ, generator=gen, dtype=dtype)
        names = [n for n in ("q", "k", "v", "w", "beta", "g") if x.get(n) is not None]

        full = {n: x[n].clone().requires_grad_() for n in names}
        o_ref, lse_ref = pathattn.path_attention(**full, return_lse=True)
        ((o_ref * do).sum() + (lse_ref * dlse).sum()).backward()

        mine = {n: seg(x[n]).clone().requires_grad_() for n in names}
        o, lse = context_parallel_attention(**mine, return_lse=True, layout=layout)
        ((o * seg(do)).sum() + (lse * seg(dlse)).sum()).backward()

        checks = [("o", o, seg(o_ref)), ("lse", lse, seg(lse_ref))]
        checks += [("d" + n, mine[n].grad, seg(full[n].grad)) for n in names]
        for name, a, ref in checks:
            err = (a.detach() - ref.detach()).abs().max().item()
            scale = max(1.0, ref.abs().max().item())
            assert err <= atol * scale, f"rank {rank} of {world}: {name} off by {err:.3e} (tolerance {atol * scale:.3e})"
    finally:
        dist.destroy_process_group()


def shape_error_worker(rank, world, init_file, _):
    """Segments of different lengths on different ranks: every rank gets the error naming both shapes."""
    from pathattn.context_parallel import context_parallel_attention

    init(rank, world, init_file)
    try:
        L = 8 + rank
        x = random_inputs(1, L, 1, 1, 16, 16, seed=1)
        x.pop("cu_seqlens", None)
        try:
            context_parallel_attention(**x)
        except RuntimeError as e:
            assert "same segment shape on every rank" in str(e) and "rank" in str(e), str(e)
        else:
            raise AssertionError("no error for segments of different lengths")
    finally:
        dist.destroy_process_group()


class TinyModel(torch.nn.Module):
    """Embedding-free attention block: x -> q, k, v, w, beta -> PaTH attention -> linear -> squared error."""

    def __init__(self, E=16, H=2, D=8):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(E, 3 * H * D)
        self.wp = torch.nn.Linear(E, H * D)
        self.bp = torch.nn.Linear(E, H)
        self.out = torch.nn.Linear(H * D, E)

    def forward(self, x, attend):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.H, self.D).unbind(2)
        w = torch.nn.functional.normalize(self.wp(x).reshape(B, T, self.H, self.D), dim=-1)
        beta = 2 * torch.sigmoid(self.bp(x))
        return self.out(attend(q, k, v, w, beta).reshape(B, T, -1))


def train_worker(rank, world, init_file, case):
    """Data parallel x context parallel: world = dp x cp ranks, the batch split over dp groups, the sequence over
    the cp ranks of a group; DDP over all ranks averages the gradients. A few SGD steps must give the parameters of
    one process training on the whole batch and sequence (mean squared error over every token)."""
    import pathattn
    from pathattn.context_parallel import context_parallel_attention

    init(rank, world, init_file)
    try:
        dp, cp, steps, B, T = case["dp"], case["cp"], case["steps"], case["B"], case["T"]
        L, Bl = T // cp, B // dp
        cp_groups = [dist.new_group(list(range(i * cp, (i + 1) * cp))) for i in range(dp)]  # every rank makes all
        d_index, c_index = rank // cp, rank % cp
        cp_group = cp_groups[d_index]
        torch.manual_seed(0)
        ref = TinyModel().double()
        model = TinyModel().double()
        model.load_state_dict(ref.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(7)
        for _ in range(steps):
            x = torch.randn(B, T, 16, generator=gen, dtype=torch.float64)
            y = torch.randn(B, T, 16, generator=gen, dtype=torch.float64)
            opt_ref.zero_grad()
            ((ref(x, pathattn.path_attention) - y) ** 2).mean().backward()
            opt_ref.step()
            xs = x[d_index * Bl : (d_index + 1) * Bl, c_index * L : (c_index + 1) * L]
            ys = y[d_index * Bl : (d_index + 1) * Bl, c_index * L : (c_index + 1) * L]
            opt.zero_grad()
            out = ddp(xs, lambda *a: context_parallel_attention(*a, group=cp_group))
            # DDP averages over the world: the sum over this rank's tokens / all tokens, times the world size.
            (((out - ys) ** 2).sum() / (B * T * 16) * world).backward()
            opt.step()
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
            err = (p.detach() - p_ref.detach()).abs().max().item()
            assert err <= 1e-10, f"rank {rank}: parameter {name} off by {err:.3e} after {steps} steps"
    finally:
        dist.destroy_process_group()


def layer_worker(rank, world, init_file, case):
    """PaTHAttention(x segment, cp_group) equals the layer over the whole sequence: outputs and the gradients of the
    input and of every parameter (summed over the ranks: each rank's loss covers its segment)."""
    import pathattn

    init(rank, world, init_file)
    try:
        torch.manual_seed(0)
        layer = pathattn.PaTHAttention(hidden_size=32, num_heads=4, num_kv_heads=case["kv_heads"],
                                       use_forget_gate=case["gate"]).double()
        B, T = 2, case["L"] * world
        L = case["L"]
        layout = case.get("layout", "contiguous")
        seg = lambda t: segment(t, rank, L, layout, world)  # noqa: E731
        gen = torch.Generator().manual_seed(3)
        x = torch.randn(B, T, 32, generator=gen, dtype=torch.float64)
        dy = torch.randn(B, T, 32, generator=gen, dtype=torch.float64)
        xf = x.clone().requires_grad_()
        (layer(xf) * dy).sum().backward()
        ref_grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
        layer.zero_grad()
        xs = seg(x).clone().requires_grad_()
        y = layer(xs, cp_group=dist.group.WORLD, cp_layout=layout)
        (y * seg(dy)).sum().backward()
        with torch.no_grad():
            y_ref = layer(x)
        checks = [("y", y, seg(y_ref)), ("dx", xs.grad, seg(xf.grad))]
        for n, p in layer.named_parameters():
            g = p.grad.clone()
            dist.all_reduce(g)
            checks.append(("d" + n, g, ref_grads[n]))
        for name, a, ref in checks:
            err = (a.detach() - ref.detach()).abs().max().item()
            assert err <= 1e-9 * max(1.0, ref.abs().max().item()), f"rank {rank}: {name} off by {err:.3e}"
    finally:
        dist.destroy_process_group()

"""Context-parallel PaTH attention over torch.distributed (docs/math.md section 6, Eq. 38-41).

The sequence is split into n equal segments, segment r on rank r of the group. Each rank attends within its own
segment with the local op (pathattn.path_attention, which returns lse), and to every earlier segment s < r through
that segment's summary: its keys carried to the segment's end (k^, Eq. 39), its values, its factor product
P_s = H_end ... H_start (D x D, Eq. 38) and its gate sums. A query carried to its own segment's start (q^, Eq. 39)
meets segment s's keys after the products of the segments in between (Eq. 40), one D x D product per segment; the
partial results merge by lse (Eq. 41). Everything but the local op is differentiable PyTorch, and the summaries
travel in one autograd-aware all-gather, whose backward sums every rank's gradient of a summary and hands it to the
rank that owns it. Works with any backend (gloo on CPUs, NCCL on GPUs).

What it is and is not (docs/python.md "Context parallelism"): the cross-segment blocks are PyTorch softmax
attention in tiles (block_attention.py: memory O(tile^2) per step, its own backward), linear in memory but not a
fused kernel, which long sequences on GPUs need for speed. Segments in rank order (layout "contiguous") or zig-zag
(two segments per rank, balanced causal work).
"""
from typing import Optional

import torch
import torch.distributed as dist

from .block_attention import block_attention
from .ops import path_attention

CHUNK = 64  # rows per UT factor in the segment summaries (docs/math.md Eq. 10)


class _AllGather(torch.autograd.Function):
    """x [N] on every rank -> [world, N]; backward: the gradients of every rank summed, this rank's row returned.
    One collective each way, so that every rank calls the same collectives in the same order."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None


def segment_summary(q, k, w, beta, chunk: int = CHUNK):
    """The summaries of one segment (docs/math.md Eq. 38-39), differentiable: q^ [B, H, G, L, D] (each query carried
    to the segment's start, H_1 ... H_i q_i), k^ [B, H, L, D] (each key carried to the segment's end,
    H_L ... H_{j+1} k_j: the prefill's key cache) and P [B, H, D, D] = H_L ... H_1. q [B, L, HQ, D] (HQ = H G,
    query head h G + j on kv head h), k and w [B, L, H, D], beta [B, L, H]. Computed in chunks of `chunk` rows in
    the UT form (Eq. 10-14) with prefix and suffix products of the chunk products: linear in L."""
    B, L, HQ, D = q.shape
    H = k.shape[2]
    G = HQ // H
    dtype = torch.promote_types(q.dtype, torch.float32)
    NC = (L + chunk - 1) // chunk
    pad = NC * chunk - L

    def rows(x):  # [B, L, heads, d] -> [B, heads, NC, C, d], zero rows past L (beta = 0 there: H_t = I)
        x = x.to(dtype)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        return x.reshape(B, NC, chunk, x.shape[2], x.shape[3]).permute(0, 3, 1, 2, 4)

    W, K = rows(w), rows(k)  # [B, H, NC, C, D]
    b = rows(beta.unsqueeze(-1)).squeeze(-1)  # [B, H, NC, C]
    Q = rows(q).reshape(B, H, G, NC, chunk, D)
    eye_c = torch.eye(chunk, dtype=dtype, device=q.device)
    eye_d = torch.eye(D, dtype=dtype, device=q.device)
    A = torch.tril(b.unsqueeze(-1) * (W @ W.transpose(-1, -2)), -1)  # Eq. 10
    Tm = torch.linalg.solve_triangular(eye_c + A, eye_c.expand_as(A), upper=False, unitriangular=True)
    U = Tm @ (b.unsqueeze(-1) * W)
    P = eye_d - W.transpose(-1, -2) @ U  # chunk products H_C ... H_1 (Eq. 11)  [B, H, NC, D, D]
    # Chunk-local carries (Eq. 13, 14).
    Qloc = Q - torch.tril(Q @ W.transpose(-1, -2).unsqueeze(2)) @ U.unsqueeze(2)
    Kcorr = Tm @ (b.unsqueeze(-1) * torch.tril(W @ K.transpose(-1, -2), -1))
    Kloc = K - Kcorr.transpose(-1, -2) @ W
    # Prefix R_c = P_{c-1} ... P_1 (rows of q^ in chunk c: Qloc R_c) and suffix S_c = P_NC ... P_{c+1} (rows of k^:
    # Kloc S_c^T); P_seg = P_NC ... P_1.
    prefix, R = [], eye_d.expand(B, H, D, D)
    for c in range(NC):
        prefix.append(R)
        R = P[:, :, c] @ R
    p_seg = R
    suffix, S = [None] * NC, eye_d.expand(B, H, D, D)
    for c in reversed(range(NC)):
        suffix[c] = S
        S = S @ P[:, :, c]
    qhat = Qloc @ torch.stack(prefix, 2).unsqueeze(2)  # [B, H, G, NC, C, D]
    khat = Kloc @ torch.stack(suffix, 2).transpose(-1, -2)  # [B, H, NC, C, D]
    qhat = qhat.reshape(B, H, G, NC * chunk, D)[..., :L, :]
    khat = khat.reshape(B, H, NC * chunk, D)[:, :, :L]
    return qhat, khat, p_seg


def _check_initialised():
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("pathattn: context_parallel_attention needs torch.distributed initialised "
                           "(dist.init_process_group)")


def _check_same_shapes(q, k, v, g, group):
    """Every rank's rows must have the same shapes (the all-gather moves equal blocks); the local op has checked each
    rank's tensors against each other already."""
    B, L, HQ, D = q.shape
    shape = torch.tensor([B, L, HQ, k.shape[2], D, v.shape[3], int(g is not None)], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        shape = shape.to(q.device)
    shapes = [torch.empty_like(shape) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shapes, shape, group=group)
    for r, s in enumerate(shapes):
        if not torch.equal(s.cpu(), shape.cpu()):
            raise RuntimeError(
                "pathattn: context_parallel_attention needs the same segment shape on every rank "
                f"([B, L, HQ, H, D, DV, gate]): rank {dist.get_rank(group)} has {shape.tolist()}, rank {r} {s.tolist()}")


LAYOUTS = ("contiguous", "zigzag")


def owned_segments(rank: int, world: int, layout: str = "contiguous"):
    """The global segment indices that rank holds, in the order of its rows: contiguous, [rank] (n segments);
    zigzag, [rank, 2 n - 1 - rank] (2 n segments, so that every rank attends to 2 n - 1 of them: balanced)."""
    if layout == "contiguous":
        return [rank]
    if layout == "zigzag":
        return [rank, 2 * world - 1 - rank]
    raise RuntimeError(f"pathattn: layout must be one of {LAYOUTS}, got {layout!r}")


def _owner(s: int, world: int, layout: str):
    """(rank, index among that rank's segments) of global segment s."""
    if layout == "contiguous":
        return s, 0
    return (s, 0) if s < world else (2 * world - 1 - s, 1)


def conv_with_halo(step, x, n: int, group=None, layout: str = "contiguous"):
    """A causal convolution of width n + 1 over this rank's segments of x [B, L, C]: step(x_segment, halo) -> (y, _)
    continues after halo [B, n, C], the last n rows of the previous segment (another rank's, or zeros before the
    first segment). One differentiable all-gather of every segment's tail (its gradient returns to the owner)."""
    group = group if group is not None else dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = owned_segments(rank, world, layout)
    segs = x.chunk(len(mine), 1)
    for seg in segs:
        if seg.shape[1] < n:
            raise RuntimeError(f"pathattn: each segment must have at least {n} tokens here, got {seg.shape[1]}")
    tails = torch.stack([seg[:, seg.shape[1] - n :] for seg in segs])  # [segments per rank, B, n, C]
    gathered = _AllGather.apply(tails.reshape(-1), group).reshape((world,) + tuple(tails.shape))
    out = []
    for m, seg in zip(mine, segs):
        if m == 0:
            halo = gathered[0, 0] * 0  # zeros, with the gather kept in this rank's graph
        else:
            r, i = _owner(m - 1, world, layout)
            halo = gathered[r, i]
        out.append(step(seg, halo)[0])
    return torch.cat(out, 1)


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    group=None,
    return_lse: bool = False,
    layout: str = "contiguous",
    deterministic: bool = True,
):
    """PaTH attention over a sequence split across the ranks of `group` (default: the whole world). layout
    "contiguous": rank r holds tokens [r L, (r + 1) L) of every sequence; "zigzag": the sequence in 2 n segments of
    L / 2, rank r holding segments r and 2 n - 1 - r one after the other in its L rows (every rank then attends to
    as many key blocks: the causal work is balanced). q [B, L, HQ, D], k and w [B, L, H, D], v [B, L, H, DV], beta
    [B, L, H], g [B, L, HQ] (optional) as path_attention takes them. Returns this rank's rows of o [B, L, HQ, DV]
    (and lse [B, L, HQ] f32 with return_lse): equal to path_attention over the whole sequence, gradients included
    (every rank calls backward on its own loss; the summaries' gradients reach their owning ranks). Every rank must
    call it with the same shapes and layout. deterministic goes to the local blocks' op (path_attention: the CUDA
    backward's fixed summation order); the rest is deterministic PyTorch."""
    _check_initialised()
    group = group if group is not None else dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = owned_segments(rank, world, layout)
    if q.dim() != 4:
        raise RuntimeError(f"pathattn: q must have 4 dimensions [B, L, HQ, D], got {tuple(q.shape)}")
    B, L, HQ, D = q.shape
    if L % len(mine):
        raise RuntimeError(f"pathattn: layout 'zigzag' needs an even number of rows per rank (two segments), got {L}")
    Ls = L // len(mine)

    def rows(t, i):
        return None if t is None else t[:, i * Ls : (i + 1) * Ls]

    # Per own segment the local block: the op, which also checks this rank's tensors (errors naming the argument).
    local = [path_attention(*(rows(t, i) for t in (q, k, v, w, beta, g)), scale=scale, return_lse=True,
                            deterministic=deterministic) for i in range(len(mine))]
    _check_same_shapes(q, k, v, g, group)
    H, DV = k.shape[2], v.shape[3]
    G = HQ // H
    scale = D ** -0.5 if scale is None else float(scale)
    dtype = torch.promote_types(q.dtype, torch.float32)
    # Per own segment the summaries (Eq. 38-39), packed for one all-gather.
    qhats, flat, sizes = [], [], None
    for i in range(len(mine)):
        qi, ki, vi, wi, bi, gi = (rows(t, i) for t in (q, k, v, w, beta, g))
        qhat, khat, p_seg = segment_summary(qi, ki, wi, bi)
        qhats.append(qhat)
        pieces = [khat, vi.to(dtype).permute(0, 2, 1, 3), p_seg]
        if g is not None:
            pieces.append(torch.cumsum(gi.to(dtype), 1))  # G inside the segment (inclusive)
        sizes = [t.numel() for t in pieces]
        flat += [t.reshape(-1) for t in pieces]
    if world == 1 and layout == "contiguous":
        o, lse = local[0]
        return (o, lse) if return_lse else o
    gathered = _AllGather.apply(torch.cat(flat), group)  # [world, segments per rank x sum(sizes)]
    per_segment = sum(sizes)
    # A rank may use nobody's summary (rank 0, contiguous); a zero term keeps the gather in its graph, so that its
    # backward joins the all-reduce that the other ranks' backward starts.
    keep = gathered.sum() * 0

    def piece(s, j, shape):
        r, i = _owner(s, world, layout)
        off = i * per_segment + sum(sizes[:j])
        return gathered[r, off : off + sizes[j]].reshape(shape)

    outs, lses = [], []
    for i, m in enumerate(mine):
        o_loc, lse_loc = local[i]
        o_parts, lse_parts = [o_loc.to(dtype)], [lse_loc.to(dtype)]
        gl = piece(m, 3, (B, Ls, HQ)) if g is not None else None
        qt = qhats[i]  # q^ carried back over the segments after s (Eq. 40): [B, H, G, Ls, D]
        goff = None  # sum of the segment totals of s + 1 .. m - 1 (Eq. 40), as the loop walks s down
        for s in range(m - 1, -1, -1):
            ks = piece(s, 0, (B, H, Ls, D))
            vs = piece(s, 1, (B, H, Ls, DV))
            row = col = None
            if g is not None:
                gs = piece(s, 3, (B, Ls, HQ))
                gtot_s = gs[:, -1]  # [B, HQ]
                between = goff if goff is not None else torch.zeros_like(gtot_s)
                row = (gl + between.unsqueeze(1)).reshape(B, Ls, H, G).permute(0, 2, 3, 1)  # [B, H, G, Ls]
                col = (gtot_s.unsqueeze(1) - gs).reshape(B, Ls, H, G).permute(0, 2, 3, 1)  # [B, H, G, Ls]
                col = col.unsqueeze(-2)  # [B, H, G, 1, Ls]
                goff = between + gtot_s
            # softmax(scale qt k^T + col) v over the whole segment s (tiled, block_attention.py); the row term of
            # the gate only shifts lse.
            o_s, lse_s = block_attention(qt, ks.unsqueeze(2), vs.unsqueeze(2), col, scale)  # [B, H, G, Ls, DV]
            if row is not None:
                lse_s = lse_s + row
            o_parts.append(o_s.reshape(B, HQ, Ls, DV).permute(0, 2, 1, 3))
            lse_parts.append(lse_s.reshape(B, HQ, Ls).permute(0, 2, 1))
            if s > 0:
                qt = qt @ piece(s, 2, (B, H, D, D)).unsqueeze(2)
        lse = torch.logsumexp(torch.stack(lse_parts), 0)  # Eq. 41
        o = sum(torch.exp(l - lse).unsqueeze(-1) * op for l, op in zip(lse_parts, o_parts))
        outs.append((o + keep).to(o_loc.dtype))
        lses.append((lse + keep).to(lse_loc.dtype))
    o, lse = torch.cat(outs, 1), torch.cat(lses, 1)
    return (o, lse) if return_lse else o

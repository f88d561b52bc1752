"""Non-causal softmax attention of one query block over one key block, in tiles, with its own backward: the
cross-segment blocks of context parallelism (docs/math.md Eq. 40). Memory is O(tile^2) per step instead of the
L x L logits of the dense form; the backward recomputes each tile's probabilities from the saved lse (as
FlashAttention does) and takes the gradient of lse too (the blocks are merged by lse, Eq. 41: dl = p (dO . v -
delta + dlse), docs/math.md Eq. 6).

    o, lse = block_attention(q, k, v, col, scale)

q [..., G, Lq, D] (query heads grouped by kv head), k [..., 1, Lk, D], v [..., 1, Lk, DV] (broadcast over the G
query heads, their gradients summed over them), col [..., G, 1, Lk] or None: a per-key bias added to the logits
(the gate's key term); logits = scale q k^T + col. Returns o [..., G, Lq, DV] and lse [..., G, Lq]. A per-query
bias only shifts lse: add it outside. Plain PyTorch products (cuBLAS on GPUs), f32 or f64.
"""
from typing import Optional

import torch

TILE = 1024  # query and key rows per tile


def _tiles(n: int, tile: int):
    return [(a, min(a + tile, n)) for a in range(0, n, tile)]


class _BlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, col, scale, tile):
        Lq, Lk = q.shape[-2], k.shape[-2]
        o = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)
        for a, b in _tiles(Lq, tile):
            qa = q[..., a:b, :]
            m = torch.full(qa.shape[:-1], -float("inf"), dtype=q.dtype, device=q.device)
            l = torch.zeros_like(m)
            acc = torch.zeros(qa.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
            for c, d in _tiles(Lk, tile):  # online softmax over the key tiles
                s = scale * (qa @ k[..., c:d, :].transpose(-1, -2))
                if col is not None:
                    s = s + col[..., c:d]
                m_new = torch.maximum(m, s.amax(-1))
                corr = torch.exp(m - m_new)
                p = torch.exp(s - m_new.unsqueeze(-1))
                l = l * corr + p.sum(-1)
                acc = acc * corr.unsqueeze(-1) + p @ v[..., c:d, :]
                m = m_new
            o[..., a:b, :] = acc / l.unsqueeze(-1)
            lse[..., a:b] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, col, o, lse)
        ctx.scale, ctx.tile = scale, tile
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, col, o, lse = ctx.saved_tensors
        scale, tile = ctx.scale, ctx.tile
        if do is None:
            do = torch.zeros_like(o)
        delta = (do * o).sum(-1)  # Eq. 6, with the gradient of lse: delta - dlse
        if dlse is not None:
            delta = delta - dlse
        dq = torch.zeros_like(q)
        dk = torch.zeros(q.shape[:-2] + k.shape[-2:], dtype=q.dtype, device=q.device)  # per query head, summed below
        dv = torch.zeros(q.shape[:-2] + v.shape[-2:], dtype=q.dtype, device=q.device)
        dcol = torch.zeros(q.shape[:-2] + (1, k.shape[-2]), dtype=q.dtype, device=q.device) if col is not None else None
        Lq, Lk = q.shape[-2], k.shape[-2]
        for a, b in _tiles(Lq, tile):
            qa, doa = q[..., a:b, :], do[..., a:b, :]
            for c, d in _tiles(Lk, tile):
                kc, vc = k[..., c:d, :], v[..., c:d, :]
                s = scale * (qa @ kc.transpose(-1, -2))
                if col is not None:
                    s = s + col[..., c:d]
                p = torch.exp(s - lse[..., a:b].unsqueeze(-1))
                dv[..., c:d, :] += p.transpose(-1, -2) @ doa
                ds = p * (doa @ vc.transpose(-1, -2) - delta[..., a:b].unsqueeze(-1))  # d loss / d logits
                dq[..., a:b, :] += scale * (ds @ kc)
                dk[..., c:d, :] += scale * (ds.transpose(-1, -2) @ qa)
                if dcol is not None:
                    dcol[..., c:d] += ds.sum(-2, keepdim=True)
        # k, v (and col) broadcast over the query heads: sum their gradients back to the inputs' shapes.
        dk = dk.sum(-3, keepdim=True) if k.shape[-3] == 1 else dk
        dv = dv.sum(-3, keepdim=True) if v.shape[-3] == 1 else dv
        if dcol is not None and col.shape[-3] == 1:
            dcol = dcol.sum(-3, keepdim=True)
        return dq, dk, dv, dcol, None, None


def block_attention(q, k, v, col: Optional[torch.Tensor], scale: float, tile: int = TILE):
    """(o, lse) of softmax(scale q k^T + col) v over every key (no causal mask); see the module docstring."""
    return _BlockAttention.apply(q, k, v, col, float(scale), int(tile))

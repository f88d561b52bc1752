"""path_attention with autograd over the two registered ops (O(T) saved state: inputs, o, lse)."""
from typing import Optional

import torch


def _check_dense(**tensors):
    # A sparse tensor would reach the dispatcher's "no kernel for SparseCPU" message, which names no argument.
    for name, t in tensors.items():
        if t is not None and t.layout != torch.strided:
            raise RuntimeError(f"pathattn: {name} must be a strided (dense) tensor, got layout {t.layout}")


class _PathAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale, cu_seqlens):
        o, lse, _ = torch.ops.pathattn.fwd(q, k, v, w, beta, g, scale, cu_seqlens, False)
        ctx.save_for_backward(q, k, v, w, beta, g, cu_seqlens, o, lse)
        ctx.scale = scale
        # Unused outputs then arrive as None instead of zero tensors.
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        # The core's backward takes dO only; d lse would change delta_i = dO_i . O_i inside the kernels.
        # Refuse a real lse gradient loudly instead of dropping it (an all-zero one is fine).
        if dlse is not None and bool(dlse.any()):
            raise RuntimeError(
                "pathattn: backward through lse is not supported (only o is differentiable); "
                "detach lse before using it in a loss"
            )
        q, k, v, w, beta, g, cu_seqlens, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv, dw, dbeta, dg = torch.ops.pathattn.bwd(
            q, k, v, w, beta, g, ctx.scale, cu_seqlens, o, lse, do
        )
        return dq, dk, dv, dw, dbeta, (dg if g is not None else None), None, None


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    return_lse: bool = False,
):
    """PaTH attention (SPEC 1), differentiable in q, k, v, w, beta, g.

    q [B, T, HQ, D], k and w [B, T, H, D] (w unit norm), v [B, T, H, DV], beta [B, T, H] in [0, 2],
    g [B, T, HQ] log forget gate <= 0 (optional, PaTH-FoX; not multiplied by scale), scale (default D^-0.5),
    cu_seqlens [N + 1] int32 with B == 1 (packed variable-length batch, optional).
    Returns o [B, T, HQ, DV], or (o, lse [B, T, HQ] f32) with return_lse (lse carries no gradient: using it in
    a loss raises in backward). Errors are RuntimeError naming the argument.
    """
    _check_dense(q=q, k=k, v=v, w=w, beta=beta, g=g, cu_seqlens=cu_seqlens)
    scale = None if scale is None else float(scale)
    o, lse = _PathAttention.apply(q, k, v, w, beta, g, scale, cu_seqlens)
    return (o, lse) if return_lse else o


@torch.no_grad()
def prefill(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None):
    """Inference prefill: (o, lse, kcache) with kcache [B, T, H, D] the keys carried to the end of their
    sequence (SPEC 4), ready for decoding. No gradients."""
    _check_dense(q=q, k=k, v=v, w=w, beta=beta, g=g, cu_seqlens=cu_seqlens)
    scale = None if scale is None else float(scale)
    return torch.ops.pathattn.fwd(q, k, v, w, beta, g, scale, cu_seqlens, True)

"""path_attention with autograd over the registered ops (O(T) saved state: inputs, o, lse), prefill and decode."""
from typing import Optional

import torch


def _check_dense(**tensors):
    # A sparse tensor would reach the dispatcher's "no kernel for SparseCPU" message, which names no argument.
    for name, t in tensors.items():
        if t is not None and t.layout != torch.strided:
            raise RuntimeError(f"pathattn: {name} must be a strided (dense) tensor, got layout {t.layout}")


class _PathAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale, cu_seqlens, deterministic):
        o, lse, _ = torch.ops.pathattn.fwd(q, k, v, w, beta, g, scale, cu_seqlens, False)
        ctx.save_for_backward(q, k, v, w, beta, g, cu_seqlens, o, lse)
        ctx.scale = scale
        ctx.deterministic = deterministic
        # Unused outputs then arrive as None instead of zero tensors.
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        # A loss that uses lse too: dlse enters the core's backward as delta_i - dlse_i (docs/math.md Eq. 6).
        q, k, v, w, beta, g, cu_seqlens, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv, dw, dbeta, dg = torch.ops.pathattn.bwd(
            q, k, v, w, beta, g, ctx.scale, cu_seqlens, o, lse, do, dlse, ctx.deterministic
        )
        return dq, dk, dv, dw, dbeta, (dg if g is not None else None), None, None, None


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
    deterministic: bool = True,
):
    """PaTH attention (docs/spec.md §1), differentiable in q, k, v, w, beta, g.

    q [B, T, HQ, D], k and w [B, T, H, D] (w unit norm), v [B, T, H, DV], beta [B, T, H] in [0, 2],
    g [B, T, HQ] log forget gate <= 0 (optional, PaTH-FoX; not multiplied by scale), scale (default D^-0.5),
    cu_seqlens [N + 1] int32 with B == 1 (packed variable-length batch, optional).
    Returns o [B, T, HQ, DV], or (o, lse [B, T, HQ] f32) with return_lse; both are differentiable (a loss of
    lse, e.g. merging attention over key blocks, enters the backward as delta_i - dlse_i). Errors are
    RuntimeError naming the argument. deterministic (default): the CUDA backward sums across blocks in a fixed
    order, so gradients are bitwise repeatable; False lets them add in any order (10-16% faster on the H200,
    docs/perf/notes.md). The CPU backward is always deterministic.
    """
    _check_dense(q=q, k=k, v=v, w=w, beta=beta, g=g, cu_seqlens=cu_seqlens)
    scale = None if scale is None else float(scale)
    o, lse = _PathAttention.apply(q, k, v, w, beta, g, scale, cu_seqlens, bool(deterministic))
    return (o, lse) if return_lse else o


@torch.no_grad()
def prefill(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None):
    """Inference prefill: (o, lse, kcache) with kcache [B, T, H, D] the keys carried to the end of their
    sequence (docs/spec.md §4), ready for decoding. No gradients."""
    _check_dense(q=q, k=k, v=v, w=w, beta=beta, g=g, cu_seqlens=cu_seqlens)
    scale = None if scale is None else float(scale)
    return torch.ops.pathattn.fwd(q, k, v, w, beta, g, scale, cu_seqlens, True)


class DecodeCache:
    """The state of decode() for B sequences (docs/spec.md §4), updated in place: k [B, Tmax, H, D] (keys carried
    to each sequence's last token), v [B, Tmax, H, DV], gcum [B, Tmax, HQ] f64 cumulative log gates (None without a
    gate), lengths [B] int32. All on one device, the device of the tokens decode() gets: the CPU (float32 inputs)
    or a CUDA device (bfloat16/float16 q, k, v, float32 w, beta, g, D = DV in {64, 128}), where lengths stays on
    the device and the kernels read and advance it. k and v are float32 by default; on CUDA k_dtype may be
    bfloat16 (half the key traffic, but rounded at every step's carry: docs/cuda.md "Decode" measures the drift)
    and v_dtype the tokens' v dtype (exact: values are never carried).

    checkpoint=P (CPU and CUDA, docs/cuda.md) makes it the checkpointed cache of docs/spec.md §4: rows before ckpt [B] are
    carried only to the checkpoint and not rewritten per token, the queries are carried back by the product of the
    pending tokens' factors, carry [B, H, D, D] (ignored when nothing is pending), and every P tokens the old
    rows are carried by it at once (docs/math.md Eq. 35-37). Same results as the plain cache to rounding; its keys
    are not all carried to the last token (materialized_k() gives the plain cache's keys)."""

    def __init__(self, B, Tmax, H, D, DV=None, HQ=None, gated=False, device=None, k_dtype=torch.float32,
                 v_dtype=torch.float32, checkpoint=None):
        DV = D if DV is None else DV
        HQ = H if HQ is None else HQ
        device = torch.device("cpu") if device is None else torch.device(device)
        self.k = torch.zeros(B, Tmax, H, D, device=device, dtype=k_dtype)
        self.v = torch.zeros(B, Tmax, H, DV, device=device, dtype=v_dtype)
        self.gcum = torch.zeros(B, Tmax, HQ, dtype=torch.float64, device=device) if gated else None
        self.lengths = torch.zeros(B, dtype=torch.int32, device=device)
        self.ckpt = self.carry = None
        self.period = 0
        if checkpoint is not None:
            if int(checkpoint) < 1:
                raise RuntimeError(f"pathattn: DecodeCache: checkpoint (the refresh period P) must be >= 1, got {checkpoint}")
            self.period = int(checkpoint)
            self.ckpt = torch.zeros(B, dtype=torch.int32, device=device)
            self.carry = torch.eye(D, device=device).expand(B, H, D, D).contiguous()  # nothing pending

    @property
    def device(self):
        return self.k.device

    @classmethod
    def from_prefill(cls, kcache, v, g=None, Tmax=None, k_dtype=torch.float32, v_dtype=torch.float32,
                     checkpoint=None):
        """The cache after prefill(): kcache [B, T, H, D] from it, the prefill's v [B, T, H, DV] and g [B, T, HQ]
        (or None), with room for Tmax >= T tokens per sequence (default: T, i.e. full), on kcache's device (v and g
        must be there too). Stored in k_dtype / v_dtype (float32 by default; a bfloat16 kcache, the CUDA prefill's,
        is widened)."""
        B, T, H, D = kcache.shape
        Tmax = T if Tmax is None else Tmax
        if Tmax < T:
            raise RuntimeError(f"pathattn: DecodeCache.from_prefill: Tmax = {Tmax} must hold the prefill's T = {T}")
        for name, t in (("v", v), ("g", g)):
            if t is not None and t.device != kcache.device:
                raise RuntimeError(
                    f"pathattn: DecodeCache.from_prefill: {name} must be on kcache's device ({kcache.device}), "
                    f"got {t.device}"
                )
        c = cls(B, Tmax, H, D, v.shape[3], g.shape[2] if g is not None else H, gated=g is not None,
                device=kcache.device, k_dtype=k_dtype, v_dtype=v_dtype, checkpoint=checkpoint)
        c.k[:, :T] = kcache
        c.v[:, :T] = v
        if g is not None:
            c.gcum[:, :T] = g.double().cumsum(1)  # G_t in f64 (docs/spec.md §6)
        c.lengths.fill_(T)
        if c.ckpt is not None:
            c.ckpt.fill_(T)  # the prefill's keys are carried to its last token: the checkpoint, nothing pending
        return c

    def materialized_k(self):
        """The keys as the plain cache holds them (every row carried to its sequence's last token): k itself for a
        plain cache; for a checkpointed one, rows [0, ckpt) carried by the pending product: row <- carry^T row."""
        if self.ckpt is None:
            return self.k
        k = self.k.clone()
        for b in range(k.shape[0]):
            c = int(self.ckpt[b])
            if int(self.lengths[b]) > c:  # else nothing is pending and carry is ignored (the identity)
                k[b, :c] = torch.einsum("jhd,hde->jhe", k[b, :c].float(), self.carry[b]).to(k.dtype)
        return k

    def reserve(self, n):
        """Room for n more tokens per sequence: Tmax doubles (or grows to fit) when the cache would overflow. Reads
        the lengths to the host, which on CUDA waits for the queued work (PaTHLayerCache counts its tokens and calls
        this only when the room would run out; a CUDA-graph user allocates the room before capturing)."""
        need = int(self.lengths.max()) + n
        Tmax = self.k.shape[1]
        if need <= Tmax:
            return
        T2 = max(2 * Tmax, need)

        def grow(t):
            if t is None:
                return None
            g = t.new_zeros((t.shape[0], T2) + tuple(t.shape[2:]))  # on t's device
            g[:, :Tmax] = t
            return g

        self.k, self.v, self.gcum = grow(self.k), grow(self.v), grow(self.gcum)


@torch.no_grad()
def decode(q, k, v, w, beta, cache, g=None, scale=None, return_lse=False, commit=True):
    """Appends S new tokens per sequence to `cache` (a DecodeCache, updated in place) and attends them to it:
    q [B, S, HQ, D], k and w [B, S, H, D], v [B, S, H, DV], beta [B, S, H], g [B, S, HQ] iff the cache is gated.
    Returns o [B, S, HQ, DV] (and lse [B, S, HQ] with return_lse): equal, to rounding, to path_attention over
    the whole sequences. The tokens are on the cache's device (else a RuntimeError naming the tensor). CPU: float32,
    S > 1 carries the cache with one UT factor per 64 tokens (docs/spec.md §4), a cache without room for S more is
    an error. CUDA: bfloat16/float16 q, k, v with float32 w, beta, g, on torch's current stream, nothing read back
    to the host; S >= 4 runs as one pass over the cache per 64 tokens, S = 2, 3 as single steps; a sequence
    without room gets NaN outputs and is left as it was (call cache.reserve(S) first). commit=False: the same
    outputs, the cache left as it was (speculative decoding: a PaTH cache cannot be rolled back, since H_t is
    singular at beta_t = 1, so verify the draft tokens without commit, then decode the accepted ones; the plain cache
    only, at most 64 tokens on CUDA). No gradients."""
    _check_dense(q=q, k=k, v=v, w=w, beta=beta, g=g)
    scale = None if scale is None else float(scale)
    o, lse = torch.ops.pathattn.decode(
        q, k, v, w, beta, g, scale, cache.k, cache.v, cache.gcum, cache.lengths, cache.ckpt, cache.carry,
        cache.period, bool(commit)
    )
    return (o, lse) if return_lse else o


class _ShortConvW(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, weight, state, cu_seqlens, head_dim, eps):
        w2 = weight[:, 0] if weight.dim() == 3 else weight  # conv1d's [C, 1, K] -> [C, K]
        w = torch.ops.pathattn.short_conv_w(u, w2, state, cu_seqlens, head_dim, eps)
        ctx.save_for_backward(u, weight, state, cu_seqlens)
        ctx.head_dim, ctx.eps = head_dim, eps
        return w

    @staticmethod
    def backward(ctx, dw):
        u, weight, state, cu_seqlens = ctx.saved_tensors
        w2 = weight[:, 0] if weight.dim() == 3 else weight
        want_dstate = state is not None and ctx.needs_input_grad[2]
        du, dweight, dstate = torch.ops.pathattn.short_conv_w_bwd(
            u, w2, state, cu_seqlens, ctx.head_dim, ctx.eps, dw, want_dstate
        )
        return du, dweight.to(weight.dtype).view_as(weight), (dstate if want_dstate else None), None, None, None


def short_conv_w(u, weight, head_dim, state=None, cu_seqlens=None, eps=1e-12):
    """The PaTH layer's Householder directions from its w projection, fused (docs/math.md Eq. 44-46):
    w = normalize(silu(causal depthwise conv(u, weight))) over each head's head_dim channels, i.e. fla's
    ShortConvolution (SiLU, no bias) followed by an L2 norm, in one pass each way.

    u [B, T, C] (C = H * head_dim), weight [C, 1, K] (the conv1d weight) or [C, K], state [B, K - 1, C] the
    inputs before u's first row (decoding; None: zeros), cu_seqlens [N + 1] int32 with B == 1 (the convolution
    restarts at each sequence). Returns w [B, T, H, head_dim] in float32 (float64 for float64 u), differentiable in
    u, weight and state. CPU: float32/float64 (16-bit through float32); CUDA: float32/bfloat16/float16 u,
    head_dim <= 256, K <= 8. Errors are RuntimeError naming the argument.
    """
    _check_dense(u=u, weight=weight, state=state, cu_seqlens=cu_seqlens)
    return _ShortConvW.apply(u, weight, state, cu_seqlens, head_dim, eps)


class _RopeRotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return torch.ops.pathattn.rope(x, cos, sin, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return torch.ops.pathattn.rope(dy, cos, sin, True), None, None  # the transposed rotation


def rope_rotate(x, cos, sin):
    """RoPE's rotation, fused: with half = D // 2, x1 = x[..., :half], x2 = x[..., half:] and the angle tables
    cos, sin [T, half] (float32; float64 for float64 x), returns cat(x1 cos - x2 sin, x1 sin + x2 cos) over
    x [B, T, H, D] in x's dtype, each product rounded to float32 before the sum: the same values, bit for bit, as
    (x1.float() * cos - x2.float() * sin, ...).to(x.dtype) and as its autograd gradient, in one pass each way.
    Differentiable in x. CPU: float32/float64; CUDA: float32/bfloat16/float16. Errors are RuntimeError naming the
    argument.
    """
    _check_dense(x=x, cos=cos, sin=sin)
    return _RopeRotate.apply(x, cos, sin)


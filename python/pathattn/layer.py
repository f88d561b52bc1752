"""The PaTH attention layer of docs/spec.md §5, with fla's constructor knobs and parameter names (fla's PaTHAttention
state_dict loads with strict=True). The C++ model's layer (model/attention.{h,cpp}) is the same layer: the same
parameter names, initialisation and options; tests/python/test_cross_language.py checks that one set of weights gives
the same outputs in both."""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .context_parallel import context_parallel_attention, conv_with_halo
from .ops import DecodeCache, decode, path_attention, prefill, short_conv_w


class PaTHLayerCache:
    """Decoding state of one PaTHAttention layer (pass the same object to every call of one generation): the
    key cache (a DecodeCache: keys carried to each sequence's last token, values, gates) and the last
    conv_size - 1 inputs of the w short convolution, both on the layer's device. Empty until the first call (the
    prefill) fills it. len() is the number of cached tokens, counted on the host (every sequence of the batch
    advances together), so a CUDA decoding step reads nothing back from the device. checkpoint=P keeps the key
    cache checkpointed (DecodeCache(checkpoint=P): old keys rewritten once per P tokens; CPU and CUDA: docs/cuda.md)."""

    def __init__(self, checkpoint: Optional[int] = None):
        self.kv: Optional[DecodeCache] = None
        self.conv: Optional[torch.Tensor] = None  # [B, conv_size - 1, H * D]
        self.length = 0  # tokens in the cache, the same for every sequence (== kv.lengths)
        self.checkpoint = checkpoint

    def __len__(self):
        return self.length


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a gain `weight` (torch 1.13 has no nn.RMSNorm); eps as fla's RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # In x's dtype, gain included (as model/attention.cpp's RMSNorm): a bfloat16 q under autocast must stay
        # bfloat16 for the CUDA op, not be promoted to float32 by the float32 gain.
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


class ShortConvolution(nn.Conv1d):
    """Depthwise causal conv1d over time on [B, T, C] followed by SiLU; with cu_seqlens (packed batch) the
    taps never reach across a sequence start."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, groups=channels, bias=False)

    def step(self, x, state):
        """The convolution of x [B, S, C] continuing after the last K - 1 inputs `state` [B, K - 1, C]; returns
        (y [B, S, C], the new state)."""
        K = self.kernel_size[0]
        xx = torch.cat([state, x], 1)
        return self.forward(xx)[:, K - 1 :], xx[:, xx.shape[1] - (K - 1) :]

    def forward(self, x, cu_seqlens: Optional[torch.Tensor] = None):  # x [B, T, C]
        K = self.kernel_size[0]
        T = x.shape[1]
        weight = self.weight[:, 0, :]  # [C, K]; tap K - 1 multiplies x_t, tap K - 1 - s multiplies x_{t - s}
        pos = None
        if cu_seqlens is not None:
            # position of each token inside its own sequence: t - start(t), [T]
            cu = cu_seqlens.to(device=x.device, dtype=torch.long)
            t = torch.arange(T, device=x.device)
            start = cu[torch.searchsorted(cu, t, right=True) - 1]
            pos = t - start
        y = x * weight[:, K - 1]
        for s in range(1, min(K, T + 1)):
            shifted = F.pad(x, (0, 0, s, 0))[:, :T]  # x_{t - s}, zero before the first token
            if pos is not None:
                shifted = shifted * (pos >= s).to(x.dtype)[None, :, None]
            y = y + shifted * weight[:, K - 1 - s]
        return F.silu(y)


class PaTHAttention(nn.Module):
    """PaTH attention layer: q, k, v, o projections (no bias, no RoPE), Householder directions w from a
    low-rank projection + short causal conv + SiLU + L2 norm, strengths beta = 2 sigmoid(.) in f32, and for
    PaTH-FoX a per-query-head forget gate g = logsigmoid(.). forward(x [B, T, E], cu_seqlens) -> [B, T, E].

    Parameter names as fla's PaTHAttention: q_proj, k_proj, v_proj, o_proj, w_proj (w_proj.0, w_proj.1 when low
    rank), w_conv1d, bt_proj, g_proj (use_forget_gate), maybe_q_norm / maybe_k_norm (use_qk_norm). gate_scale: how
    the gate enters the logits, 'none' (ours, the default): scale * s_ij + G_i - G_j; 'fla': scale * (s_ij + G_i -
    G_j), fla's convention (its layer scales the gate by head_dim^-1/2), for fla checkpoints. deterministic (default
    True): the CUDA backward's fixed summation order, the same gradient bits on every run; False: its faster atomic
    order (path_attention's flag; it does not change the CPU backward).

    Context parallelism: forward(x, cp_group=group, cp_layout="contiguous" | "zigzag") with x this rank's rows of
    the sequences (contiguous: rank r of the torch.distributed group holds tokens [r L, (r + 1) L); zigzag: segments
    r and 2 n - 1 - r of 2 n): the short convolution takes each segment's predecessor's last conv_size - 1 inputs,
    the attention runs through pathattn.context_parallel_attention; outputs and gradients equal one forward over
    the whole sequence (tests/python/test_context_parallel.py).

    Generation: forward(x, cache=PaTHLayerCache()) runs the prompt (prefill) and keeps the layer's state; later
    calls with the same cache append their tokens (pathattn.decode: CPU float32, or CUDA with q, k, v in
    bfloat16/float16 as the layer gives them under autocast or in bfloat16), as if the whole sequence had been run
    at once. No gradients flow through a call with a cache. commit=False on such a call (speculative decoding's
    verification of draft tokens) gives the same output and leaves the cache as it was (the key cache, the short
    convolution's inputs, the length); decode the accepted tokens again with commit=True (the default). The
    prompt's call (the prefill) commits: commit=False before it is a ValueError."""

    def __init__(
        self,
        hidden_size: int = 2048,
        num_heads: int = 32,
        num_kv_heads: Optional[int] = None,
        use_forget_gate: bool = False,
        use_qk_norm: bool = False,
        use_low_rank_w: bool = True,
        use_w_shortconv: bool = True,
        conv_size: int = 3,
        layer_idx: Optional[int] = None,
        beta_max: Optional[float] = None,
        w_rank: int = 32,
        gate_scale: str = "none",
        deterministic: bool = True,
    ):
        super().__init__()
        if hidden_size % num_heads != 0:
            raise ValueError(f"hidden_size = {hidden_size} must be a multiple of num_heads = {num_heads}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        if num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads = {num_heads} must be a multiple of num_kv_heads = {self.num_kv_heads}")
        self.head_dim = hidden_size // num_heads
        self.kv_dim = self.num_kv_heads * self.head_dim
        self.use_forget_gate = use_forget_gate
        self.use_qk_norm = use_qk_norm
        self.use_low_rank_w = use_low_rank_w
        self.use_w_shortconv = use_w_shortconv
        self.conv_size = conv_size
        self.layer_idx = layer_idx
        self.beta_max = beta_max  # optional clamp of beta to [0, beta_max] (guards bf16 runs, docs/spec.md §5)
        if gate_scale not in ("none", "fla"):
            raise ValueError(f"gate_scale: expected 'none' or 'fla', got {gate_scale!r}")
        self.gate_scale = gate_scale
        # The CUDA backward's fixed summation order (the same gradient bits on every run) or, False, its faster atomic
        # order (path_attention's deterministic); not a parameter: state_dicts are the same either way.
        self.deterministic = bool(deterministic)

        # Registered in fla's order, so named_parameters() lists them as fla's state_dict does.
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.kv_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.kv_dim, bias=False)
        if use_low_rank_w:
            self.w_proj = nn.Sequential(
                nn.Linear(hidden_size, w_rank, bias=False), nn.Linear(w_rank, self.kv_dim, bias=False)
            )
        else:
            self.w_proj = nn.Linear(hidden_size, self.kv_dim, bias=False)
        if use_qk_norm:
            self.maybe_q_norm = RMSNorm(self.head_dim)
            self.maybe_k_norm = RMSNorm(self.head_dim)
        else:
            self.maybe_q_norm = nn.Identity()
            self.maybe_k_norm = nn.Identity()
        if use_w_shortconv:
            self.w_conv1d = ShortConvolution(self.kv_dim, conv_size)
        self.bt_proj = nn.Linear(hidden_size, self.num_kv_heads, bias=True)
        if use_forget_gate:
            self.g_proj = nn.Linear(hidden_size, num_heads, bias=True)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        # fla's initialisation: weights N(0, 0.02), biases 0 (so beta starts at 2 sigmoid(0) = 1).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cu_seqlens: Optional[torch.Tensor] = None,
        cache: Optional[PaTHLayerCache] = None,
        cp_group=None,
        cp_layout: str = "contiguous",
        commit: bool = True,
    ) -> torch.Tensor:
        if cache is not None and cu_seqlens is not None:
            raise ValueError("pathattn: PaTHAttention takes a cache or cu_seqlens, not both (decode has no varlen)")
        if not commit and (cache is None or cache.kv is None):
            raise ValueError("pathattn: PaTHAttention with commit=False needs a cache that holds a prompt (the prefill "
                             "always commits)")
        if cp_group is not None and (cache is not None or cu_seqlens is not None):
            raise ValueError("pathattn: PaTHAttention with cp_group (context parallel) takes no cache and no cu_seqlens")
        x = hidden_states  # [B, T, E]
        B, T, _ = x.shape
        H, HQ, D = self.num_kv_heads, self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, T, HQ, D)
        k = self.k_proj(x).view(B, T, H, D)
        v = self.v_proj(x).view(B, T, H, D)
        q, k = self.maybe_q_norm(q), self.maybe_k_norm(k)

        # beta, g, w in f32 (docs/spec.md §6); on the CPU every input shares q's dtype (f32, or f64 for gradcheck).
        fdtype = x.dtype if x.device.type == "cpu" else torch.float32
        w = self.w_proj(x)  # [B, T, H * D]
        if self.use_w_shortconv:
            # conv + SiLU + L2 norm fused (short_conv_w, docs/math.md Eq. 44-46), a state continuing a cache or,
            # context parallel, each segment continuing after the previous one's last inputs (the halo's gradient
            # returns through the op's dstate and the all-gather).
            weight = self.w_conv1d.weight
            if cp_group is not None:
                def step(seg, halo):
                    return short_conv_w(seg, weight, D, state=halo).flatten(2), None

                w = conv_with_halo(step, w, self.conv_size - 1, cp_group, cp_layout).view(B, T, H, D)
            else:
                state = None
                if cache is not None and cache.kv is not None:  # decoding: continue after the cached inputs
                    state = cache.conv
                    if commit:
                        cache.conv = torch.cat([state, w], 1)[:, T:].detach()
                elif cache is not None:  # prefill: keep the last K - 1 inputs (zeros before a short prompt)
                    cache.conv = F.pad(w, (0, 0, self.conv_size - 1, 0))[:, T:].detach()
                w = short_conv_w(w, weight, D, state=state, cu_seqlens=cu_seqlens)
            w = w.to(fdtype)
        else:
            w = F.normalize(w.to(fdtype).view(B, T, H, D), p=2.0, dim=-1)  # [B, T, H, D], unit norm
        beta = 2.0 * torch.sigmoid(self.bt_proj(x).to(fdtype))  # [B, T, H] in (0, 2)
        if self.beta_max is not None:
            beta = beta.clamp(0.0, self.beta_max)
        g = F.logsigmoid(self.g_proj(x).to(fdtype)) if self.use_forget_gate else None  # [B, T, HQ]
        if g is not None and self.gate_scale == "fla":  # scale (s + G_i - G_j): scaling g scales its sums G
            g = g * D ** -0.5

        if cp_group is not None:
            o = context_parallel_attention(q, k, v, w, beta, g, group=cp_group, layout=cp_layout,
                                           deterministic=self.deterministic)
        elif cache is None:
            o = path_attention(q, k, v, w, beta, g, cu_seqlens=cu_seqlens,
                               deterministic=self.deterministic)  # [B, T, HQ, D]
        elif cache.kv is None:  # prefill: the key cache on the tokens' device
            with torch.no_grad():
                o, _, kcache = prefill(q, k, v, w, beta, g)
                cache.kv = DecodeCache.from_prefill(kcache, v, g, Tmax=2 * T, checkpoint=cache.checkpoint)
                cache.length = T
        else:
            with torch.no_grad():
                if cache.length + T > cache.kv.k.shape[1]:  # grow only when full (reserve reads the lengths back)
                    cache.kv.reserve(T)
                o = decode(q, k, v, w, beta, cache.kv, g=g, commit=commit)
                if commit:
                    cache.length += T
        return self.o_proj(o.reshape(B, T, HQ * D))

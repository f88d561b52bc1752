# Helpers of the Python tests: import pathattn (skipping the module with the reason when the library is not
# built), random valid inputs, and the reference of docs/spec.md §1 written plainly in PyTorch.
import pytest
import torch


def import_pathattn():
    """pathattn, or a module-level skip naming what is missing (only when the library is not built)."""
    try:
        import pathattn
    except ImportError as e:  # LibraryNotFoundError is an ImportError; a broken library raises OSError
        pytest.skip(f"pathattn is not built: {e}", allow_module_level=True)
    return pathattn


def reference(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None):
    """docs/spec.md §1, the key-cache recurrence, one (sequence, query head) at a time: at step t every cached key c_j
    becomes c_j - beta_t (c_j . w_t) w_t, then k_t is appended, then softmax attention of q_t over the cache
    with the gate bias G_t - G_j (not scaled). Returns o [B, T, HQ, DV] and lse [B, T, HQ]."""
    B, T, HQ, D = q.shape
    H, DV = k.shape[2], v.shape[3]
    group = HQ // H
    scale = D ** -0.5 if scale is None else scale
    o = torch.zeros(B, T, HQ, DV, dtype=q.dtype)
    lse = torch.zeros(B, T, HQ, dtype=q.dtype)
    if cu_seqlens is None:
        segments = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        segments = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]
    for b, t0, t1 in segments:
        for hq in range(HQ):
            h = hq // group
            cache = []  # keys carried to the current step
            G = torch.zeros((), dtype=q.dtype)
            Gs = []
            for t in range(t0, t1):
                wt, bt = w[b, t, h], beta[b, t, h]
                cache = [c - bt * (c @ wt) * wt for c in cache]
                cache.append(k[b, t, h])
                if g is not None:
                    G = G + g[b, t, hq]
                Gs.append(G)
                K = torch.stack(cache)  # [t - t0 + 1, D]
                logits = scale * (K @ q[b, t, hq]) + (Gs[-1] - torch.stack(Gs))
                p = torch.softmax(logits, 0)
                o[b, t, hq] = p @ v[b, t0 : t + 1, h]
                lse[b, t, hq] = torch.logsumexp(logits, 0)
    return o, lse


def random_inputs(B, T, H, HQ, D, DV, gate=False, seqlens=None, dtype=torch.float32, seed=0):
    """Random valid inputs: unit-norm w, beta uniform in [0, 2], g in [-1, 0]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, D, generator=gen, dtype=dtype)
    v = torch.randn(B, T, H, DV, generator=gen, dtype=dtype)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen, dtype=dtype)
    g = -torch.rand(B, T, HQ, generator=gen, dtype=dtype) if gate else None
    cu = None
    if seqlens is not None:
        cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), dtype=torch.int32)
    return dict(q=q, k=k, v=v, w=w, beta=beta, g=g, cu_seqlens=cu)

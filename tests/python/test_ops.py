# The op against a plain PyTorch loop of docs/spec.md §1 (the key-cache recurrence).
import pytest
import torch

from helpers import import_pathattn, random_inputs, reference
from tolerances import F32_VS_REFERENCE_ATOL, F32_VS_REFERENCE_RTOL, F64_VS_REFERENCE_ATOL

pathattn = import_pathattn()

# (B, T, H, HQ, D, DV, gate, seqlens)
CASES = {
    "plain": (2, 17, 2, 2, 8, 8, False, None),
    "gate": (1, 23, 1, 1, 16, 16, True, None),
    "gqa": (1, 19, 1, 4, 8, 8, True, None),
    "dv": (2, 13, 2, 2, 8, 12, False, None),
    "varlen": (1, 24, 2, 4, 8, 8, True, [5, 1, 11, 7]),
    "d32": (1, 40, 1, 2, 32, 16, False, None),
}


@pytest.mark.parametrize("name", CASES)
def test_forward_matches_reference_f32(name):
    B, T, H, HQ, D, DV, gate, seqlens = CASES[name]
    x = random_inputs(B, T, H, HQ, D, DV, gate=gate, seqlens=seqlens, seed=1)
    o, lse = pathattn.path_attention(**x, return_lse=True)
    # The loop runs in f64 so that the comparison measures the op's f32 error only.
    x64 = {n: (t.double() if t is not None and t.is_floating_point() else t) for n, t in x.items()}
    o_ref, lse_ref = reference(**x64)
    assert o.shape == (B, T, HQ, DV) and o.dtype == torch.float32
    assert lse.shape == (B, T, HQ) and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), o_ref, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)


def test_forward_matches_reference_f64_with_scale():
    x = random_inputs(1, 11, 1, 2, 4, 6, gate=True, dtype=torch.float64, seed=2)
    o = pathattn.path_attention(**x, scale=0.37)
    o_ref, _ = reference(**x, scale=0.37)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=F64_VS_REFERENCE_ATOL)


def test_strided_inputs_give_the_same_result():
    # [B, H, T, D] storage viewed as [B, T, H, D]: the op reads strides, no copy needed.
    x = random_inputs(2, 9, 2, 2, 8, 8, gate=True, seed=3)
    strided = dict(x)
    for n in ("q", "k", "v", "w"):
        strided[n] = x[n].transpose(1, 2).contiguous().transpose(1, 2)
        assert not strided[n].is_contiguous()
    torch.testing.assert_close(pathattn.path_attention(**strided), pathattn.path_attention(**x), rtol=0, atol=0)


def test_prefill_key_cache_carries_keys_to_the_end():
    # docs/spec.md §4: kcache[j] = H_L ... H_{j+1} k_j within each sequence of the packed batch.
    x = random_inputs(1, 10, 2, 2, 4, 4, seqlens=[6, 4], dtype=torch.float64, seed=4)
    o, lse, kcache = pathattn.prefill(**x)
    expect = x["k"].clone()
    for t0, t1 in [(0, 6), (6, 10)]:
        for j in range(t0, t1):
            for t in range(j + 1, t1):
                wt, bt = x["w"][0, t], x["beta"][0, t]  # [H, D], [H]
                kj = expect[0, j]
                expect[0, j] = kj - bt[:, None] * (kj * wt).sum(-1, keepdim=True) * wt
    torch.testing.assert_close(kcache, expect, rtol=0, atol=F64_VS_REFERENCE_ATOL)
    torch.testing.assert_close(o, pathattn.path_attention(**x), rtol=0, atol=0)


def test_deterministic_switch_is_accepted_and_cpu_is_always_deterministic():
    """path_attention(..., deterministic=False) reaches the backward op (the CUDA kernels' free summation order);
    the CPU backward sums in one order either way, so its gradients are the same bits."""
    x = random_inputs(1, 70, 2, 4, 16, 16, gate=True, seed=21)
    grads = []
    for det in (True, False):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if t is not None and t.is_floating_point()}
        o = pathattn.path_attention(**{**x, **leaves}, deterministic=det)
        o.square().sum().backward()
        grads.append([leaves[n].grad for n in sorted(leaves)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)

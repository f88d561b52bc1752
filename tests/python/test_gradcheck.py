# torch.autograd.gradcheck in f64 (the op runs the f64 reference) on small shapes.
import pytest
import torch

from helpers import import_pathattn, random_inputs
from tolerances import GRADCHECK_ATOL, GRADCHECK_EPS, GRADCHECK_RTOL

pathattn = import_pathattn()

# (B, T, H, HQ, D, DV, gate, seqlens)
CASES = {
    "plain": (1, 5, 1, 1, 4, 4, False, None),
    "gate": (2, 4, 1, 1, 3, 3, True, None),
    "gqa": (1, 5, 1, 3, 3, 3, True, None),
    "dv": (1, 5, 2, 2, 3, 5, False, None),
    "varlen": (1, 7, 1, 2, 3, 2, True, [3, 1, 3]),
}


def gradcheck_case(name, seed, return_lse):
    """gradcheck of o (or of (o, lse)) with respect to q, k, v, w, beta[, g] on CASES[name]."""
    B, T, H, HQ, D, DV, gate, seqlens = CASES[name]
    x = random_inputs(B, T, H, HQ, D, DV, gate=gate, seqlens=seqlens, dtype=torch.float64, seed=seed)
    # Keep +-eps steps inside the valid ranges: beta in [0.1, 1.9], g in [-1.1, -0.1].
    x["beta"] = 0.1 + 0.9 * x["beta"]
    if gate:
        x["g"] = x["g"] - 0.1
    names = ["q", "k", "v", "w", "beta"] + (["g"] if gate else [])
    leaves = [x[n].clone().requires_grad_(True) for n in names]

    def f(*ts):  # q, k, v, w, beta[, g] -> o or (o, lse)
        return pathattn.path_attention(
            *ts[:5], g=ts[5] if gate else None, cu_seqlens=x["cu_seqlens"], return_lse=return_lse
        )

    return torch.autograd.gradcheck(f, leaves, eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL, rtol=GRADCHECK_RTOL)


@pytest.mark.parametrize("name", CASES)
def test_gradcheck(name):
    assert gradcheck_case(name, seed=5, return_lse=False)


@pytest.mark.parametrize("name", ["plain", "gqa", "varlen"])
def test_gradcheck_with_lse(name):
    """Both outputs differentiable: gradcheck of (o, lse), i.e. every loss of o and lse (delta_i - dlse_i)."""
    assert gradcheck_case(name, seed=6, return_lse=True)

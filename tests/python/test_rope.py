"""pathattn.rope_rotate, RoPE's fused rotation, on the CPU: the same values as the composition it replaces (forward
and gradient, float32 bit for bit), the transposed rotation's gradient against finite differences in float64, and
errors naming the argument. The CUDA dtypes are checked bit for bit in tests/model/test_model_cuda.cpp."""
import pytest
import torch

from helpers import import_pathattn

pathattn = import_pathattn()


def tables(T, half, dtype):
    inv = torch.pow(10000.0, -torch.arange(half, dtype=dtype) / half)
    ang = torch.arange(T, dtype=dtype)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def composed(x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x1, x2 = x[..., :half].to(acc), x[..., half:].to(acc)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_the_composition_bit_for_bit(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 33, 3, 64, dtype=dtype)
    cos, sin = tables(33, 32, dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = pathattn.rope_rotate(xa, cos, sin), composed(xb, cos, sin)
    assert torch.equal(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert torch.equal(xa.grad, xb.grad)


def test_gradcheck():
    torch.manual_seed(1)
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(5, 4, torch.float64)
    assert torch.autograd.gradcheck(lambda t: pathattn.rope_rotate(t, cos, sin), (x,))


def test_errors_name_the_argument():
    cos, sin = tables(5, 4, torch.float32)
    with pytest.raises(RuntimeError, match="cos"):
        pathattn.rope_rotate(torch.randn(1, 5, 2, 8), cos[:4], sin)
    with pytest.raises(RuntimeError, match="even"):
        pathattn.rope_rotate(torch.randn(1, 5, 2, 7), cos, sin)
    with pytest.raises(RuntimeError, match="x"):
        pathattn.rope_rotate(torch.randn(5, 2, 8), cos, sin)

# pathattn.short_conv_w, the layer's fused conv + SiLU + L2 norm (docs/math.md Eq. 44-46): equal to the composition it
# replaces (the layer's ShortConvolution and F.normalize) with a state and with cu_seqlens, gradcheck in float64
# (u, weight and state), 16-bit CPU input through float32, named errors; on CUDA against the CPU in float64.
import pytest
import torch
import torch.nn.functional as F

from helpers import import_pathattn

pathattn = import_pathattn()
from pathattn.layer import ShortConvolution  # noqa: E402


def composition(conv, u, head_dim, state=None, cu_seqlens=None):
    B, T, C = u.shape
    y = conv.step(u, state)[0] if state is not None else conv(u, cu_seqlens)
    return F.normalize(y.view(B, T, C // head_dim, head_dim), p=2.0, dim=-1)


def make(B=2, T=11, H=3, D=4, K=4, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    conv = ShortConvolution(H * D, K).to(dtype)
    with torch.no_grad():
        conv.weight.normal_(0.0, 0.5)
    u = torch.randn(B, T, H * D, dtype=dtype)
    return conv, u


@pytest.mark.parametrize("K", [1, 3, 4])
def test_equals_the_composition(K):
    conv, u = make(K=K)
    got = pathattn.short_conv_w(u, conv.weight, 4)
    torch.testing.assert_close(got, composition(conv, u, 4), rtol=1e-12, atol=1e-12)


def test_with_a_state_and_with_cu_seqlens():
    conv, u = make(B=2, T=7, K=4)
    state = torch.randn(2, 3, u.shape[2], dtype=u.dtype)
    torch.testing.assert_close(pathattn.short_conv_w(u, conv.weight, 4, state=state),
                               composition(conv, u, 4, state=state), rtol=1e-12, atol=1e-12)
    conv, u = make(B=1, T=12, K=3)
    cu = torch.tensor([0, 1, 5, 5, 6, 12], dtype=torch.int32)  # length-1 and empty sequences
    torch.testing.assert_close(pathattn.short_conv_w(u, conv.weight, 4, cu_seqlens=cu),
                               composition(conv, u, 4, cu_seqlens=cu), rtol=1e-12, atol=1e-12)


def test_gradcheck_in_u_weight_and_state():
    conv, u = make(B=2, T=6, H=2, D=3, K=3)
    weight = conv.weight.detach().clone().requires_grad_(True)
    u.requires_grad_(True)
    state = torch.randn(2, 2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: pathattn.short_conv_w(a, b, 3, state=c), (u, weight, state))
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32)
    u1 = torch.randn(1, 6, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: pathattn.short_conv_w(a, b, 3, cu_seqlens=cu), (u1, weight))


def test_16bit_cpu_input_runs_in_float32():
    conv, u = make(dtype=torch.float32)
    ub = u.to(torch.bfloat16).requires_grad_(True)
    w = pathattn.short_conv_w(ub, conv.weight, 4)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, composition(conv, ub.detach().float(), 4), rtol=1e-5, atol=1e-6)
    w.sum().backward()
    assert ub.grad.dtype == torch.bfloat16 and ub.grad.shape == ub.shape


def test_errors_name_the_argument():
    conv, u = make()
    with pytest.raises(RuntimeError, match="head_dim must be a positive divisor"):
        pathattn.short_conv_w(u, conv.weight, 5)
    with pytest.raises(RuntimeError, match=r"weight must have shape \[C, K\]"):
        pathattn.short_conv_w(u, conv.weight[:-1], 4)
    with pytest.raises(RuntimeError, match=r"state must have shape \[B, K - 1, C\]"):
        pathattn.short_conv_w(u, conv.weight, 4, state=torch.zeros(2, 2, 12, dtype=u.dtype))
    with pytest.raises(RuntimeError, match="cu_seqlens.*requires B == 1"):
        pathattn.short_conv_w(u, conv.weight, 4, cu_seqlens=torch.tensor([0, 11], dtype=torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", ["plain", "state", "varlen"])
def test_cuda_matches_the_cpu_in_float64(dtype, mode):
    B, T = (1, 150) if mode == "varlen" else (3, 150)
    conv, u = make(B=B, T=T, H=4, D=64, K=4, dtype=torch.float32)
    u = u.to(dtype)
    weight = conv.weight.detach()
    state = torch.randn(B, 3, 256).to(dtype) if mode == "state" else None
    cu = torch.tensor([0, 1, 70, 71, 150], dtype=torch.int32) if mode == "varlen" else None
    dw = torch.randn(B, T, 4, 64)
    ud = u.cuda().requires_grad_(True)
    wd = weight.cuda().requires_grad_(True)
    sd = state.cuda().requires_grad_(True) if state is not None else None
    w = pathattn.short_conv_w(ud, wd, 64, state=sd, cu_seqlens=cu.cuda() if cu is not None else None)
    w.backward(dw.cuda())
    u64 = u.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    s64 = state.double().requires_grad_(True) if state is not None else None
    ref = pathattn.short_conv_w(u64, w64, 64, state=s64, cu_seqlens=cu)
    ref.backward(dw.double())
    torch.testing.assert_close(w.double().cpu(), ref, rtol=0, atol=3e-5)
    ulp = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(ud.grad.double().cpu(), u64.grad, rtol=ulp, atol=2e-5 * u64.grad.abs().max().item())
    torch.testing.assert_close(wd.grad.double().cpu(), w64.grad, rtol=0, atol=1e-4 * w64.grad.abs().max().item())
    if state is not None:
        torch.testing.assert_close(sd.grad.double().cpu(), s64.grad, rtol=ulp,
                                   atol=2e-5 * s64.grad.abs().max().item())

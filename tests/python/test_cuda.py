# The op on CUDA tensors (bf16): forward and backward (loss.backward() through the CUDA kernels) against the f64
# reference with FlashAttention's 2x rule.
import pytest
import torch

from helpers import import_pathattn, random_inputs, reference
from tolerances import LOW_PRECISION_ATOL, LOW_PRECISION_FACTOR, SUMMATION_ORDER_BF16_RTOL

pathattn = import_pathattn()

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (this machine has only a CPU); runs on the H200 machine"
)

# The CUDA kernels take D = DV in {64, 128} (src/cuda/api.cu supports()).
B, T, H, HQ, D = 1, 48, 2, 4, 64


def cast(x, dtype, device="cpu"):
    return {n: (t.to(device, dtype) if t is not None and t.is_floating_point() else t) for n, t in x.items()}


def cuda_inputs(x):
    """q, k, v in bf16, w, beta, g in f32 (docs/spec.md §2), from bf16-rounded values so every path sees the same
    inputs."""
    y = cast(x, torch.bfloat16)
    y = {n: (t.to("cuda") if t is not None else None) for n, t in y.items()}
    for n in ("w", "beta", "g"):
        if y[n] is not None:
            y[n] = y[n].float()
    return y


@pytest.mark.parametrize("gate", [False, True])
def test_forward_bf16_against_f64(gate):
    x = random_inputs(B, T, H, HQ, D, D, gate=gate, seed=11)
    x = cast(cast(x, torch.bfloat16), torch.float64)  # the inputs every path sees, exactly
    o_ref, lse_ref = reference(**x)
    o_plain, _ = reference(**cast(x, torch.bfloat16))  # the same math done plainly in bf16
    o, lse = pathattn.path_attention(**cuda_inputs(x), return_lse=True)
    assert o.dtype == torch.bfloat16 and o.shape == (B, T, HQ, D) and lse.dtype == torch.float32
    err = (o.double().cpu() - o_ref).abs().max().item()
    err_plain = (o_plain.double() - o_ref).abs().max().item()
    assert err <= LOW_PRECISION_FACTOR * err_plain + LOW_PRECISION_ATOL, (err, err_plain)
    err_lse = (lse.double().cpu() - lse_ref).abs().max().item()
    assert err_lse <= LOW_PRECISION_FACTOR * err_plain + LOW_PRECISION_ATOL, (err_lse, err_plain)


@pytest.mark.parametrize("gate", [False, True])
def test_backward_bf16_against_f64(gate):
    x = random_inputs(B, T, H, HQ, D, D, gate=gate, seed=12)
    x = cast(cast(x, torch.bfloat16), torch.float64)
    xc = cuda_inputs(x)
    names = ["q", "k", "v", "w", "beta"] + (["g"] if gate else [])
    for n in names:
        xc[n].requires_grad_(True)
    do = torch.randn(B, T, HQ, D, dtype=torch.float64)
    o = pathattn.path_attention(**xc)
    o.backward(do.to("cuda", o.dtype))
    leaves64 = [x[n].clone().requires_grad_(True) for n in names]
    leaves16 = [x[n].to(torch.bfloat16).requires_grad_(True) for n in names]
    (reference(*leaves64)[0] * do).sum().backward()
    (reference(*leaves16)[0] * do.to(torch.bfloat16)).sum().backward()
    for n, l64, l16 in zip(names, leaves64, leaves16):
        err = (xc[n].grad.double().cpu() - l64.grad).abs().max().item()
        err_plain = (l16.grad.double() - l64.grad).abs().max().item()
        assert err <= LOW_PRECISION_FACTOR * err_plain + LOW_PRECISION_ATOL, (n, err, err_plain)


def test_runs_on_the_current_stream():
    """On a side stream, the op orders after the work that produced its inputs there (torch's current stream),
    as torch's own ops do. With the kernels on the legacy default stream (the first version) this reads q before
    the side stream has written it."""
    x = random_inputs(2, 1024, 2, 2, D, D, seed=13)
    xc = cuda_inputs(x)
    expected = pathattn.path_attention(**xc)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time on the side stream before q exists
        q = xc["q"].clone()
        o = pathattn.path_attention(**{**xc, "q": q})
    side.synchronize()
    assert torch.equal(o, expected)


def test_decode_on_cuda_with_a_cpu_cache_is_a_named_error():
    """The CUDA decode keeps its cache (and lengths) on q's device; DecodeCache(...) without a device is on the CPU:
    CUDA tensors with it get the core's message naming the cache, not a dispatcher error (a CUDA cache:
    tests/python/test_decode_cuda.py)."""
    x = random_inputs(1, 2, 1, 1, D, D, seed=14)
    xc = cuda_inputs(x)
    xc.pop("cu_seqlens")
    with pytest.raises(RuntimeError, match="cache.k .* must be on the device of q"):
        pathattn.decode(**xc, cache=pathattn.DecodeCache(1, 8, 1, D))


@pytest.mark.parametrize("gate", [False, True])
def test_layer_is_causal_on_cuda(gate):
    """The layer (short conv, gate, op) on CUDA in bf16: changing the tokens after position t changes nothing before
    t, and the gradient of a loss on the outputs before t is zero on the inputs after t, through the CUDA backward."""
    torch.manual_seed(5)
    layer = pathattn.PaTHAttention(hidden_size=256, num_heads=4, use_forget_gate=gate).cuda()
    T, t = 300, 137
    x = torch.randn(2, T, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
        x2 = x.detach().clone()
        x2[:, t:] = torch.randn_like(x2[:, t:])
        y2 = layer(x2)
    assert torch.equal(y[:, :t], y2[:, :t])
    y[:, :t].float().square().sum().backward()
    assert x.grad[:, :t].abs().sum() > 0
    assert torch.count_nonzero(x.grad[:, t:]) == 0


def test_backward_deterministic_switch():
    """deterministic=True (the default): two backward calls give the same bits; False: the same values to the
    low-precision rule (atomics in arrival order)."""
    x = random_inputs(2, 700, 2, 8, D, D, gate=True, seed=15)
    xc = cuda_inputs(x)
    names = ["q", "k", "v", "w", "beta", "g"]
    do = torch.randn(2, 700, 8, D, device="cuda", dtype=torch.bfloat16)

    def grads(det):
        leaves = {n: xc[n].detach().clone().requires_grad_(True) for n in names}
        o = pathattn.path_attention(**{**xc, **leaves}, deterministic=det)
        o.backward(do)
        return [leaves[n].grad for n in names]

    a, b, c = grads(True), grads(True), grads(False)
    for n, ga, gb, gc in zip(names, a, b, c):
        assert torch.equal(ga, gb), n
        assert (gc.float() - ga.float()).norm() <= SUMMATION_ORDER_BF16_RTOL * ga.float().norm(), n


def test_workspace_limit_cuts_the_backward_peak_and_keeps_the_bits(monkeypatch):
    """PATHATTN_CUDA_WORKSPACE_MB (Inputs::cuda_workspace_limit): a limit below the backward's scratch runs it over
    one kv head at a time, and the torch op frees each slice's block before the next (torch/ops.cpp make_inputs),
    so the peak during the backward falls by about the scratch of the heads not in flight (B 4, T 1024, H 16,
    D 64: ~96 MB of per-head scratch, 6 MB per head, beside ~35 MB of slots that stay, which the chunk-local
    stage's scratch reuses: src/cuda/workspace_tables.h) with the same gradients."""
    Bw, Tw, Hw = 4, 1024, 16
    x = random_inputs(Bw, Tw, Hw, Hw, D, D, gate=True, seed=16)
    xc = cuda_inputs(x)
    names = ["q", "k", "v", "w", "beta", "g"]
    do = torch.randn(Bw, Tw, Hw, D, device="cuda", dtype=torch.bfloat16)

    def grads_and_peak(limit_mb):
        monkeypatch.setenv("PATHATTN_CUDA_WORKSPACE_MB", str(limit_mb))
        leaves = {n: xc[n].detach().clone().requires_grad_(True) for n in names}
        o = pathattn.path_attention(**{**xc, **leaves})
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o.backward(do)
        torch.cuda.synchronize()
        return [leaves[n].grad for n in names], torch.cuda.max_memory_allocated() - before

    whole, peak_whole = grads_and_peak(0)
    sliced, peak_sliced = grads_and_peak(1)
    for n, a, b in zip(names, whole, sliced):
        assert torch.equal(a, b), n
    assert peak_sliced < peak_whole - 60e6, (peak_whole, peak_sliced)

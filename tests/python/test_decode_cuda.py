# Decoding on CUDA through the torch op and the layer: the cache (k, v f32, gcum f64, lengths int32) on the device,
# q, k, v in bf16, w, beta, g in f32 (docs/cuda.md "Decode"). A prefill then decode steps equal the full CUDA forward
# (both held to FlashAttention's rule against the f64 reference), S tokens in one call equal S calls of one, the
# PaTHAttention layer with a PaTHLayerCache equals its full forward (under autocast and in bf16), and wrong devices or
# dtypes are errors naming the tensor. Each test also runs on the CPU in f32 against the CPU decode, with the f32
# tolerances: the same steps and checks, so a CPU-only machine exercises the test's logic (the CUDA cases skip).
import copy

import pytest
import torch

from helpers import import_pathattn, random_inputs, reference
from tolerances import (
    BF16_UNIT_ROUNDOFF,
    CUDA_DECODE_VS_CPU_RTOL,
    F32_VS_REFERENCE_ATOL,
    F32_VS_REFERENCE_RTOL,
    LOW_PRECISION_ATOL,
    LOW_PRECISION_FACTOR,
)

pathattn = import_pathattn()

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (this machine has only a CPU); runs on the H200 machine (tools/gpu_check.sh torch)",
)
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

# The CUDA kernels take D = DV in {64, 128}; T0 = 70 puts the prefill past one 64-token chunk.
D = 64


def rows(x, t0, t1):
    return {n: (t[:, t0:t1] if t is not None and t.dim() >= 2 else t) for n, t in x.items()}


def exact_inputs(B, T, H, HQ, gate, seed):
    """f64 inputs that bf16 represents exactly (w, beta, g too), so the CUDA run, the f64 reference and the plain
    bf16 reference see the same numbers."""
    x = random_inputs(B, T, H, HQ, D, D, gate=gate, seed=seed)
    x.pop("cu_seqlens")
    return {n: (t.to(torch.bfloat16).double() if t is not None else None) for n, t in x.items()}


def on_device(x, device):
    """CPU: every input f32 (the CPU op). CUDA: q, k, v bf16, w, beta, g f32 (docs/spec.md §2)."""
    if device == "cpu":
        return {n: (t.float() if t is not None else None) for n, t in x.items()}
    return {
        n: (None if t is None else t.to("cuda", torch.bfloat16 if n in ("q", "k", "v") else torch.float32))
        for n, t in x.items()
    }


def max_err(a, b):
    return (a.double().cpu() - b.double().cpu()).abs().max().item()


def rel_l2(a, ref):
    ref = ref.double().cpu()
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("H,HQ", [(2, 2), (2, 8)])  # MHA and GQA (4 query heads per kv head)
def test_prefill_then_decode_equals_the_full_forward(device, gate, H, HQ):
    B, T0, steps = 2, 70, [1, 5, 1, 1]
    T = T0 + sum(steps)
    x = exact_inputs(B, T, H, HQ, gate, seed=41)
    xd = on_device(x, device)
    full, full_lse = pathattn.path_attention(**xd, return_lse=True)
    o0, lse0, kcache = pathattn.prefill(**rows(xd, 0, T0))
    cache = pathattn.DecodeCache.from_prefill(kcache, xd["v"][:, :T0], xd["g"][:, :T0] if gate else None, Tmax=T)
    assert cache.k.device == kcache.device and cache.lengths.device == kcache.device
    assert cache.k.dtype == torch.float32 and cache.lengths.dtype == torch.int32
    outs, lses, t = [o0], [lse0], T0
    for s in steps:
        o, lse = pathattn.decode(**rows(xd, t, t + s), cache=cache, return_lse=True)
        assert o.device == kcache.device and o.dtype == xd["v"].dtype and o.shape == (B, s, HQ, D)
        outs.append(o)
        lses.append(lse)
        t += s
    got, got_lse = torch.cat(outs, 1), torch.cat(lses, 1)
    assert cache.lengths.tolist() == [T] * B  # advanced on the device by the kernels

    if device == "cpu":
        torch.testing.assert_close(got, full, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        torch.testing.assert_close(got_lse, full_lse, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        return
    # Both the decoded and the full CUDA outputs within FlashAttention's rule of the f64 reference, so within twice
    # the rule of each other.
    o_ref, lse_ref = pathattn.path_attention(**x, return_lse=True)  # f64: the reference backend
    o_plain, _ = reference(**{n: (t.to(torch.bfloat16) if t is not None else None) for n, t in x.items()})
    bound = LOW_PRECISION_FACTOR * max_err(o_plain, o_ref) + LOW_PRECISION_ATOL
    for name, a, ref in [("decode o", got, o_ref), ("decode lse", got_lse, lse_ref), ("full o", full, o_ref),
                         ("full lse", full_lse, lse_ref)]:
        assert max_err(a, ref) <= bound, (name, max_err(a, ref), bound)
    assert max_err(got, full) <= 2 * bound, (max_err(got, full), bound)
    assert max_err(got[:, T0:], o_ref[:, T0:]) <= bound  # the decoded rows alone
    # Tighter: the CPU decode from the same (CUDA prefill's) key cache on the same inputs in f32.
    xc = on_device(x, "cpu")
    cpu_cache = pathattn.DecodeCache.from_prefill(
        kcache.cpu().float(), xc["v"][:, :T0], xc["g"][:, :T0] if gate else None, Tmax=T
    )
    cpu_o, cpu_lse = pathattn.decode(**rows(xc, T0, T), cache=cpu_cache, return_lse=True)
    assert rel_l2(got[:, T0:], cpu_o) <= CUDA_DECODE_VS_CPU_RTOL + BF16_UNIT_ROUNDOFF
    assert rel_l2(got_lse[:, T0:], cpu_lse) <= CUDA_DECODE_VS_CPU_RTOL
    for name in ("k", "v") + (("gcum",) if gate else ()):
        assert rel_l2(getattr(cache, name), getattr(cpu_cache, name)) <= CUDA_DECODE_VS_CPU_RTOL, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("S", [3, 6])
def test_s_tokens_at_once_equal_one_by_one(device, gate, S):
    """On CUDA a call of fewer than 4 tokens (PATHATTN_DECODE_CHUNK's default) runs the same S single-token steps in
    order (docs/cuda.md "Decode": the same kernels, splits and partitions of the rows), so it gives the same bits as
    S calls of one token, outputs and cache alike; a call of 4 or more runs as one chunk (one UT factor, one pass
    over the cache): equal to f32 rounding, as the CPU's, which carries every call of S tokens with one UT factor.
    The values and lengths are equal either way."""
    B, T0, H, HQ = 2, 40, 2, 4
    x = on_device(exact_inputs(B, T0 + S, H, HQ, gate, seed=42), device)
    _, _, kcache = pathattn.prefill(**rows(x, 0, T0))
    caches = [
        pathattn.DecodeCache.from_prefill(kcache, x["v"][:, :T0], x["g"][:, :T0] if gate else None, Tmax=T0 + S)
        for _ in range(2)
    ]
    o_all, lse_all = pathattn.decode(**rows(x, T0, T0 + S), cache=caches[0], return_lse=True)
    singles = [pathattn.decode(**rows(x, t, t + 1), cache=caches[1], return_lse=True) for t in range(T0, T0 + S)]
    o_one, lse_one = torch.cat([o for o, _ in singles], 1), torch.cat([lse for _, lse in singles], 1)
    pairs = [("o", o_all, o_one), ("lse", lse_all, lse_one), ("cache.k", caches[0].k, caches[1].k),
             ("cache.v", caches[0].v, caches[1].v), ("cache.lengths", caches[0].lengths, caches[1].lengths)]
    if gate:
        pairs.append(("cache.gcum", caches[0].gcum, caches[1].gcum))
    for name, a, b in pairs:
        if (device == "cuda" and S < 4) or name in ("cache.v", "cache.lengths"):
            assert torch.equal(a, b), name
        elif device == "cuda":  # the chunk against S single steps: f32 rounding (o in bf16: plus its rounding)
            rtol = CUDA_DECODE_VS_CPU_RTOL + (BF16_UNIT_ROUNDOFF if name == "o" else 0.0)
            assert rel_l2(a.double(), b.double()) <= rtol, (name, rel_l2(a.double(), b.double()))
        else:
            torch.testing.assert_close(a, b, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", [False, True])
def test_without_commit_the_cache_is_untouched(device, gate):
    """commit=False (speculative decoding: verify draft tokens, then decode the accepted ones): o and lse as the
    committing call gives them (the CPU: the same code, bit for bit; CUDA: to f32 rounding), the cache tensors and
    lengths unchanged; then committing the accepted prefix continues the sequence as if the draft had not been
    tried. A checkpointed cache is refused by name."""
    B, T0, S, H, HQ = 2, 40, 6, 2, 4
    x = on_device(exact_inputs(B, T0 + S, H, HQ, gate, seed=43), device)
    _, _, kcache = pathattn.prefill(**rows(x, 0, T0))
    tried, committed = [
        pathattn.DecodeCache.from_prefill(kcache, x["v"][:, :T0], x["g"][:, :T0] if gate else None, Tmax=T0 + S)
        for _ in range(2)
    ]
    before = {n: getattr(tried, n).clone() for n in ("k", "v", "lengths") + (("gcum",) if gate else ())}
    o_try, lse_try = pathattn.decode(**rows(x, T0, T0 + S), cache=tried, return_lse=True, commit=False)
    for name, t in before.items():
        assert torch.equal(getattr(tried, name), t), name
    o, lse = pathattn.decode(**rows(x, T0, T0 + S), cache=committed, return_lse=True)
    if device == "cuda":
        assert rel_l2(o_try, o) <= CUDA_DECODE_VS_CPU_RTOL + BF16_UNIT_ROUNDOFF
        assert rel_l2(lse_try, lse) <= CUDA_DECODE_VS_CPU_RTOL
    else:
        assert torch.equal(o_try, o) and torch.equal(lse_try, lse)
    accepted = 4  # the draft's first 4 tokens: committed on the tried cache, which then matches the committed one's
    pathattn.decode(**rows(x, T0, T0 + accepted), cache=tried)
    assert torch.equal(tried.lengths, torch.full_like(tried.lengths, T0 + accepted))
    o_rest = pathattn.decode(**rows(x, T0 + accepted, T0 + S), cache=tried)
    assert rel_l2(o_rest, o[:, accepted:]) <= CUDA_DECODE_VS_CPU_RTOL + BF16_UNIT_ROUNDOFF
    assert rel_l2(tried.k, committed.k) <= CUDA_DECODE_VS_CPU_RTOL
    ckpt = pathattn.DecodeCache.from_prefill(
        kcache, x["v"][:, :T0], x["g"][:, :T0] if gate else None, Tmax=T0 + S, checkpoint=16
    )
    with pytest.raises(RuntimeError, match="commit = false takes the plain cache"):
        pathattn.decode(**rows(x, T0, T0 + S), cache=ckpt, commit=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("period", [1, 5, 16])
def test_checkpointed_cache_equals_the_plain_one(device, gate, period):
    """The checkpointed cache (docs/math.md Eq. 35-37) through the op: the same outputs as the plain cache over steps
    of 1 and several tokens that cross refreshes, and its keys carried over the pending factors (materialized_k) are
    the plain cache's. On CUDA (kernels/decode_checkpoint.cuh) the two differ by f32 rounding in the order of the
    carries, well inside the rule that both meet against the f64 recurrence."""
    B, T0, steps, H, HQ = 2, 70, [1, 5, 1, 17, 1, 1, 3, 1], 2, 4
    T = T0 + sum(steps)
    x = exact_inputs(B, T, H, HQ, gate, seed=44)
    xd = on_device(x, device)
    _, _, kcache = pathattn.prefill(**rows(xd, 0, T0))
    g0 = xd["g"][:, :T0] if gate else None
    plain = pathattn.DecodeCache.from_prefill(kcache, xd["v"][:, :T0], g0, Tmax=T)
    ck = pathattn.DecodeCache.from_prefill(kcache, xd["v"][:, :T0], g0, Tmax=T, checkpoint=period)
    got, want, t = [], [], T0
    for s in steps:
        got.append(pathattn.decode(**rows(xd, t, t + s), cache=ck))
        want.append(pathattn.decode(**rows(xd, t, t + s), cache=plain))
        t += s
        assert all(0 <= t - c < period for c in ck.ckpt.tolist()), (ck.ckpt.tolist(), t, period)
    got, want = torch.cat(got, 1), torch.cat(want, 1)
    assert ck.lengths.tolist() == [T] * B
    if device == "cpu":
        torch.testing.assert_close(got, want, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        torch.testing.assert_close(ck.materialized_k(), plain.k, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        return
    o_ref = pathattn.path_attention(**x)[:, T0:]  # f64: the reference backend
    o_plain, _ = reference(**{n: (t.to(torch.bfloat16) if t is not None else None) for n, t in x.items()})
    bound = LOW_PRECISION_FACTOR * max_err(o_plain[:, T0:], o_ref) + LOW_PRECISION_ATOL
    assert max_err(got, o_ref) <= bound, (max_err(got, o_ref), bound)
    assert max_err(want, o_ref) <= bound, (max_err(want, o_ref), bound)
    assert rel_l2(ck.materialized_k(), plain.k) <= CUDA_DECODE_VS_CPU_RTOL


LAYER_CONFIGS = {
    "path": dict(),
    "fox_gqa": dict(num_kv_heads=2, use_forget_gate=True),
    "fox_gqa_qknorm": dict(num_kv_heads=2, use_forget_gate=True, use_qk_norm=True),
}


@pytest.mark.parametrize(
    "device,precision",
    [("cpu", "f32"), pytest.param("cuda", "autocast", marks=needs_cuda), pytest.param("cuda", "bf16", marks=needs_cuda)],
)
@pytest.mark.parametrize("config", LAYER_CONFIGS)
def test_layer_with_a_cache_equals_its_full_forward(device, precision, config):
    """PaTHAttention (hidden 256, 4 heads: D = 64) with a PaTHLayerCache: a prompt of 40 tokens, then single tokens
    and a 5-token step up to 90 (past the cache's first room of 80, so it grows once), against one forward over the
    90 tokens. On CUDA both runs are held to FlashAttention's rule with the full forward's own error as the plain
    low-precision one: the cached run's error against the same layer in f64 at most twice the full forward's, plus
    the absolute term (bf16 enters both through the projections' rounding and the op's bf16 inputs)."""
    torch.manual_seed(8)
    layer = pathattn.PaTHAttention(hidden_size=256, num_heads=4, **LAYER_CONFIGS[config])
    with torch.no_grad():  # logits ~2.5 instead of ~0.1 at fla's init, where attention is near uniform and a wrong
        layer.q_proj.weight.mul_(5)  # key cache moves the output by only ~1e-3 (a wrong beta in the decode: 5e-2
        layer.k_proj.weight.mul_(5)  # here, measured on the CPU)
    x = torch.randn(2, 90, 256)
    ref = copy.deepcopy(layer).double()
    if precision == "bf16":
        layer, x = layer.to(torch.bfloat16), x.to(torch.bfloat16)
        ref = copy.deepcopy(layer).double()  # the bf16-rounded weights, exactly
    layer, xd = layer.to(device), x.to(device)
    steps = [1, 1, 5] + [1] * 43

    def run():
        with torch.no_grad():
            full = layer(xd)
            cache = pathattn.PaTHLayerCache()
            parts, t = [layer(xd[:, :40], cache=cache)], 40
            for s in steps:
                parts.append(layer(xd[:, t : t + s], cache=cache))
                t += s
        assert t == 90 and len(cache) == 90 and cache.kv.lengths.tolist() == [90, 90]
        assert cache.kv.k.device == xd.device and cache.kv.k.shape[1] == 160  # 80, doubled once
        if layer.use_w_shortconv:
            assert cache.conv.device == xd.device
        return full, torch.cat(parts, 1)

    if precision == "autocast":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            full, cached = run()
    else:
        full, cached = run()
    if device == "cpu":
        torch.testing.assert_close(cached, full, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        return
    with torch.no_grad():
        y64 = ref(x.double())
    err_full, err_cached = max_err(full, y64), max_err(cached, y64)
    assert err_cached <= LOW_PRECISION_FACTOR * err_full + LOW_PRECISION_ATOL, (err_cached, err_full)


def test_from_prefill_refuses_tensors_on_two_devices():
    """The cache is made on kcache's device; a v elsewhere is an error naming it, not a silent copy (the meta device
    stands in for a second device on a CPU-only machine)."""
    kcache = torch.zeros(1, 3, 1, 8)
    with pytest.raises(RuntimeError, match=r"v must be on kcache's device \(cpu\), got meta"):
        pathattn.DecodeCache.from_prefill(kcache, torch.zeros(1, 3, 1, 8, device="meta"))
    with pytest.raises(RuntimeError, match=r"g must be on kcache's device \(cpu\), got meta"):
        pathattn.DecodeCache.from_prefill(kcache, torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, device="meta"))


@needs_cuda
def test_mismatched_devices_and_dtypes_are_named_errors():
    """The CUDA decode wants every tensor on q's device, q, k, v in bf16 / f16 and the cache in f32 (a CPU cache with
    CUDA inputs: tests/python/test_cuda.py)."""
    x = on_device(exact_inputs(1, 2, 1, 1, False, seed=43), "cuda")
    cache = pathattn.DecodeCache(1, 8, 1, D, device="cuda")
    assert cache.device.type == "cuda" and cache.lengths.device.type == "cuda"
    with pytest.raises(RuntimeError, match=r"cache.k .* must be on the device of q \(cpu:0\), got cuda:0"):
        pathattn.decode(**on_device(exact_inputs(1, 2, 1, 1, False, seed=43), "cpu"), cache=cache)
    cpu_lengths = pathattn.DecodeCache(1, 8, 1, D, device="cuda")
    cpu_lengths.lengths = cpu_lengths.lengths.cpu()
    with pytest.raises(RuntimeError, match="cache.lengths must be an int32 tensor on q's CUDA device"):
        pathattn.decode(**x, cache=cpu_lengths)
    with pytest.raises(RuntimeError, match="q must have dtype bfloat16 or float16, got float32"):
        pathattn.decode(**{**x, "q": x["q"].float()}, cache=cache)
    f16_keys = pathattn.DecodeCache(1, 8, 1, D, device="cuda", k_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="cache.k must have dtype float32 or bfloat16, got float16"):
        pathattn.decode(**x, cache=f16_keys)
    f16_values = pathattn.DecodeCache(1, 8, 1, D, device="cuda", v_dtype=torch.float16)  # x's v is bfloat16
    with pytest.raises(RuntimeError, match=r"cache.v must have dtype float32 or v's dtype \(bfloat16\), got float16"):
        pathattn.decode(**x, cache=f16_values)
    no_carry = pathattn.DecodeCache(1, 8, 1, D, device="cuda", checkpoint=64)
    no_carry.carry = no_carry.carry.cpu()
    with pytest.raises(RuntimeError, match=r"cache.carry"):
        pathattn.decode(**x, cache=no_carry)
    # refused calls change nothing
    assert cache.lengths.tolist() == [0] and f16_keys.lengths.tolist() == [0] and f16_values.lengths.tolist() == [0]

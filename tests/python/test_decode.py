# Decoding with a KV cache through the torch op: prefill, then steps of 1 and several tokens, must equal
# path_attention over the whole sequences (CPU f32); bad caches get errors naming the argument.
import pytest
import torch

from helpers import import_pathattn, random_inputs
from tolerances import F32_VS_REFERENCE_ATOL, F32_VS_REFERENCE_RTOL

pathattn = import_pathattn()


def rows(x, t0, t1):
    return {n: (t[:, t0:t1] if t is not None and t.dim() >= 2 else t) for n, t in x.items()}


@pytest.mark.parametrize("gate", [False, True])
def test_prefill_then_steps_equal_the_whole_forward(gate):
    B, T0, steps, H, HQ, D, DV = 2, 70, [1, 5, 1, 64], 2, 4, 16, 8  # crosses chunk boundaries both ways
    T = T0 + sum(steps)
    x = random_inputs(B, T, H, HQ, D, DV, gate=gate, seed=21)
    x.pop("cu_seqlens", None)
    full, full_lse = pathattn.path_attention(**x, return_lse=True)
    o0, _, kcache = pathattn.prefill(**rows(x, 0, T0))
    torch.testing.assert_close(o0, full[:, :T0], rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
    cache = pathattn.DecodeCache.from_prefill(kcache, x["v"][:, :T0], x["g"][:, :T0] if gate else None, Tmax=T)
    t = T0
    for s in steps:
        o, lse = pathattn.decode(**rows(x, t, t + s), cache=cache, return_lse=True)
        torch.testing.assert_close(o, full[:, t : t + s], rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        torch.testing.assert_close(lse, full_lse[:, t : t + s], rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        t += s
    assert cache.lengths.tolist() == [T] * B


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("period", [1, 5, 64])
def test_checkpointed_cache_equals_the_plain_one(gate, period):
    """The checkpointed cache (docs/math.md Eq. 35-37): the same outputs as the plain cache and the whole forward;
    its keys, carried over the pending factors (materialized_k), are the plain cache's; the checkpoint moves every
    `period` tokens."""
    B, T0, steps, H, HQ, D, DV = 2, 40, [1, 5, 1, 30, 1, 1, 2], 2, 4, 16, 8
    T = T0 + sum(steps)
    x = random_inputs(B, T, H, HQ, D, DV, gate=gate, seed=24)
    x.pop("cu_seqlens", None)
    full = pathattn.path_attention(**x)
    _, _, kcache = pathattn.prefill(**rows(x, 0, T0))
    g0 = x["g"][:, :T0] if gate else None
    plain = pathattn.DecodeCache.from_prefill(kcache, x["v"][:, :T0], g0, Tmax=T)
    ck = pathattn.DecodeCache.from_prefill(kcache, x["v"][:, :T0], g0, Tmax=T, checkpoint=period)
    assert ck.ckpt.tolist() == [T0] * B and ck.carry.shape == (B, H, D, D) and ck.period == period
    t = T0
    for s in steps:
        o = pathattn.decode(**rows(x, t, t + s), cache=ck)
        o_plain = pathattn.decode(**rows(x, t, t + s), cache=plain)
        torch.testing.assert_close(o, o_plain, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        torch.testing.assert_close(o, full[:, t : t + s], rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
        t += s
        assert all(0 <= t - c < period for c in ck.ckpt.tolist()), (ck.ckpt.tolist(), t, period)
    assert ck.lengths.tolist() == [T] * B
    torch.testing.assert_close(ck.materialized_k(), plain.k, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
    if period > 1:  # something is pending: the stored old rows are not the plain cache's
        assert not torch.allclose(ck.k, plain.k, rtol=1e-3, atol=1e-3)


def test_from_an_empty_cache():
    B, T, H, D = 1, 3, 1, 8
    x = random_inputs(B, T, H, H, D, D, seed=22)
    x.pop("cu_seqlens", None)
    cache = pathattn.DecodeCache(B, 8, H, D)
    o = pathattn.decode(**x, cache=cache)
    torch.testing.assert_close(o, pathattn.path_attention(**x), rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)


def test_full_cache_and_wrong_dtype_are_named_errors():
    B, H, D = 1, 1, 8
    x = random_inputs(B, 3, H, H, D, D, seed=23)
    x.pop("cu_seqlens", None)
    cache = pathattn.DecodeCache(B, 2, H, D)
    with pytest.raises(RuntimeError, match="cache.lengths"):
        pathattn.decode(**x, cache=cache)
    x64 = {n: (t.double() if t is not None else None) for n, t in x.items()}
    with pytest.raises(RuntimeError, match="decode runs on CPU float32"):
        pathattn.decode(**x64, cache=pathattn.DecodeCache(B, 8, H, D))
    # Low-precision caches are a CUDA option (tests/python/test_decode_cuda.py); the CPU decode keeps f32 rows.
    with pytest.raises(RuntimeError, match=r"cache.k must have dtype float32 \(the CPU decode\), got bfloat16"):
        pathattn.decode(**x, cache=pathattn.DecodeCache(B, 8, H, D, k_dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"cache.v must have dtype float32 \(the CPU decode\), got bfloat16"):
        pathattn.decode(**x, cache=pathattn.DecodeCache(B, 8, H, D, v_dtype=torch.bfloat16))


def test_layer_with_a_checkpointed_cache_equals_its_full_forward():
    """PaTHAttention decoding through PaTHLayerCache(checkpoint=P): the same outputs as one forward over the whole
    sequence, with refreshes (P = 8) crossed by single tokens and a 5-token step, and past the cache's growth."""
    torch.manual_seed(9)
    layer = pathattn.PaTHAttention(hidden_size=128, num_heads=2)
    with torch.no_grad():  # sharper attention, so that a wrong key cache shows (as test_decode_cuda.py does)
        layer.q_proj.weight.mul_(5)
        layer.k_proj.weight.mul_(5)
    x = torch.randn(2, 70, 128)
    with torch.no_grad():
        full = layer(x)
        cache = pathattn.PaTHLayerCache(checkpoint=8)
        parts, t = [layer(x[:, :30], cache=cache)], 30
        for s in [1, 1, 5] + [1] * 33:
            parts.append(layer(x[:, t : t + s], cache=cache))
            t += s
    assert t == 70 and cache.kv.period == 8 and cache.kv.k.shape[1] == 120  # 60, doubled once
    assert all(0 <= 70 - c < 8 for c in cache.kv.ckpt.tolist())
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)

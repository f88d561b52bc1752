# The PaTHAttention layer (docs/spec.md §5): shapes, w unit norm, beta in (0, 2), gradients for every parameter, and
# packed varlen equal to running the sequences separately (the short conv must not reach across sequences).
import pytest
import torch

from helpers import import_pathattn
from tolerances import F32_VS_REFERENCE_ATOL, F32_VS_REFERENCE_RTOL, UNIT_NORM_ATOL

pathattn = import_pathattn()
import pathattn.layer as layer_module  # noqa: E402  (after the skip when the library is not built)

CONFIGS = {
    "path": dict(hidden_size=64, num_heads=4),
    "path_fox_gqa_qknorm": dict(hidden_size=64, num_heads=4, num_kv_heads=2, use_forget_gate=True, use_qk_norm=True),
    "full_rank_no_conv": dict(hidden_size=32, num_heads=2, use_low_rank_w=False, use_w_shortconv=False),
}


@pytest.fixture
def captured(monkeypatch):
    """Records the inputs the layer hands to path_attention."""
    calls = []
    real = layer_module.path_attention

    def spy(q, k, v, w, beta, g=None, **kw):
        calls.append(dict(q=q, k=k, v=v, w=w, beta=beta, g=g, deterministic=kw.get("deterministic")))
        return real(q, k, v, w, beta, g, **kw)

    monkeypatch.setattr(layer_module, "path_attention", spy)
    return calls


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_backward(name, captured):
    torch.manual_seed(0)
    cfg = CONFIGS[name]
    layer = pathattn.PaTHAttention(**cfg)
    x = torch.randn(2, 12, cfg["hidden_size"], requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    (y * torch.randn_like(y)).sum().backward()

    (call,) = captured
    H = layer.num_kv_heads
    assert call["w"].shape == (2, 12, H, layer.head_dim)
    torch.testing.assert_close(call["w"].norm(dim=-1), torch.ones(2, 12, H), rtol=0, atol=UNIT_NORM_ATOL)
    assert call["beta"].dtype == torch.float32 and call["beta"].shape == (2, 12, H)
    assert bool((call["beta"] > 0).all()) and bool((call["beta"] < 2).all())
    if cfg.get("use_forget_gate"):
        assert call["g"].shape == (2, 12, layer.num_heads) and bool((call["g"] <= 0).all())
    else:
        assert call["g"] is None
    for pname, p in layer.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert bool(p.grad.abs().sum() > 0), f"{pname} got an all-zero gradient"
    assert x.grad is not None


def test_init_matches_fla():
    layer = pathattn.PaTHAttention(hidden_size=256, num_heads=4, use_forget_gate=True)
    assert layer.w_proj[0].weight.shape == (32, 256) and layer.w_proj[1].weight.shape == (256, 32)
    assert layer.w_conv1d.weight.shape == (256, 1, 3)
    assert float(layer.bt_proj.bias.detach().abs().max()) == 0 and float(layer.g_proj.bias.detach().abs().max()) == 0
    assert abs(float(layer.q_proj.weight.detach().std()) - 0.02) < 0.002  # 65k samples: std error ~ 6e-5
    assert layer.head_dim == 64


def test_varlen_equals_separate_sequences():
    torch.manual_seed(1)
    layer = pathattn.PaTHAttention(hidden_size=32, num_heads=2, use_forget_gate=True)
    lens = [5, 1, 7]
    xs = [torch.randn(1, n, 32) for n in lens]
    packed = layer(torch.cat(xs, 1), cu_seqlens=torch.tensor([0, 5, 6, 13], dtype=torch.int32))
    separate = torch.cat([layer(x) for x in xs], 1)
    torch.testing.assert_close(packed, separate, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)


@pytest.mark.parametrize("gate,qk_norm,kv_heads", [(False, False, None), (True, True, 2)])
def test_generation_with_a_cache_equals_the_full_forward(gate, qk_norm, kv_heads):
    """Prefill 10 tokens, then single tokens and a 3-token step through a PaTHLayerCache (the short-conv state
    and the key cache carried across calls, the cache's room grown past 2 x the prompt): the same outputs as
    one forward over all 25 tokens."""
    torch.manual_seed(7)
    layer = pathattn.PaTHAttention(
        hidden_size=64, num_heads=4, num_kv_heads=kv_heads, use_forget_gate=gate, use_qk_norm=qk_norm
    )
    x = torch.randn(2, 25, 64)
    with torch.no_grad():
        full = layer(x)
        cache = pathattn.PaTHLayerCache()
        parts = [layer(x[:, :10], cache=cache)]
        t = 10
        for s in [1, 1, 3] + [1] * 10:
            parts.append(layer(x[:, t : t + s], cache=cache))
            t += s
    assert t == 25 and len(cache) == 25
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)


@pytest.mark.parametrize("gate", [False, True])
def test_a_call_without_commit_leaves_the_cache(gate):
    """Speculative decoding through the layer: draft tokens with commit=False give the outputs the committing call
    gives (the same code on the CPU: bit for bit) and leave the cache (key cache, short-convolution inputs, length)
    as it was; the accepted prefix then decodes as if the draft had never been tried."""
    torch.manual_seed(5)
    layer = pathattn.PaTHAttention(hidden_size=64, num_heads=4, use_forget_gate=gate)
    x = torch.randn(2, 30, 64)
    tried, plain = pathattn.PaTHLayerCache(), pathattn.PaTHLayerCache()
    with torch.no_grad():
        layer(x[:, :20], cache=tried)
        layer(x[:, :20], cache=plain)
        conv, length, k = tried.conv.clone(), tried.length, tried.kv.k.clone()
        y_try = layer(x[:, 20:26], cache=tried, commit=False)
        assert tried.length == length and torch.equal(tried.conv, conv) and torch.equal(tried.kv.k, k)
        y = layer(x[:, 20:26], cache=plain)
        assert torch.equal(y_try, y)
        layer(x[:, 20:24], cache=tried)  # accept 4 of the 6 draft tokens
        y_rest = layer(x[:, 24:30], cache=tried)
        full = layer(x)
    torch.testing.assert_close(y_rest, full[:, 24:30], rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)
    with pytest.raises(ValueError, match="commit=False needs a cache that holds a prompt"):
        layer(x, cache=pathattn.PaTHLayerCache(), commit=False)


def test_cache_and_cu_seqlens_together_are_refused():
    layer = pathattn.PaTHAttention(hidden_size=32, num_heads=2)
    with pytest.raises(ValueError, match="cache or cu_seqlens"):
        layer(torch.randn(1, 4, 32), cu_seqlens=torch.tensor([0, 4], dtype=torch.int32), cache=pathattn.PaTHLayerCache())


def test_state_dict_keys_are_flas():
    """fla's PaTHAttention names (fla/layers/path_attn.py), in its order: its state_dict loads with strict=True."""
    layer = pathattn.PaTHAttention(hidden_size=64, num_heads=4, num_kv_heads=2, use_forget_gate=True, use_qk_norm=True)
    assert list(layer.state_dict()) == [
        "q_proj.weight", "k_proj.weight", "v_proj.weight", "w_proj.0.weight", "w_proj.1.weight",
        "maybe_q_norm.weight", "maybe_k_norm.weight", "w_conv1d.weight", "bt_proj.weight", "bt_proj.bias",
        "g_proj.weight", "g_proj.bias", "o_proj.weight",
    ]
    plain = pathattn.PaTHAttention(hidden_size=32, num_heads=2, use_low_rank_w=False, use_w_shortconv=False)
    assert list(plain.state_dict()) == ["q_proj.weight", "k_proj.weight", "v_proj.weight", "w_proj.weight",
                                        "bt_proj.weight", "bt_proj.bias", "o_proj.weight"]


def test_fla_gate_scale_scales_the_gate(captured):
    """gate_scale='fla' hands the op g * head_dim^-1/2 (fla's scale (s + G_i - G_j)); 'none' hands g itself."""
    torch.manual_seed(2)
    ours = pathattn.PaTHAttention(hidden_size=64, num_heads=4, use_forget_gate=True)
    fla = pathattn.PaTHAttention(hidden_size=64, num_heads=4, use_forget_gate=True, gate_scale="fla")
    fla.load_state_dict(ours.state_dict())
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        ours(x), fla(x)
    torch.testing.assert_close(captured[1]["g"], captured[0]["g"] * 16 ** -0.5)
    with pytest.raises(ValueError, match="gate_scale"):
        pathattn.PaTHAttention(hidden_size=64, num_heads=4, gate_scale="sqrt")


def test_deterministic_reaches_the_op(captured):
    """PaTHAttention(deterministic=...) is handed to path_attention (the CUDA backward's summation order), True by
    default; it is not a parameter, so the state_dict is the same either way."""
    torch.manual_seed(3)
    default = pathattn.PaTHAttention(hidden_size=64, num_heads=4)
    fast = pathattn.PaTHAttention(hidden_size=64, num_heads=4, deterministic=False)
    assert list(fast.state_dict()) == list(default.state_dict())
    fast.load_state_dict(default.state_dict())
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        a, b = default(x), fast(x)
    assert [c["deterministic"] for c in captured] == [True, False]
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the forward does not depend on it


def test_rms_norm_keeps_the_input_dtype():
    """The q / k norm returns its input's dtype with the float32 gain applied (as model/attention.cpp's RMSNorm):
    under autocast the layer's bfloat16 q and k must reach the CUDA op as bfloat16, not promoted to float32."""
    norm = layer_module.RMSNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(3, 8).bfloat16()
    y = norm(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, norm(x.float()).bfloat16())  # computed in f32, gain included, rounded once

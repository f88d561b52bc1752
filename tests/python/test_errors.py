# Every bad input raises RuntimeError whose message names the argument (and what was expected).
import pytest
import torch

from helpers import import_pathattn, random_inputs

pathattn = import_pathattn()


def good(**over):
    x = random_inputs(1, 6, 2, 4, 8, 8, gate=True, seed=7)
    x.update(over)
    return x


def expect_error(x, *fragments):
    with pytest.raises(RuntimeError) as info:
        pathattn.path_attention(**x)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in the message: {msg}"


x0 = good()
CASES = {
    "q_rank": (dict(q=x0["q"][0]), ["q", "4 dimensions"]),
    "k_rank": (dict(k=x0["k"][..., 0]), ["k", "4 dimensions"]),
    "beta_rank": (dict(beta=x0["beta"][..., None]), ["beta", "3 dimensions"]),
    "k_shape": (dict(k=x0["k"][:, :5]), ["k", "[B, T, H, D]"]),
    "v_shape": (dict(v=x0["v"][:, :, :1]), ["v", "[B, T, H, DV]"]),
    "w_shape": (dict(w=x0["w"][..., :4]), ["w", "[B, T, H, D]"]),
    "beta_shape": (dict(beta=x0["beta"][:, :, :1]), ["beta", "[B, T, H]"]),
    "g_shape": (dict(g=x0["g"][:, :, :2]), ["g", "[B, T, HQ]"]),
    "hq_not_multiple": (dict(q=x0["q"][:, :, :3], g=x0["g"][:, :, :3]), ["HQ", "multiple", "H = 2"]),
    "k_dtype": (dict(k=x0["k"].double()), ["k", "dtype", "float32"]),
    "beta_dtype": (dict(beta=x0["beta"].double()), ["beta", "dtype"]),
    "q_int_dtype": (dict(q=x0["q"].long()), ["q", "dtype"]),
    "q_half_on_cpu": (dict(q=x0["q"].half()), ["q", "dtype"]),
    "beta_nan": (dict(beta=x0["beta"].clone().index_fill_(1, torch.tensor([3]), float("nan"))), ["beta", "NaN"]),
    "beta_above_2": (dict(beta=x0["beta"] + 2.0), ["beta", "[0, 2]"]),
    "beta_negative": (dict(beta=x0["beta"] - 2.0), ["beta", "[0, 2]"]),
    "g_positive": (dict(g=x0["g"] + 1.5), ["g", "<= 0"]),
    "scale_negative": (dict(scale=-1.0), ["scale"]),
    "cu_decreasing": (dict(cu_seqlens=torch.tensor([0, 4, 2, 6], dtype=torch.int32)), ["cu_seqlens", "non-decreasing"]),
    "cu_last_not_T": (dict(cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32)), ["cu_seqlens[-1]", "T = 6"]),
    "cu_first_not_0": (dict(cu_seqlens=torch.tensor([1, 6], dtype=torch.int32)), ["cu_seqlens[0]"]),
    "cu_dtype": (dict(cu_seqlens=torch.tensor([0, 6], dtype=torch.int64)), ["cu_seqlens", "int32"]),
    "cu_rank": (dict(cu_seqlens=torch.tensor([[0, 6]], dtype=torch.int32)), ["cu_seqlens", "1-D"]),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input(name):
    over, fragments = CASES[name]
    expect_error(good(**over), *fragments)


def test_cu_seqlens_requires_batch_1():
    x = random_inputs(2, 6, 1, 1, 4, 4, seed=8)
    x["cu_seqlens"] = torch.tensor([0, 6], dtype=torch.int32)
    expect_error(x, "cu_seqlens", "B == 1", "B = 2")


def test_head_dim_above_cpu_maximum():
    # The CPU fast path (f32) takes D, DV <= 256; the message names the head dimension and the limit.
    x = random_inputs(1, 2, 1, 1, 257, 8, seed=9)
    expect_error(x, "D = 257", "256")


def test_sparse_tensor():
    x = good()
    x["q"] = x["q"].to_sparse()
    expect_error(x, "q", "strided")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mismatched devices need a CUDA device; this machine has only a CPU")
def test_mismatched_devices():
    x = good()
    x["k"] = x["k"].cuda()
    with pytest.raises(RuntimeError) as info:
        pathattn.path_attention(**x)
    # Either the core's check ("k must be on the same device as q") or, for a build without CUDA in the core,
    # the dispatcher's refusal of CUDA tensors.
    assert "device" in str(info.value) or "CUDA" in str(info.value)

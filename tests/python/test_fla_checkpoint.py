# fla checkpoints run unchanged here: the state_dict of fla's PaTHAttention (fla/layers/path_attn.py; gate and qk-norm
# on and off, GQA, low-rank and full-rank w) loads into pathattn.PaTHAttention with strict=True, and with
# gate_scale='fla' both layers give the same outputs on CUDA in bf16, judged by the low-precision rule against the
# f64 reference (our layer in f64 on the CPU, the op's reference path): |ours - ref| <= LOW_PRECISION_FACTOR *
# |fla - ref| + LOW_PRECISION_ATOL (max abs, over the outputs). Needs CUDA, triton and fla on the path:
#   PYTHONPATH=python:third_party_fetched/fla python3 -m pytest -q tests/python/test_fla_checkpoint.py
# Skipped, with the reason, where any of them is missing (this CPU machine: no CUDA, no triton).
import pytest
import torch

from helpers import import_pathattn
from tolerances import LOW_PRECISION_ATOL, LOW_PRECISION_FACTOR

pathattn = import_pathattn()

if not torch.cuda.is_available():
    pytest.skip("fla's PaTHAttention runs only on CUDA (triton kernels); no CUDA device here", allow_module_level=True)
try:
    from fla.layers.path_attn import PaTHAttention as FlaPaTHAttention
except ImportError as e:  # fla, triton, einops or transformers missing
    pytest.skip(f"fla cannot be imported ({e}); put third_party_fetched/fla on PYTHONPATH", allow_module_level=True)

CASES = {
    "path": dict(num_kv_heads=None, use_forget_gate=False, use_qk_norm=False),
    "path_fox": dict(num_kv_heads=None, use_forget_gate=True, use_qk_norm=False),
    "path_qknorm": dict(num_kv_heads=None, use_forget_gate=False, use_qk_norm=True),
    "path_fox_qknorm_gqa": dict(num_kv_heads=2, use_forget_gate=True, use_qk_norm=True),
    "path_gqa_full_rank_w": dict(num_kv_heads=1, use_forget_gate=False, use_qk_norm=False, use_low_rank_w=False),
}


@pytest.mark.parametrize("name", CASES)
def test_fla_state_dict_loads_strictly_and_gives_the_same_outputs(name):
    kw = CASES[name]
    E, HQ, B, T = 256, 4, 2, 200
    torch.manual_seed(0)
    # fla's layer alone keeps torch's default nn.Linear / nn.Conv1d init (its _init_weights belongs to the model):
    # raw w of order 1, where fla's w / sqrt(|w|^2 + 1e-6) and our exact unit norm agree (docs/python.md).
    fla = FlaPaTHAttention(hidden_size=E, num_heads=HQ, **kw)
    with torch.no_grad():
        for pname, p in fla.named_parameters():
            if pname.endswith("bias") or "norm" in pname:  # away from 0 and 1, so that they matter
                p.add_(0.3 * torch.randn_like(p))
    ours = pathattn.PaTHAttention(hidden_size=E, num_heads=HQ, gate_scale="fla", **kw)
    missing, unexpected = ours.load_state_dict(fla.state_dict(), strict=True)
    assert not missing and not unexpected

    x = torch.randn(B, T, E)
    with torch.no_grad():
        ref = ours.double()(x.double())  # f64 on the CPU: the op's reference path
        ours.to("cuda", torch.bfloat16)
        fla.to("cuda", torch.bfloat16)
        xc = x.to("cuda", torch.bfloat16)
        got = ours(xc).double().cpu()
        base = fla(xc)[0].double().cpu()
    err, base_err = (got - ref).abs().max().item(), (base - ref).abs().max().item()
    assert base_err < 0.1 * ref.abs().max().item(), f"{name}: fla itself is far from the f64 layer ({base_err})"
    assert err <= LOW_PRECISION_FACTOR * base_err + LOW_PRECISION_ATOL, f"{name}: ours {err}, fla {base_err}"

# One PaTH layer in two languages: the Python PaTHAttention and the C++ model's layer (model/attention.h) load one
# set of weights (the Python state_dict, strictly: the same names and shapes) and give the same outputs on the same
# input: the full forward, a prefill into a cache, one decoded token and a step of several tokens (the C++ layer
# decodes S tokens per call through the op's decode, as Python does). The C++ side is tests/model/layer_io.cpp;
# ctest runs this file with PATHATTN_REQUIRE_LAYER_IO=1 (ModelLayer.SameOutputsAsPython), where nothing may skip.
import os
import subprocess
from pathlib import Path

import pytest
import torch

REQUIRED = os.environ.get("PATHATTN_REQUIRE_LAYER_IO") == "1"
try:
    import pathattn
except ImportError as e:
    if REQUIRED:
        raise
    pytest.skip(f"pathattn is not built: {e}", allow_module_level=True)

from tolerances import F32_VS_REFERENCE_ATOL, F32_VS_REFERENCE_RTOL  # noqa: E402


def layer_io_path() -> Path:
    env = os.environ.get("PATHATTN_LAYER_IO")
    # The default: the build folder that holds the library (<build>/torch/libpathattn_torch.so).
    return Path(env) if env else pathattn.library_path().resolve().parents[1] / "model" / "tests" / "layer_io"


CONFIGS = {
    "path": dict(hidden_size=64, num_heads=4),
    "path_fox_gqa_qknorm": dict(hidden_size=64, num_heads=4, num_kv_heads=2, use_forget_gate=True, use_qk_norm=True),
    "path_fox_fla_gate_mqa": dict(hidden_size=48, num_heads=3, num_kv_heads=1, use_forget_gate=True, gate_scale="fla"),
    "full_rank_no_conv": dict(hidden_size=32, num_heads=2, use_low_rank_w=False, use_w_shortconv=False),
    "conv4_rank8": dict(hidden_size=32, num_heads=2, conv_size=4, w_rank=8, use_forget_gate=True),
}
DEFAULTS = dict(num_kv_heads=None, use_forget_gate=False, use_qk_norm=False, use_low_rank_w=True,
                use_w_shortconv=True, conv_size=3, w_rank=32, gate_scale="none")


@pytest.mark.parametrize("name", CONFIGS)
def test_python_and_cpp_layers_agree(name, tmp_path):
    tool = layer_io_path()
    if not tool.is_file():
        msg = f"the C++ side {tool} is not built (target layer_io, PATHATTN_TESTS=ON) or PATHATTN_LAYER_IO is unset"
        if REQUIRED:
            pytest.fail(msg)
        pytest.skip(msg)
    cfg = dict(DEFAULTS, **CONFIGS[name])
    torch.manual_seed(11)
    layer = pathattn.PaTHAttention(**cfg).eval()
    with torch.no_grad():  # weights of order 1, biases and norm gains away from 0 and 1: every parameter matters
        for pname, p in layer.named_parameters():
            p.copy_((1.0 if pname.endswith("norm.weight") else 0.0) + 0.3 * torch.randn_like(p))
    B, P, S = 2, 9, 4
    x = torch.randn(B, P + 1 + S, cfg["hidden_size"])
    state = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    torch.save(dict(config=cfg, state=state, x=x, prefill=P, step=S), tmp_path / "in.pt")
    run = subprocess.run([str(tool), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    cpp = torch.load(tmp_path / "out.pt")
    assert list(cpp["keys"]) == list(state.keys())  # the same names in the same order

    with torch.no_grad():
        full = layer(x)
        cache = pathattn.PaTHLayerCache()
        py = dict(full=full, prefill=layer(x[:, :P], cache=cache), step1=layer(x[:, P : P + 1], cache=cache),
                  steps=layer(x[:, P + 1 :], cache=cache))
    assert float(full.abs().max()) > 0.1  # not a degenerate comparison
    for part, want in py.items():
        torch.testing.assert_close(cpp[part], want, rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL,
                                   msg=lambda m, part=part: f"{name}, {part}: {m}")
    # Decoding continues the sequence in both: the decoded outputs are the full forward's last ones.
    torch.testing.assert_close(torch.cat([cpp["prefill"], cpp["step1"], cpp["steps"]], 1), full,
                               rtol=F32_VS_REFERENCE_RTOL, atol=F32_VS_REFERENCE_ATOL)

# Context-parallel PaTH attention (pathattn.context_parallel, docs/math.md section 6) over torch.distributed with
# gloo on the CPU, 2 and 4 processes: outputs, lse and every gradient equal path_attention over the whole sequence
# in one process; data parallel x context parallel training equals one process; mismatched segments are errors.
# The workers are in cp_worker.py (spawned processes import it).
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import import_pathattn
from tolerances import F32_VS_REFERENCE_ATOL, F64_VS_REFERENCE_ATOL

pathattn = import_pathattn()
import cp_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

HERE = os.path.dirname(os.path.abspath(__file__))


SPAWN_TIMEOUT_S = 300  # a mismatch of collectives between ranks hangs instead of failing: bound it


def spawn(fn, world, tmp_path, case):
    # Spawned interpreters find pathattn and the test helpers through PYTHONPATH.
    paths = [HERE, os.path.join(HERE, "..", "..", "python")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    ctx = mp.spawn(fn, args=(world, str(tmp_path / "init"), case), nprocs=world, join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1):  # raises when a rank fails
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.terminate()
            pytest.fail(f"{fn.__name__} with {world} processes did not finish in {SPAWN_TIMEOUT_S} s")


CASES = {
    # f64 through the reference backend: equal to rounding
    "mha_f64": dict(B=1, L=24, H=1, HQ=1, D=8, DV=8, gate=False, dtype=torch.float64, atol=F64_VS_REFERENCE_ATOL),
    "gqa_gate_dv_f64": dict(B=2, L=40, H=2, HQ=4, D=8, DV=4, gate=True, dtype=torch.float64, atol=F64_VS_REFERENCE_ATOL),
    "beta2_f64": dict(B=1, L=17, H=1, HQ=2, D=8, DV=8, gate=True, dtype=torch.float64, atol=F64_VS_REFERENCE_ATOL,
                      beta_two=True),
    # f32 through the fast CPU path, segments longer than one chunk and not a multiple of it
    "gqa_gate_f32": dict(B=1, L=70, H=2, HQ=4, D=16, DV=16, gate=True, dtype=torch.float32, atol=10 * F32_VS_REFERENCE_ATOL),
    # zig-zag: rank r holds segments r and 2 n - 1 - r (of L / 2 rows each)
    "zigzag_gqa_gate_f64": dict(B=1, L=20, H=2, HQ=4, D=8, DV=8, gate=True, dtype=torch.float64,
                                atol=F64_VS_REFERENCE_ATOL, layout="zigzag"),
    "zigzag_mha_f64": dict(B=2, L=14, H=1, HQ=1, D=8, DV=4, gate=False, dtype=torch.float64,
                           atol=F64_VS_REFERENCE_ATOL, layout="zigzag"),
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_context_parallel_equals_one_process(world, case, tmp_path):
    spawn(cp_worker.op_worker, world, tmp_path, CASES[case])


def test_owned_segments():
    from pathattn.context_parallel import owned_segments

    assert [owned_segments(r, 4) for r in range(4)] == [[0], [1], [2], [3]]
    assert [owned_segments(r, 4, "zigzag") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    with pytest.raises(RuntimeError, match="layout must be one of"):
        owned_segments(0, 2, "ring")


def test_segments_of_different_lengths_are_an_error(tmp_path):
    spawn(cp_worker.shape_error_worker, 2, tmp_path, None)


@pytest.mark.parametrize("dp,cp", [(1, 2), (2, 2)])
def test_data_and_context_parallel_training_equals_one_process(dp, cp, tmp_path):
    spawn(cp_worker.train_worker, dp * cp, tmp_path, dict(dp=dp, cp=cp, steps=3, B=2, T=24))


def test_segment_summary_matches_the_prefill_and_the_definition():
    """q^ (H_1 ... H_i q_i), k^ (the prefill's key cache) and P = H_L ... H_1 of one segment (Eq. 38-39)."""
    from helpers import random_inputs
    from pathattn.context_parallel import segment_summary

    x = random_inputs(1, 70, 2, 4, 8, 8, dtype=torch.float64, seed=3)
    x.pop("cu_seqlens", None)
    qh, kh, P = segment_summary(x["q"], x["k"], x["w"], x["beta"])
    _, _, kc = pathattn.prefill(**{n: (t.float() if t is not None else None) for n, t in x.items()})
    torch.testing.assert_close(kh.permute(0, 2, 1, 3).float(), kc, rtol=F32_VS_REFERENCE_ATOL, atol=F32_VS_REFERENCE_ATOL)
    eye = torch.eye(8, dtype=torch.float64)
    for h in range(2):
        M, Pd = eye, eye
        for t in range(70):
            Ht = eye - x["beta"][0, t, h] * torch.outer(x["w"][0, t, h], x["w"][0, t, h])
            M, Pd = M @ Ht, Ht @ Pd
            for j in range(2):
                torch.testing.assert_close(qh[0, h, j, t], M @ x["q"][0, t, 2 * h + j], atol=F64_VS_REFERENCE_ATOL, rtol=0)
        torch.testing.assert_close(P[0, h], Pd, atol=F64_VS_REFERENCE_ATOL, rtol=0)


def test_needs_an_initialised_process_group():
    from pathattn.context_parallel import context_parallel_attention

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    x = {n: torch.zeros(1, 4, 1, 8) for n in ("q", "k", "v", "w")}
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        context_parallel_attention(**x, beta=torch.zeros(1, 4, 1))


@pytest.mark.parametrize("world,config", [(2, dict(kv_heads=4, gate=False, L=20)), (4, dict(kv_heads=2, gate=True, L=9)),
                                          (2, dict(kv_heads=2, gate=True, L=12, layout="zigzag"))])
def test_layer_with_cp_group_equals_the_whole_sequence(world, config, tmp_path):
    """The layer's short convolution reads the previous segment's last inputs (another rank's; zig-zag: the same
    rank's for the middle segments); outputs, dx and every parameter's gradient (summed over the ranks) equal the
    layer over the whole sequence."""
    spawn(cp_worker.layer_worker, world, tmp_path, config)


def test_example_training_has_the_same_losses_for_every_world_size(tmp_path):
    """examples/train_context_parallel.py (a small PaTH LM, DDP x context parallel): the same data order and the
    same losses in f64 for one process, 1 x 2 (contiguous) and 2 x 2 (zig-zag) ranks."""
    import subprocess
    import sys

    script = os.path.join(HERE, "..", "..", "examples", "train_context_parallel.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {"single": ["--single"], "cp2": ["--spawn", "2", "--cp", "2"],
            "dp2_cp2_zigzag": ["--spawn", "4", "--cp", "2", "--layout", "zigzag"]}
    losses = {}
    for name, extra in runs.items():
        out = tmp_path / f"{name}.txt"
        subprocess.run([sys.executable, script, "--device", "cpu", "--dtype", "float64", "--steps", "4", "--T", "48",
                        "--losses", str(out)] + extra, check=True, env=env, timeout=300)
        losses[name] = [float(v) for v in out.read_text().split()]
    assert len(losses["single"]) == 4
    for name in ("cp2", "dp2_cp2_zigzag"):
        for a, b in zip(losses[name], losses["single"]):
            assert abs(a - b) <= 1e-9 * abs(b), (name, losses[name], losses["single"])


@pytest.mark.parametrize("with_col", [False, True])
def test_block_attention_matches_the_dense_form_and_finite_differences(with_col):
    """The tiled cross-segment attention (pathattn/block_attention.py): o and lse equal the dense softmax; its
    backward (o and lse both used by the loss, tiles smaller than the blocks, k, v, col broadcast over 3 query heads)
    passes gradcheck in f64."""
    from pathattn.block_attention import block_attention
    from tolerances import GRADCHECK_ATOL, GRADCHECK_EPS, GRADCHECK_RTOL

    gen = torch.Generator().manual_seed(4)
    B, H, G, Lq, Lk, D, DV = 1, 2, 3, 21, 13, 8, 5
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_()  # noqa: E731
    q, k, v = mk(B, H, G, Lq, D), mk(B, H, 1, Lk, D), mk(B, H, 1, Lk, DV)
    col = mk(B, H, G, 1, Lk) if with_col else None
    o, lse = block_attention(q, k, v, col, 0.4, tile=8)
    s = 0.4 * (q @ k.transpose(-1, -2)) + (col if with_col else 0)
    torch.testing.assert_close(o, torch.softmax(s, -1) @ v, atol=F64_VS_REFERENCE_ATOL, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=F64_VS_REFERENCE_ATOL, rtol=0)
    args = (q, k, v, col) if with_col else (q, k, v)
    fn = (lambda q, k, v, c: block_attention(q, k, v, c, 0.4, tile=8)) if with_col else \
        (lambda q, k, v: block_attention(q, k, v, None, 0.4, tile=8))
    assert torch.autograd.gradcheck(fn, args, eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL, rtol=GRADCHECK_RTOL)

"""tools/bench_stages.py on a made-up PATHATTN_CUDA_PROFILE bench log: a call cut into head slices adds its slices'
stages, the medians are over calls, the deterministic calls (the first half of a row's backward calls) apart from
the fast ones, and the stage lines of one row never leak into the next."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def call(kind, slices, stages):
    lines = ["[pathattn profile] workspace %s: %d call(s) of 1 kv head(s), 1.0 MiB each (limit 1024 MiB)" % (kind, slices)]
    for _ in range(slices):
        lines += ["[pathattn profile] %-11s %.3f ms" % (name, ms) for name, ms in stages]
    return lines


def table_rows(tmp_path, log):
    """bench_stages.py's per-row lines for the log lines `log`."""
    path = tmp_path / "bench.log"
    path.write_text("\n".join(log) + "\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_stages.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in out if line.startswith("B T H D")]


def test_slices_add_and_modes_split(tmp_path):
    log = []
    log += call("forward", 1, [("prep", 1.0), ("main", 2.0)]) * 3
    # three deterministic calls of two slices each, then three fast ones: bwd_main 5 / 7 / 6 per slice, 3 fast
    for main in (5.0, 7.0, 6.0):
        log += call("backward", 2, [("prep", 0.5), ("bwd_prep", 0.25), ("bwd_main", main), ("bwd_local", 4.0)])
    for _ in range(3):
        log += call("backward", 2, [("prep", 0.5), ("bwd_prep", 0.25), ("bwd_main", 3.0), ("bwd_local", 4.0)])
    log.append("  32   4096  32   64     11.0   1   2   3   118.3   96.4   0.87")
    # the next row's calls: one slice, different numbers
    log += call("forward", 1, [("prep", 9.0), ("main", 9.0)])
    log += call("backward", 1, [("prep", 1.0), ("bwd_prep", 1.0), ("bwd_main", 20.0), ("bwd_local", 1.0)]) * 2
    log.append("   8  16384  32   64     32.0   1   2   3   337.4   235.4   1.05")
    rows = table_rows(tmp_path, log)
    assert len(rows) == 2
    assert rows[0].startswith("B T H D = 32 4096 32 64 |")
    assert "fwd prep=1.00 main=2.00" in rows[0]
    # slices added (2 x 0.5 prep, 2 x 6.0 median bwd_main), medians over the three calls of each mode
    assert "bwd det prep=1.00 bwd_prep=0.50 bwd_main=12.00 bwd_local=8.00" in rows[0]
    assert "bwd fast prep=1.00 bwd_prep=0.50 bwd_main=6.00 bwd_local=8.00" in rows[0]
    assert "fwd prep=9.00 main=9.00" in rows[1]
    assert "bwd det prep=1.00 bwd_prep=1.00 bwd_main=20.00 bwd_local=1.00" in rows[1]


def test_forward_block_stage_shows_only_when_it_ran(tmp_path):
    """The two-level forward's "blocks" stage (PATHATTN_FWD_BLOCK) is printed between prep and main when its calls
    have it, and not at all for a row whose calls do not."""
    log = call("forward", 1, [("prep", 1.0), ("blocks", 0.5), ("main", 2.0)]) * 3
    log.append("  32   4096  32   64     11.0")
    log += call("forward", 1, [("prep", 1.0), ("main", 4.0)]) * 3
    log.append("  32   4096  16  128     13.0")
    rows = table_rows(tmp_path, log)
    assert rows[0].endswith("| fwd prep=1.00 blocks=0.50 main=2.00"), rows[0]
    assert rows[1].endswith("| fwd prep=1.00 main=4.00"), rows[1]


def test_backward_block_stages_show_only_when_they_ran(tmp_path):
    """The two-level backward's stages (PATHATTN_BWD_BLOCK: "bwd_blocks" before bwd_main, "bwd_bgrad" after it) are
    printed in the order they run when the row's calls have them, and not at all otherwise."""
    stages = [("prep", 1.0), ("bwd_prep", 0.5), ("bwd_blocks", 0.25), ("bwd_main", 6.0), ("bwd_bgrad", 0.75),
              ("bwd_local", 4.0)]
    log = call("backward", 1, stages) * 2
    log.append("  32   4096  16  128     13.0")
    log += call("backward", 1, [("prep", 1.0), ("bwd_prep", 0.5), ("bwd_main", 9.0), ("bwd_local", 4.0)]) * 2
    log.append("   8  16384  16  128     40.0")
    rows = table_rows(tmp_path, log)
    assert "bwd det prep=1.00 bwd_prep=0.50 bwd_blocks=0.25 bwd_main=6.00 bwd_bgrad=0.75 bwd_local=4.00" in rows[0], rows[0]
    assert "bwd det prep=1.00 bwd_prep=0.50 bwd_main=9.00 bwd_local=4.00" in rows[1], rows[1]

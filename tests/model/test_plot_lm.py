"""tools/plot_lm.py on made-up run folders: the training loss read from the progress lines of train.log, a converted
run's source found beside it when the runs were copied off the machine they ran on, runs of one mechanism told
apart by seed, the per-mechanism mean and standard deviation over seeds, and --zoom's argument check."""
import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot_lm  # noqa: E402

RANGES = [(0, 8), (8, 16)]


def make_run(folder, mechanism, seed, valid, test, init_from=None, log=""):
    os.makedirs(os.path.join(folder, "eval"))
    meta = {"mechanism": mechanism, "seed": seed, "parameters": 100, "tokens_per_step": 10, "tokens_seen": 40,
            "loss": {"valid": valid}}
    if init_from:
        meta["init_from"] = init_from
    json.dump(meta, open(os.path.join(folder, "metrics.json"), "w"))
    with open(os.path.join(folder, "metrics.csv"), "w") as f:
        f.write("step,elapsed_s,lr,train_loss,tokens_per_s,valid_loss,valid_error\n")
        f.write(f"4,1.0,0.001,2.5,100,{valid},0.5\n")
    ev = {"seq_len": 8, "ranges": [{"begin": b, "end": e, "loss": v} for (b, e), v in zip(RANGES, test)]}
    json.dump(ev, open(os.path.join(folder, "eval", "eval.json"), "w"))
    with open(os.path.join(folder, "eval", "extrap.csv"), "w") as f:
        f.write("bucket_start,bucket_end,loss\n0,8,2.0\n8,16,2.2\n")
    with open(os.path.join(folder, "train.log"), "w") as f:
        f.write(log)
    return folder


def test_progress_lines_give_the_training_curve(tmp_path):
    log = ("[lm/path] resumed from step 2\n"
           "[lm/path] step 2/4  loss 3.5000  lr 1.00e-03  100 tok/s  0.0M tok  elapsed 0m01s  ETA 0m01s\n"
           "[lm/path] eval step 2  train_loss 3.4  valid loss 3.3 ppl 27.1 err 50%\n"
           "[lm/path] step 4/4  loss 2.2500  lr 1.00e-04  100 tok/s  0.0M tok  elapsed 0m02s  ETA 0m00s\n")
    run = make_run(str(tmp_path / "path"), "path", 1, 2.0, [2.1, 2.3], log=log)
    assert plot_lm.read_progress(run) == [(2, 3.5), (4, 2.25)]
    assert plot_lm.read_progress(str(tmp_path / "none")) == []


def test_converted_run_finds_its_source_beside_it(tmp_path):
    make_run(str(tmp_path / "rope"), "rope", 1, 2.0, [2.0, 3.0])
    # As recorded on the GPU machine: a relative path that does not exist here.
    conv = make_run(str(tmp_path / "path-from-rope"), "path", 1, 1.9, [1.9, 1.8], init_from="runs/lm/rope/ckpt")
    r = plot_lm.read_run(conv, "eval")
    assert r["label"] == "path from rope" and r["offset"] == 40
    # A source that is nowhere: labelled by its folder's name, drawn from zero.
    lone = make_run(str(tmp_path / "x"), "path", 1, 1.9, [1.9, 1.8], init_from="elsewhere/fox/ckpt")
    r = plot_lm.read_run(lone, "eval")
    assert r["label"] == "path from fox" and r["offset"] == 0


def test_seeds_labelled_and_averaged(tmp_path, capsys):
    runs = [make_run(str(tmp_path / "rope"), "rope", 1, 2.0, [2.0, 3.0]),
            make_run(str(tmp_path / "rope-s2"), "rope", 2, 2.2, [2.1, 3.4]),
            make_run(str(tmp_path / "fox"), "fox", 1, 1.7, [1.7, 1.6])]
    rs = [plot_lm.read_run(r, "eval") for r in runs]
    plot_lm.label_seeds(rs)
    assert [r["label"] for r in rs] == ["rope, seed 1", "rope, seed 2", "fox"]
    plot_lm.table(rs)
    out = capsys.readouterr().out.splitlines()
    spread = out[out.index("") + 1:]  # the seed table follows the per-run table after a blank line
    assert spread[0].startswith("| mechanism | seeds | valid loss |"), out
    seed_rows = [l for l in spread if l.startswith("| rope | 1, 2 |")]
    assert len(seed_rows) == 1, out
    want = [f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}" for v in ([2.0, 2.2], [2.0, 2.1], [3.0, 3.4])]
    assert seed_rows[0] == "| rope | 1, 2 | " + " | ".join(want) + " |"
    assert not [l for l in spread if l.startswith("| fox | ")]  # one seed: no spread row


def test_plots_and_zoom_check(tmp_path):
    runs = [make_run(str(tmp_path / "rope"), "rope", 1, 2.0, [2.0, 3.0]),
            make_run(str(tmp_path / "path"), "path", 1, 1.9, [1.9, 1.8])]
    tool = [sys.executable, os.path.join(ROOT, "tools", "plot_lm.py")] + runs
    subprocess.run(tool + ["--curves", str(tmp_path / "c.png"), "--extrap", str(tmp_path / "e.png"),
                           "--zoom", "1.5,2.5"], check=True)
    assert os.path.getsize(tmp_path / "c.png") > 0 and os.path.getsize(tmp_path / "e.png") > 0
    bad = subprocess.run(tool + ["--extrap", str(tmp_path / "e.png"), "--zoom", "2.5,1.5"], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "--zoom expects LO,HI" in bad.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The synthetic sweep (tools/sweep_synthetic.py) and its figures (tools/plot_synthetic.py): the solved and majority
rules on made-up rows, the figures from a made-up summary, and the driver itself at the tiny grid on the CPU with
pathattn_train ($PATHATTN_TRAIN): a sweep cut into chunks (--max-steps-per-call), then continued, skips its finished
cell, resumes the other from its checkpoint, and ends with the metrics of a sweep that ran straight through."""
import argparse
import csv
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot_synthetic  # noqa: E402
import sweep_synthetic as sweep  # noqa: E402


def row(task="a5", size=5, mech="path", layers=1, seed=1, finished=1, acc=None, seq=None):
    return dict(task=task, size=size, mechanism=mech, layers=layers, seed=seed, finished=finished,
                accuracy="" if acc is None else acc, seq_accuracy="" if seq is None else seq)


def test_solved_rule_uses_the_task_metric_and_the_threshold():
    assert sweep.solved(row(seq=0.9, acc=0.1)) is True  # A5: sequence accuracy, >= 90%
    assert sweep.solved(row(seq=0.8999, acc=1.0)) is False
    assert sweep.solved(row(task="mqrar", acc=0.9, seq=0.0)) is True  # MQRAR: accuracy on the answers
    assert sweep.solved(row(task="mqrar", acc=0.89, seq=1.0)) is False
    assert sweep.solved(row(seq=1.0, finished=0)) is None  # not finished: no verdict
    assert sweep.solved(row(seq=None)) is None


def test_majority_of_seeds_and_fewest_layers():
    rows = []
    # path, length 5: depth 1 solved by 1 of 3 (unsolved), depth 2 by 2 of 3 (solved): fewest layers 2.
    rows += [row(layers=1, seed=s, seq=a) for s, a in ((1, 0.95), (2, 0.5), (3, 0.2))]
    rows += [row(layers=2, seed=s, seq=a) for s, a in ((1, 0.95), (2, 0.91), (3, 0.2))]
    # rope, length 5: depth 1 two failed and one pending: already unsolved; depth 2 one solved, one failed, one
    # pending: pending, so the fewest layers is undetermined.
    rows += [row(mech="rope", layers=1, seed=1, seq=0.1), row(mech="rope", layers=1, seed=2, seq=0.2),
             row(mech="rope", layers=1, seed=3, finished=0)]
    rows += [row(mech="rope", layers=2, seed=1, seq=0.99), row(mech="rope", layers=2, seed=2, seq=0.3),
             row(mech="rope", layers=2, seed=3, finished=0)]
    # fox, length 5: nothing solves: more than the deepest depth.
    rows += [row(mech="fox", layers=l, seed=s, seq=0.5) for l in (1, 2) for s in (1, 2, 3)]
    v = sweep.group_verdicts(rows)
    assert v[("a5", 5, "path", 1)]["verdict"] == "unsolved"
    assert v[("a5", 5, "path", 2)]["verdict"] == "solved"
    assert v[("a5", 5, "rope", 1)]["verdict"] == "unsolved"
    assert v[("a5", 5, "rope", 2)]["verdict"] == "pending"
    assert (v[("a5", 5, "rope", 2)]["solved"], v[("a5", 5, "rope", 2)]["failed"]) == (1, 1)
    assert sweep.min_layers(v, "a5", 5, "path") == 2
    assert sweep.min_layers(v, "a5", 5, "rope") is None
    assert sweep.min_layers(v, "a5", 5, "fox") == math.inf
    # A pending shallow depth leaves the answer open even when a deeper one is solved.
    v2 = sweep.group_verdicts([row(layers=1, seed=s, finished=0) for s in (1, 2, 3)]
                              + [row(layers=2, seed=s, seq=1.0) for s in (1, 2, 3)])
    assert sweep.min_layers(v2, "a5", 5, "path") is None


def summary_file(tmp_path):
    rows = []
    for n in (5, 10):
        for mech, need in (("path", 1), ("rope", 3)):
            for l in (1, 2, 3):
                for s in (1, 2, 3):
                    ok = l >= need + (n == 10)
                    rows.append(dict(cell=f"a5-{n}-{l}-{mech}-{s}", task="a5", size=n, mechanism=mech, layers=l,
                                     seed=s, finished=1, accuracy=0.99, seq_accuracy=0.97 if ok else 0.3))
    for n in (1, 2):
        for mech in ("path", "rope"):
            for s in (1, 2, 3):
                rows.append(dict(cell=f"mq-{n}-{mech}-{s}", task="mqrar", size=n, mechanism=mech, layers=2, seed=s,
                                 finished=int(s < 3), accuracy=0.9 - 0.1 * n - 0.01 * s, seq_accuracy=0.0))
    for mech in ("path", "rope"):
        for s in (1, 2, 3):
            rows.append(dict(cell=f"ff-{mech}-{s}", task="flipflop", size=256, mechanism=mech, layers=2, seed=s,
                             finished=1, in_dist_error=0.01 * s, sparse_error=0.02, dense_error=0.0))
    path = tmp_path / "summary.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sweep.SUMMARY_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in sweep.SUMMARY_FIELDS})
    return path


def test_figures_from_a_summary(tmp_path, capsys):
    s = summary_file(tmp_path)
    assert plot_synthetic.main(["a5", str(s), "--out", str(tmp_path / "a5.png")]) == 0
    out = capsys.readouterr().out
    assert "| 5 | 1 | 3 |" in out and "| 10 | 2 | >3 |" in out  # path needs 1 then 2 layers; rope 3, then none
    assert plot_synthetic.main(["mqrar", str(s), "--out", str(tmp_path / "mq.png")]) == 0
    out = capsys.readouterr().out
    assert "[1 pending]" in out and "n=2" in out
    assert plot_synthetic.main(["flipflop", str(s), "--out", str(tmp_path / "ff.md"),
                                "--paper", "rope:sparse=12.5"]) == 0
    table = (tmp_path / "ff.md").read_text()
    assert "| path | 3 of 3 | 2.00 ± 1.00 (1.00-3.00, n=3)" in table  # in_dist 1, 2, 3 %: mean, sd, range
    assert "| 6.9 | 12.5 | - |" in table  # the recorded paper numbers and the one given
    for png in ("a5.png", "mq.png"):
        assert (tmp_path / png).stat().st_size > 1000
    with pytest.raises(SystemExit, match="MECH:SET=PERCENT"):
        plot_synthetic.main(["flipflop", str(s), "--paper", "rope=3"])


def test_curves_from_the_cells_metrics(tmp_path, capsys):
    s = summary_file(tmp_path)
    ff = [r for r in sweep.read_summary(str(s)) if r["task"] == "flipflop"]
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match="no metrics.csv"):
        plot_synthetic.main(["curves", str(s), "--task", "flipflop", "--runs", str(runs), "--out", str(tmp_path / "c.png")])
    for r in ff[:2]:
        (runs / r["cell"]).mkdir(parents=True)
        (runs / r["cell"] / "metrics.csv").write_text(
            "step,elapsed_s,in_dist_loss,in_dist_error,sparse_loss,sparse_error,in_dist_seq_error\n"
            "500,1,0.1,0.2,0.3,0.4,0.9\n1000,2,0.05,0.1,0.2,0.3,0.8\n")
    assert plot_synthetic.main(["curves", str(s), "--task", "flipflop", "--runs", str(runs),
                                "--out", str(tmp_path / "c.png")]) == 0
    assert "(2 cells)" in capsys.readouterr().out
    assert (tmp_path / "c.png").stat().st_size > 1000
    # --only keeps the matching cells; none matching is an error naming the pattern
    assert plot_synthetic.main(["curves", str(s), "--task", "flipflop", "--runs", str(runs), "--only", ff[0]["cell"] + "$",
                                "--out", str(tmp_path / "c1.png")]) == 0
    assert "(1 cells)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="matching --only 'nothing-like-this'"):
        plot_synthetic.main(["curves", str(s), "--task", "flipflop", "--runs", str(runs), "--only", "nothing-like-this",
                             "--out", str(tmp_path / "c2.png")])


def test_a5_curves_use_the_sequence_error(tmp_path, capsys, monkeypatch):
    """A5 is solved by its sequence accuracy, so its curves plot the `_seq_error` columns (the position error of the
    same run is far lower and would hide what the solved rule reads)."""
    s = summary_file(tmp_path)
    a5 = [r for r in sweep.read_summary(str(s)) if r["task"] == "a5"]
    runs = tmp_path / "runs"
    (runs / a5[0]["cell"]).mkdir(parents=True)
    (runs / a5[0]["cell"] / "metrics.csv").write_text(
        "step,elapsed_s,in_dist_loss,in_dist_error,in_dist_seq_error\n500,1,0.1,0.02,0.5\n1000,2,0.05,0.01,0.25\n")
    plotted = []
    real_subplots = plot_synthetic.plt_module().subplots

    def subplots(*a, **k):
        fig, axes = real_subplots(*a, **k)
        for ax in axes[0]:
            real_plot = ax.plot
            ax.plot = lambda x, y, *pa, _p=real_plot, **pk: (plotted.append(list(y)), _p(x, y, *pa, **pk))[1]
        return fig, axes
    monkeypatch.setattr(plot_synthetic.plt_module(), "subplots", subplots)
    assert plot_synthetic.main(["curves", str(s), "--task", "a5", "--runs", str(runs), "--out", str(tmp_path / "a.png")]) == 0
    assert plotted == [[50.0, 25.0]]


def test_grid_options_are_checked():
    with pytest.raises(SystemExit, match="TASK.KEY=VALUE"):
        sweep.main(["plan", "--grid", "tiny", "--set", "a5.stepz=3"])
    with pytest.raises(SystemExit, match="--tasks"):
        sweep.main(["plan", "--grid", "tiny", "--tasks", "a6"])
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="mqrar", only="", set=list(sets))

    sweep.check_device(sweep.make_grid(grid("mqrar.heads=4")), "cuda")  # width 256 / 4 heads: D = 64
    with pytest.raises(SystemExit, match="D = 64 or 128"):
        sweep.check_device(sweep.make_grid(grid("mqrar.heads=8")), "cuda")  # D = 32: no CUDA kernel
    sweep.check_device(sweep.make_grid(grid("mqrar.heads=8")), "cpu")  # the CPU path takes any D


def test_checkpoint_interval_is_not_part_of_a_cell(tmp_path):
    """How often a run checkpoints does not change its results: a cell recorded with --ckpt-every (as the first GPU
    sweep wrote them) is the same cell; any other difference is refused."""
    cell = sweep.make_grid(argparse.Namespace(grid="tiny", tasks="flipflop", only="", set=[]))[0]
    assert "--ckpt-every" not in cell.train_args()
    folder = tmp_path / cell.id
    folder.mkdir()
    rec = cell.record()
    rec["args"] = rec["args"] + ["--ckpt-every", "500"]
    (folder / "cell.json").write_text(json.dumps(rec))
    assert sweep.cell_state(cell, [str(tmp_path)])[0] == "started"
    rec["args"][rec["args"].index("--lr") + 1] = "0.5"
    (folder / "cell.json").write_text(json.dumps(rec))
    with pytest.raises(SystemExit, match="other options"):
        sweep.cell_state(cell, [str(tmp_path)])


def test_plan_prints_a_total(capsys):
    assert sweep.main(["plan", "--grid", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "Total:" in out and "launch-bound" in out


def train_binary():
    path = os.environ.get("PATHATTN_TRAIN", "")
    if not os.access(path, os.X_OK):
        if os.environ.get("PATHATTN_REQUIRE_TRAIN"):
            pytest.fail(f"PATHATTN_TRAIN={path!r} is not an executable pathattn_train")
        pytest.skip("PATHATTN_TRAIN is not set to pathattn_train (ctest sets it)")
    return path


def sweep_run(build, runs, *extra):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "sweep_synthetic.py"), "run", "--grid", "tiny",
           "--tasks", "a5", "--build", build, "--runs", str(runs), "--results", str(runs) + "-results",
           "--device", "cpu", "--threads", "1", "--poll", "0.05", *extra]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    return r.stdout


def curve(folder):
    """metrics.csv without the columns that measure time."""
    with open(os.path.join(folder, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def final(folder):
    with open(os.path.join(folder, "metrics.json")) as f:
        m = json.load(f)
    return {k: m[k] for k in ("steps_done", "finished", "error", "loss", "sequence_error", "position_accuracy",
                              "prefix_sequence_accuracy")}


def test_a5_bos_is_an_option_of_the_cell(tmp_path):
    """--set a5.bos=1 (a BOS token first, model/task.h) reaches pathattn_train and the cell's sizes; a cell recorded
    without it is another cell under the same id, which the driver refuses to mix with it; and the trainer records
    the option in the run's config.txt."""
    def a5(*sets):
        return sweep.make_grid(argparse.Namespace(grid="tiny", tasks="a5", only="", set=list(sets)))[0]
    plain, bos = a5(), a5("a5.bos=1")
    assert "--a5-bos" not in plain.train_args() and "--a5-bos" in bos.train_args()
    assert (plain.vocab(), plain.seq_len()) == (60, 3) and (bos.vocab(), bos.seq_len()) == (61, 4)
    folder = tmp_path / plain.id
    folder.mkdir()
    (folder / "cell.json").write_text(json.dumps(plain.record()))
    with pytest.raises(SystemExit, match="other options"):
        sweep.cell_state(bos, [str(tmp_path)])
    out = tmp_path / "run"
    cmd = [train_binary(), *bos.train_args(), "--steps", "2", "--eval-every", "2", "--device", "cpu", "--threads", "1",
           "--out", str(out)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert "a5.bos=1" in (out / "ckpt" / "config.txt").read_text().splitlines()
    assert len(json.load(open(out / "metrics.json"))["position_accuracy"]) == 4


def test_gpu_script_reads_the_status_of_the_grid_it_ran(tmp_path):
    """tools/synthetic_gpu.sh run ends with the status of the grid it ran: with --set a5.bos=1 that grid's, not the
    plain one's, which would stop at the first cell as "recorded with other options" (the twenty-seventh session's
    BOS cells did). The tiny grid on the CPU, --max-steps-per-call 2 so that it takes seconds."""
    build = os.path.dirname(os.path.dirname(train_binary()))
    env = dict(os.environ, SYN_DEVICE="cpu", SYN_BUILD=build, SYN_GRID="tiny", SYN_TASKS="a5", SYN_DONE="none",
               SYN_RUNS=str(tmp_path / "runs"), SYN_BUDGET="0")
    env.pop("OUT", None)
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "synthetic_gpu.sh"), "run", "--only", "path",
                        "--set", "a5.bos=1", "--max-steps-per-call", "2"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout
    assert "recorded with other options" not in r.stdout, r.stdout
    assert "a5: 0 finished, 1 started, 0 not started" in r.stdout, r.stdout


def test_gpu_script_cuts_the_budget_to_the_calls_end(tmp_path):
    """SYN_END (the device call's end, epoch seconds): run's budget ends 30 s before it when SYN_BUDGET would run past
    it (the twenty-ninth session's call after a 187 s build overran its 600 s limit and brought nothing back)."""
    import re
    import time
    build = os.path.dirname(os.path.dirname(train_binary()))
    env = dict(os.environ, SYN_DEVICE="cpu", SYN_BUILD=build, SYN_GRID="tiny", SYN_TASKS="a5", SYN_DONE="none",
               SYN_RUNS=str(tmp_path / "runs"), SYN_BUDGET="540", SYN_END=str(int(time.time()) + 40))
    env.pop("OUT", None)
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "synthetic_gpu.sh"), "run", "--only", "path",
                        "--max-steps-per-call", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout
    m = re.search(r"SYN_END: budget (\d+) s", r.stdout)
    assert m and 5 <= int(m.group(1)) <= 10, r.stdout
    assert "budget %s s" % m.group(1) in r.stdout.split("SYN_END:")[1], r.stdout  # what the sweep was given


def test_set_refuses_a_boolean_it_cannot_read():
    def a5(*sets):
        return sweep.make_grid(argparse.Namespace(grid="tiny", tasks="a5", only="", set=list(sets)))[0]
    assert "--a5-bos" in a5("a5.bos=true").train_args() and "--a5-bos" not in a5("a5.bos=0").train_args()
    with pytest.raises(SystemExit, match="expected 0, 1, false or true, got 'yes'"):
        a5("a5.bos=yes")


def test_sweep_skips_finished_cells_and_resumes_interrupted_ones(tmp_path):
    build = os.path.dirname(os.path.dirname(train_binary()))
    cells = ["a5-len3-l1-path-s1", "a5-len3-l1-rope-s1"]
    straight = tmp_path / "straight"
    sweep_run(build, straight)
    for c in cells:
        assert final(straight / c)["finished"] and final(straight / c)["steps_done"] == 8

    chunked = tmp_path / "chunked"
    out = sweep_run(build, chunked, "--max-steps-per-call", "4")  # both cells stop at step 4
    assert out.count("resume to continue") == 2, out
    with open(str(chunked) + "-results/summary.csv") as f:  # written as cells end, with their state
        summary = {r["cell"]: r for r in csv.DictReader(f)}
    assert [(summary[c]["steps_done"], summary[c]["finished"]) for c in cells] == [("4", "0"), ("4", "0")]
    sweep_run(build, chunked, "--only", "path")  # finishes the path cell
    path_json = chunked / cells[0] / "metrics.json"
    stamp = os.path.getmtime(path_json)
    out = sweep_run(build, chunked)  # skips path, resumes rope
    assert "1 finished, 1 to run" in out, out
    assert os.path.getmtime(path_json) == stamp, "the finished cell ran again"
    assert "resumed from" in (chunked / cells[1] / "train.log").read_text()
    for c in cells:
        assert curve(chunked / c) == curve(straight / c), c
        assert final(chunked / c) == final(straight / c), c
        assert (tmp_path / ("chunked-results") / c / "metrics.json").exists()
    with open(str(chunked) + "-results/summary.csv") as f:
        summary = {r["cell"]: r for r in csv.DictReader(f)}
    assert all(summary[c]["finished"] == "1" and summary[c]["steps_done"] == "8" for c in cells)
    # Resuming a cell whose folder holds other options is refused, naming the folder.
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sweep_synthetic.py"), "run", "--grid", "tiny",
                        "--tasks", "a5", "--set", "a5.steps=9", "--build", build, "--runs", str(chunked),
                        "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode != 0 and "recorded with other options" in r.stdout and cells[0] in r.stdout


def test_by_depth_orders_a5_depth_first_and_skips_depths_above_a_solved_one(tmp_path):
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="a5,mqrar", only="", set=list(sets))

    cells = sweep.make_grid(grid())
    a5 = [c for c in cells if c.task == "a5"]
    assert [c.layers for c in a5] == sorted(c.layers for c in a5)  # every depth-1 cell before any depth-2 one
    # by_length (on in the paper grid): inside a depth, every seed of a length before the next length
    assert [(c.seed, c.size, c.mechanism) for c in a5 if c.layers == 1] == \
        [(s, n, m) for n in (5, 10, 15, 20) for s in (1, 2, 3, 4, 5) for m in sweep.MECHANISMS]
    no_length = [c for c in sweep.make_grid(grid("a5.by_length=0")) if c.task == "a5"]
    assert [(c.seed, c.size, c.mechanism) for c in no_length if c.layers == 1] == \
        [(s, n, m) for s in (1, 2, 3, 4, 5) for n in (5, 10, 15, 20) for m in sweep.MECHANISMS]
    assert [c.seed for c in cells if c.task == "mqrar"][:16] == [1] * 16  # other tasks: seed first, as before
    off = [c for c in sweep.make_grid(grid("a5.by_depth=0")) if c.task == "a5"]
    assert [c.seed for c in off][:64] == [1] * 64

    # path: depth 1 solved by 2 of 3 seeds -> depths 2, 3 not needed; rope: depth 1 solved by 1 of 3 (unsolved),
    # depth 2 by a majority -> depth 3 not needed, depth 2 is; fox: depth 1 pending -> nothing skipped.
    rows = [row(mech="path", layers=1, seed=s, seq=a) for s, a in ((1, 0.95), (2, 0.92), (3, 0.1))]
    rows += [row(mech="rope", layers=1, seed=s, seq=a) for s, a in ((1, 0.95), (2, 0.2), (3, 0.1))]
    rows += [row(mech="rope", layers=2, seed=s, seq=a) for s, a in ((1, 0.95), (2, 0.96), (3, 0.1))]
    rows += [row(mech="fox", layers=1, seed=s, finished=0) for s in (1, 2, 3)]
    rows += [row(mech="fox", layers=2, seed=s, seq=1.0) for s in (1, 2, 3)]
    v = sweep.group_verdicts(rows)
    by = {(c.mechanism, c.layers): sweep.pruned_by(c, v) for c in a5 if c.size == 5 and c.seed == 2}
    assert by[("path", 1)] is None and by[("path", 2)] == 1 and by[("path", 3)] == 1
    assert by[("rope", 2)] is None and by[("rope", 3)] == 2 and by[("rope", 4)] == 2
    assert by[("fox", 2)] is None and by[("fox", 3)] == 2  # a deeper solved depth prunes above itself only
    assert by[("path-fox", 2)] is None  # no rows: nothing known
    # Pruning never changes the fewest layers: it stops at the first solved depth.
    assert sweep.min_layers(v, "a5", 5, "path") == 1 and sweep.min_layers(v, "a5", 5, "rope") == 2
    # Without by_depth nothing is pruned.
    assert all(sweep.pruned_by(c, v) is None for c in off)


def test_by_length_reads_an_unsolved_length_as_unsolved_longer_ones_and_skips_them():
    """A5 is monotone in its length (MONOTONE_IN_SIZE): at a depth where length 5 is unsolved by a majority, the
    pending groups of lengths 10-20 are unsolved too (implied_by 5) and, with by_length, their cells are skipped;
    a longer length whose own seeds decided it keeps its verdict; the fewest layers then go on to the next depth."""
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="a5", only="", set=list(sets))

    a5 = sweep.make_grid(grid())
    rows = [row(size=5, mech="path", layers=1, seed=s, seq=a) for s, a in ((1, 0.1), (2, 0.2), (3, 0.95))]
    rows += [row(size=n, mech="path", layers=1, seed=s, finished=0) for n in (10, 15) for s in (1, 2, 3)]
    rows += [row(size=20, mech="path", layers=1, seed=s, seq=0.95) for s in (1, 2, 3)]  # ran, solved: kept
    rows += [row(size=5, mech="rope", layers=1, seed=s, seq=a) for s, a in ((1, 0.1), (2, 0.2), (3, 0.95))]
    rows += [row(size=10, mech="rope", layers=1, seed=1, seq=0.95)] + \
        [row(size=10, mech="rope", layers=1, seed=s, finished=0) for s in (2, 3)]
    rows += [row(size=5, mech="fox", layers=1, seed=s, seq=a) for s, a in ((1, 0.1), (2, 0.95), (3, 0.9))]
    rows += [row(size=10, mech="fox", layers=1, seed=s, finished=0) for s in (1, 2, 3)]
    rows += [row(size=5, mech="path", layers=2, seed=s, finished=0) for s in (1, 2, 3)]
    rows += [row(size=10, mech="path", layers=2, seed=s, finished=0) for s in (1, 2, 3)]
    v = sweep.group_verdicts(rows)
    assert v[("a5", 10, "path", 1)]["verdict"] == "unsolved" and v[("a5", 10, "path", 1)]["implied_by"] == 5
    assert v[("a5", 15, "path", 1)]["implied_by"] in (5, 10)  # chained
    assert v[("a5", 20, "path", 1)]["verdict"] == "solved" and "implied_by" not in v[("a5", 20, "path", 1)]
    assert v[("a5", 10, "rope", 1)]["implied_by"] == 5  # one solved seed of three is no majority: implied
    assert v[("a5", 10, "fox", 1)]["verdict"] == "pending"  # fox solves length 5 at depth 1
    assert v[("a5", 10, "path", 2)]["verdict"] == "pending"  # a pending shorter length implies nothing
    assert sweep.group_verdicts(rows, monotone=())[("a5", 10, "path", 1)]["verdict"] == "pending"
    by = {(c.mechanism, c.size, c.layers): sweep.skip_reason(c, v) for c in a5 if c.seed == 2}
    assert by[("path", 10, 1)] == "length 5 is unsolved at this depth"
    assert by[("path", 5, 1)] is None and by[("path", 10, 2)] is None and by[("fox", 10, 1)] is None
    assert sweep.min_layers(v, "a5", 10, "path") is None  # depth 2 pending: undetermined, not '>4'
    off = {c.id for c in sweep.make_grid(grid("a5.by_length=0"))}
    assert all(sweep.pruned_by_length(c, v) is None for c in sweep.make_grid(grid("a5.by_length=0")))
    assert "a5-len10-l1-path-s2" in off
    # next_cell: a cell whose shorter length is still pending waits behind one that does not.
    todo = [c for c in a5 if c.id in ("a5-len10-l2-path-s1", "a5-len5-l2-path-s1")]
    assert [c.id for c in todo] == ["a5-len5-l2-path-s1", "a5-len10-l2-path-s1"]
    assert sweep.next_cell(todo[::-1], v) == 1
    assert sweep.next_cell(todo[1:], v) == 0  # only waiting cells left: the first pending one


def test_a_shorter_length_solved_at_a_shallower_depth_does_not_hold_a_deeper_cell_back():
    """waits_for_shorter: length 5 solved at depth 2 leaves its depth-3 group pending (its cells are skipped, never
    run), and length 10 at depth 3 must not wait for it; length 10 at depth 2, still running, does hold length 15 at
    depth 2 back. next_cell then starts the depth-3 cell before the depth-2 one that waits."""
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="a5", only="", set=list(sets))

    a5 = {c.id: c for c in sweep.make_grid(grid())}
    rows = [row(size=5, mech="path", layers=2, seed=s, seq=0.995) for s in (1, 2, 3)]
    rows += [row(size=5, mech="path", layers=3, seed=1, seq=0.996)] + \
        [row(size=5, mech="path", layers=3, seed=s, finished=0) for s in (2, 3)]
    rows += [row(size=10, mech="path", layers=2, seed=s, finished=0) for s in (1, 2, 3)]
    rows += [row(size=n, mech="path", layers=l, seed=s, finished=0) for n in (10, 15) for l in (3,) for s in (1, 2, 3)]
    rows += [row(size=15, mech="path", layers=2, seed=s, finished=0) for s in (1, 2, 3)]
    v = sweep.group_verdicts(rows)
    assert v[("a5", 5, "path", 3)]["verdict"] == "pending"  # one seed ran before depth 2 was decided
    assert not sweep.waits_for_shorter(a5["a5-len10-l3-path-s1"], v)
    assert sweep.waits_for_shorter(a5["a5-len15-l3-path-s1"], v)  # length 10 at depth 3 is pending and will run
    assert sweep.waits_for_shorter(a5["a5-len15-l2-path-s1"], v)
    todo = [a5["a5-len15-l2-path-s1"], a5["a5-len10-l3-path-s1"]]
    assert sweep.next_cell(todo, v) == 1


def test_cells_of_decided_groups_run_after_the_undecided_ones():
    """next_cell: a group whose verdict a majority of seeds has fixed (two failed, or two solved) waits; the first
    cell of a pending group goes first, in grid order; when every group is decided, the grid order holds."""
    cells = [c for c in sweep.make_grid(argparse.Namespace(grid="paper", tasks="a5", only="", set=[]))
             if c.layers == 2 and c.mechanism == "path" and c.size in (15, 20)]
    rows = [row(size=n, mech="path", layers=2, seed=s, seq=0.0) for n in (15, 20) for s in (1, 2)]
    rows += [row(size=n, mech="path", layers=2, seed=3, finished=0) for n in (15, 20)]
    todo = [c for c in cells if c.seed == 3]  # the two third seeds, both groups unsolved by 2 of 3
    assert sweep.next_cell(todo, sweep.group_verdicts(rows)) == 0  # all decided: grid order
    deeper = [c for c in sweep.make_grid(argparse.Namespace(grid="paper", tasks="a5", only="", set=[]))
              if c.layers == 3 and c.mechanism == "path" and c.size == 15 and c.seed == 1]
    assert sweep.next_cell(todo + deeper, sweep.group_verdicts(rows)) == 2  # depth 3's first seed goes first
    # One failed seed of three leaves the group pending: its next seed is not deferred.
    rows = [row(size=15, mech="path", layers=2, seed=1, seq=0.0)]
    rows += [row(size=15, mech="path", layers=2, seed=s, finished=0) for s in (2, 3)]
    pending = [c for c in cells if c.size == 15 and c.seed == 2]
    assert sweep.next_cell(pending + deeper, sweep.group_verdicts(rows)) == 0
    # Two solved seeds decide it too.
    rows = [row(size=15, mech="path", layers=2, seed=s, seq=0.95) for s in (1, 2)]
    rows += [row(size=15, mech="path", layers=2, seed=3, finished=0)]
    third = [c for c in cells if c.size == 15 and c.seed == 3]
    assert sweep.next_cell(third + deeper, sweep.group_verdicts(rows)) == 1


def test_sweep_skips_cells_a_shallower_solved_depth_makes_unneeded(tmp_path):
    """The driver at the tiny grid with two depths and one seed: depth 1 given as finished elsewhere (path solved,
    rope not); the sweep runs only rope at depth 2, and status counts path's depth 2 as not needed."""
    build = os.path.dirname(os.path.dirname(train_binary()))
    sets = ["--set", "a5.layers=1,2"]
    done = tmp_path / "done"
    for mech, seq_err in (("path", 0.0), ("rope", 0.5)):
        cell = [c for c in sweep.make_grid(argparse.Namespace(grid="tiny", tasks="a5", only="", set=sets[1:]))
                if c.mechanism == mech and c.layers == 1][0]
        folder = done / cell.id
        folder.mkdir(parents=True)
        (folder / "cell.json").write_text(json.dumps(cell.record()))
        (folder / "metrics.json").write_text(json.dumps(
            dict(finished=True, steps_done=8, stop_reason="steps", error={"in_dist": seq_err / 4},
                 sequence_error={"in_dist": seq_err})))
    out = sweep_run(build, tmp_path / "runs", *sets, "--also-done", str(done))
    assert "a5-len3-l2-path-s1: skipped (depth 1 solves it" in out, out
    assert "a5-len3-l2-rope-s1: finished" in out, out
    assert not (tmp_path / "runs" / "a5-len3-l2-path-s1").exists()
    assert "1 not needed" in out and "0 left" in out, out
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sweep_synthetic.py"), "status", "--grid", "tiny",
                        "--tasks", "a5", *sets, "--runs", str(tmp_path / "runs"), "--also-done", str(done)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert "a5: 3 finished, 0 started, 0 not started, 1 not needed" in r.stdout, r.stdout


def test_plot_metrics_positions_count_prefix_lengths_with_and_without_bos(tmp_path):
    """tools/plot_metrics.py --positions: column "len k" is the prefix of k elements; a BOS run's unscored first
    position is left out (the twenty-seventh session's cells: BOS, and the same cell without it)."""
    cells = os.path.join(ROOT, "docs", "results", "synthetic")
    for folder in ("cells/a5-len10-l3-path-s1", "cells-a5-nobos/a5-len10-l3-path-s1"):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_metrics.py"),
                            os.path.join(cells, folder), "--out", str(tmp_path / "p.png"), "--positions"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        assert r.returncode == 0, r.stdout
        head, _, row = r.stdout.strip().splitlines()[-3:]
        assert head.split(" | ")[1:] == [f"len {k}" for k in range(1, 10)] + ["len 10 |"], head
        assert row.split(" | ")[1] == "100.0%", row  # length 1 is the element itself: right in both runs


def test_drain_starts_only_cells_that_finish_in_the_budget():
    """--drain (fits_before_the_end): a cell's remaining steps times its depth's median seconds per step (finished
    cells of any length) against the seconds left; a stopped cell counts only its remaining steps; a depth with no
    finished cell yet takes the deepest shallower depth's rate times the ratio of depths; with none at all, it starts;
    each rate scaled to this call's sharing of the device from the sharing its cell ran with."""
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="a5", only="", set=list(sets))

    a5 = {c.id: c for c in sweep.make_grid(grid())}
    steps = a5["a5-len15-l3-path-s1"].opts["steps"]
    rows = [dict(row(size=10, mech=m, layers=3, seed=1), cell=f"a5-len10-l3-{m}-s1", train_seconds=str(t),
                 steps_done=str(steps)) for m, t in (("path", 400.0), ("rope", 420.0), ("fox", 900.0))]
    rows.append(dict(row(size=15, mech="path", layers=3, seed=1, finished=0), cell="a5-len15-l3-path-s1",
                     train_seconds="", steps_done=str(steps // 2)))
    assert sweep.seconds_per_step(rows, "a5", 3) == 420.0 / steps  # the median of three
    assert sweep.seconds_per_step(rows, "a5", 4) is None
    assert sweep.fits_before_the_end(a5["a5-len15-l3-rope-s1"], rows, 430)
    assert not sweep.fits_before_the_end(a5["a5-len15-l3-rope-s1"], rows, 400)
    assert sweep.fits_before_the_end(a5["a5-len15-l3-path-s1"], rows, 215)  # half its steps are done
    assert not sweep.fits_before_the_end(a5["a5-len15-l3-path-s1"], rows, 200)
    # No cell of depth 4 has finished: depth 3's rate x 4 / 3, 560 s for the whole schedule.
    assert sweep.fits_before_the_end(a5["a5-len15-l4-path-s1"], rows, 570)
    assert not sweep.fits_before_the_end(a5["a5-len15-l4-path-s1"], rows, 550)
    assert sweep.fits_before_the_end(a5["a5-len15-l4-path-s1"], [], 1)  # no rate at any depth: it starts
    # Rates scaled by the sharing now over the sharing each cell ran with (cell.json); a row without it as is.
    assert sweep.seconds_per_step(rows, "a5", 3, sharing=4) == 420.0 / steps  # no row records its sharing
    shared = [dict(r, sharing="12") for r in rows]
    assert sweep.seconds_per_step(shared, "a5", 3, sharing=4) == 420.0 / steps * 4 / 12
    assert sweep.seconds_per_step(shared, "a5", 3) == 420.0 / steps  # no sharing given: unscaled
    assert sweep.fits_before_the_end(a5["a5-len15-l3-rope-s1"], shared, 145, sharing=4)  # 420 x 4 / 12 = 140 s
    assert not sweep.fits_before_the_end(a5["a5-len15-l3-rope-s1"], shared, 135, sharing=4)
    assert not sweep.fits_before_the_end(a5["a5-len15-l3-rope-s1"], shared, 400, sharing=12)
    # The depth-4 fallback scales too: 140 x 4 / 3 = 187 s.
    assert sweep.fits_before_the_end(a5["a5-len15-l4-path-s1"], shared, 190, sharing=4)
    assert not sweep.fits_before_the_end(a5["a5-len15-l4-path-s1"], shared, 180, sharing=4)


def test_a5_later_seeds_run_only_where_the_first_three_split():
    """base_seeds (A5: 3 of 5): a group's verdict is the majority of its five seeds (3), its seeds 4 and 5 are
    skipped once it is decided (lazy_seed_skip) and wait while fewer than three seeds have a result
    (waits_for_base_seeds); seeds 1-3 always run. Three seeds that agree decide; a 2-1 split needs seed 4, and
    seed 5 only if seed 4 sides with the one."""
    def grid(*sets):
        return argparse.Namespace(grid="paper", tasks="a5", only="", set=list(sets))

    a5 = {c.id: c for c in sweep.make_grid(grid())}
    assert not a5["a5-len5-l2-path-s3"].lazy and a5["a5-len5-l2-path-s4"].lazy and a5["a5-len5-l2-path-s5"].lazy

    def group(mech, results):  # results per seed 1..5: accuracy, or None (not finished)
        return [row(mech=mech, layers=2, seed=s, finished=0) if a is None else row(mech=mech, layers=2, seed=s, seq=a)
                for s, a in zip(range(1, 6), results)]

    rows = group("path", [0.95, 0.96, 0.97, None, None])     # 3 of 3: decided, seeds 4 and 5 not needed
    rows += group("rope", [0.95, 0.96, 0.10, None, None])     # 2-1: pending, seed 4 runs
    rows += group("fox", [0.95, 0.96, 0.10, 0.20, None])      # 2-2: seed 5 decides
    rows += group("path-fox", [0.95, 0.96, None, None, None])  # seed 3 pending: seeds 4 and 5 wait
    v = sweep.group_verdicts(rows)
    assert [v[("a5", 5, m, 2)]["verdict"] for m in ("path", "rope", "fox", "path-fox")] == ["solved"] + ["pending"] * 3
    cell = lambda m, s: a5[f"a5-len5-l2-{m}-s{s}"]  # noqa: E731
    assert sweep.skip_reason(cell("path", 4), v) == "its group is decided by its first 3 seeds"
    assert sweep.skip_reason(cell("path", 3), v) is None  # a first seed is never skipped for this reason
    assert sweep.skip_reason(cell("rope", 4), v) is None and not sweep.waits_for_base_seeds(cell("rope", 4), v)
    assert sweep.skip_reason(cell("fox", 5), v) is None
    assert sweep.waits_for_base_seeds(cell("path-fox", 4), v) and not sweep.waits_for_base_seeds(cell("path-fox", 3), v)
    # The next cell: a split group's seed 4 before a waiting seed 4; a decided group's first seed before a waiting
    # later one; a waiting later seed only when nothing else is left.
    assert sweep.next_cell([cell("path-fox", 4), cell("rope", 4)], v) == 1
    v2 = sweep.group_verdicts(rows + group("nope", [0.9, 0.9, None, None, None]))
    assert sweep.next_cell([cell("path-fox", 5), cell("path", 3)], v2) == 1
    assert sweep.next_cell([cell("path-fox", 5)], v2) == 0
    # Seed 4 of the split group sides with the majority: decided, seed 5 not needed.
    rows_after = group("rope", [0.95, 0.96, 0.10, 0.93, None])
    assert sweep.group_verdicts(rows_after)[("a5", 5, "rope", 2)]["verdict"] == "solved"
    assert sweep.skip_reason(cell("rope", 5), sweep.group_verdicts(rows_after)) is not None
    # A task without base_seeds (MQRAR, flip-flop): every seed is a first seed.
    mq = [c for c in sweep.make_grid(argparse.Namespace(grid="paper", tasks="mqrar", only="", set=[]))]
    assert not any(c.lazy for c in mq)

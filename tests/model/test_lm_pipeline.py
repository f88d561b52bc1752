# The LM pipeline end to end on the CPU (ctest ModelLm.EndToEndCpu, about 10 s): a generated source tree
# (lm_fixture.py, not kernel source) -> tools/lm_data.py (tokenizer, shards, stats) -> pathattn_train --task lm
# (RoPE; PaTH straight and chunked into invocations with --stop-after / --resume; PaTH from the RoPE checkpoint
# with --init-from) -> pathattn_lm_eval -> tools/plot_lm.py. Needs PATHATTN_TRAIN and PATHATTN_LM_EVAL (ctest sets
# them); nothing skips.
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)
from lmdata import corpus, shards, tokenizer  # noqa: E402
import lm_fixture  # noqa: E402

TRAIN = os.environ.get("PATHATTN_TRAIN", "")
EVAL = os.environ.get("PATHATTN_LM_EVAL", "")
T = 32
MODEL = ["--layers", "1", "--width", "32", "--heads", "2", "--threads", "1", "--log-every", "0"]
SCHEDULE = ["--steps", "10", "--batch", "4", "--grad-accum", "2", "--lr", "3e-3", "--warmup", "2",
            "--eval-every", "2", "--eval-size", "8", "--eval-batch", "8"]


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def curve(run_dir):
    """metrics.csv without the columns that measure time."""
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: v for k, v in row.items() if k not in ("elapsed_s", "tokens_per_s")} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if not (os.path.isfile(TRAIN) and os.path.isfile(EVAL)):
        pytest.fail("PATHATTN_TRAIN and PATHATTN_LM_EVAL must name the built pathattn_train and pathattn_lm_eval")
    base = tmp_path_factory.mktemp("lm")
    src, out = base / "src", base / "data"
    reasons = lm_fixture.generate(str(src), files_per_dir=5)
    for o in (out, base / "again"):
        run([sys.executable, os.path.join(ROOT, "tools", "lm_data.py"), "--source", src, "--out", o, "--vocab", "400",
             "--valid-permille", "150", "--test-permille", "150", "--shard-tokens", "3000",
             "--roundtrip-permille", "1000", "--threads", "1", "--quiet"])
    return {"base": base, "src": src, "out": out, "reasons": reasons}


def test_data_tool_is_deterministic(data):
    # Two runs on the same tree give the same pieces and shards, byte for byte. (tokenizer.model itself records the
    # paths it was trained with, and stats.json the times, so those two files differ.)
    a, b = data["out"], data["base"] / "again"
    names = sorted(n for n in os.listdir(a) if n not in ("stats.json", "tokenizer.model"))
    assert names == sorted(n for n in os.listdir(b) if n not in ("stats.json", "tokenizer.model"))
    assert "tokenizer.vocab" in names and "train-00000.tok" in names
    for n in names:
        assert open(a / n, "rb").read() == open(b / n, "rb").read(), n
    pa, pb = (tokenizer.load(str(d / "tokenizer.model")) for d in (a, b))
    assert [pa.id_to_piece(i) for i in range(400)] == [pb.id_to_piece(i) for i in range(400)]


def test_data_tool_writes_shards_that_decode_to_the_files(data):
    out, src = data["out"], data["src"]
    st = json.load(open(out / "stats.json"))
    for reason in set(data["reasons"].values()):
        assert st["skipped"][reason][0] >= 1, reason
    sp = tokenizer.load(str(out / "tokenizer.model"))
    assert sp.vocab_size() == 400
    kept, _ = corpus.scan(str(src))
    for split in corpus.SPLITS:
        s = st["splits"][split]
        assert s["files"] > 0 and s["tokens"] > 0, split
        stream = np.concatenate([shards.read_shard(out / shards.shard_name(split, i))[1] for i in range(s["shards"])])
        assert stream.size == s["tokens"]
        # The split's files, in the documented order, each followed by </s>: decoding the stream gives them back.
        files = sorted((r for r in kept if corpus.split_of(r, 150, 150) == split
                        and corpus.check_content(open(src / r, "rb").read())[0] is None), key=corpus.order_key)
        assert len(files) == s["files"]
        docs = np.split(stream, np.flatnonzero(stream == tokenizer.EOS_ID) + 1)[:-1]
        assert len(docs) == len(files)
        for rel, doc in zip(files, docs):
            assert sp.decode(doc[:-1].tolist()) == open(src / rel, encoding="utf-8").read(), rel
    assert st["splits"]["train"]["shards"] >= 2  # the trainer's windows cross a shard boundary


def test_train_resume_eval_init_and_plot(data):
    out, base = data["out"], data["base"]
    lm = ["--task", "lm", "--lm-data", out, "--lm-seq-len", T] + MODEL + SCHEDULE
    rope, path, chunked, conv = (base / n for n in ("rope", "path", "chunked", "path_from_rope"))
    run([TRAIN, "--mechanism", "rope", "--out", rope] + lm)
    run([TRAIN, "--mechanism", "path", "--out", path] + lm)
    # The same PaTH run in three invocations of 4, 4 and 2 steps (as 10-minute device commands would be).
    text = run([TRAIN, "--mechanism", "path", "--out", chunked, "--stop-after", "4"] + lm)
    assert "stopping this invocation at step 4" in text
    run([TRAIN, "--mechanism", "path", "--out", chunked, "--stop-after", "4", "--resume"] + lm)
    run([TRAIN, "--mechanism", "path", "--out", chunked, "--resume"] + lm)
    assert curve(chunked) == curve(path)  # same losses to 10 digits at every evaluation: bit-exact resume
    assert len(curve(path)) == 5
    m = json.load(open(path / "metrics.json"))
    assert m["complete"] and m["tokens_per_step"] == 4 * 2 * T and m["tokens_seen"] == 10 * 4 * 2 * T
    assert abs(m["perplexity"]["valid"] - np.exp(m["loss"]["valid"])) < 1e-6 * m["perplexity"]["valid"]
    first, last = float(curve(rope)[0]["valid_loss"]), float(curve(rope)[-1]["valid_loss"])
    assert last < first, "RoPE's validation loss must fall on the fixture"

    # Evaluation: the trainer's validation loss again at T, and loss by position on the test split out to 4 T.
    for r in (rope, path):
        run([EVAL, "--ckpt", r / "ckpt", "--data", out, "--out", r / "eval", "--length", 4 * T, "--windows", "3",
             "--bucket", 8, "--threads", "1"])
        ev = json.load(open(r / "eval" / "eval.json"))
        want = float(curve(r)[-1]["valid_loss"])
        # Same windows, same weights, same forward: equal up to the 8 digits eval.json prints.
        assert abs(ev["valid"]["loss"] - want) < 1e-6 * want
        assert [(g["begin"], g["end"]) for g in ev["ranges"]] == [(0, T), (T, 2 * T), (2 * T, 4 * T)]
        rows = list(csv.DictReader(open(r / "eval" / "extrap.csv")))
        assert len(rows) == 4 * T // 8 and all(np.isfinite(float(x["loss"])) for x in rows)

    # RoPE -> PaTH: the RoPE weights, the new PaTH tensors reported, then training continues.
    run([TRAIN, "--mechanism", "path", "--out", conv, "--init-from", rope / "ckpt"] + lm + ["--steps", "4"])
    report = open(conv / "init_report.txt").read().splitlines()
    new = sorted(l.split()[1] for l in report if l.startswith("new "))
    assert new == sorted(f"block0.attn.{n}" for n in ("bt_proj.bias", "bt_proj.weight", "w_conv1d.weight",
                                                      "w_proj.0.weight", "w_proj.1.weight"))
    assert not [l for l in report if l.startswith("dropped ")]
    assert json.load(open(conv / "metrics.json"))["init_from"] == str(rope / "ckpt")

    run([sys.executable, os.path.join(ROOT, "tools", "plot_lm.py"), rope, path, conv, "--curves", base / "c.png",
         "--extrap", base / "e.png"])
    assert os.path.getsize(base / "c.png") > 0 and os.path.getsize(base / "e.png") > 0

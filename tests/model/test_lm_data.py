# The LM data tools on their own (ctest ModelLm.DataTools): the split rule, the file selection, the shard format's
# Python writer and reader (the C++ reader is tested in test_model_lm.cpp, and both in test_lm_pipeline.py).
import hashlib
import os
import struct
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lmdata import corpus, shards  # noqa: E402
import lm_fixture  # noqa: E402


def test_split_rule_is_the_documented_hash():
    # corpus.py's rule, recomputed here from its definition: first 8 bytes of SHA-256, little-endian, mod 1000.
    for rel in ["kernel/sched/core.c", "drivers/net/Kconfig", "Makefile", "a/b/c.h"]:
        h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little") % 1000
        want = "valid" if h < 10 else "test" if h < 20 else "train"
        assert corpus.split_of(rel, 10, 10) == want, rel


def test_split_rates_and_stability():
    paths = [f"dir{i % 97}/file{i}.c" for i in range(20000)]
    got = [corpus.split_of(p, 10, 10) for p in paths]
    # Binomial(20000, 0.01): mean 200, sd 14; 150..250 is more than 3.5 sd either side.
    assert 150 <= got.count("valid") <= 250 and 150 <= got.count("test") <= 250
    # The split of a path does not depend on the other paths or their order.
    assert [corpus.split_of(p, 10, 10) for p in reversed(paths)] == got[::-1]
    # A larger test share only moves files from train into test, never valid's.
    wider = [corpus.split_of(p, 10, 50) for p in paths]
    assert all(a == b or (a == "train" and b == "test") for a, b in zip(got, wider))


def test_bad_split_rates_are_rejected():
    with pytest.raises(ValueError, match="valid_permille"):
        corpus.split_of("a.c", 600, 400)
    with pytest.raises(ValueError, match="valid_permille"):
        corpus.split_of("a.c", -1, 10)


def test_order_keeps_folders_together():
    paths = [f"d{i}/f{j}.c" for i in range(30) for j in range(5)]
    ordered = sorted(paths, key=corpus.order_key)
    folders = [p.split("/")[0] for p in ordered]
    runs = sum(1 for i in range(len(folders)) if i == 0 or folders[i] != folders[i - 1])
    assert runs == 30  # each folder is one contiguous run
    assert ordered != sorted(paths)  # folders are not in path order (hash order)


def test_selection_skips_each_reason(tmp_path):
    reasons = lm_fixture.generate(str(tmp_path), files_per_dir=1)
    kept, skipped = corpus.scan(str(tmp_path))
    for rel, reason in reasons.items():
        data = open(tmp_path / rel, "rb").read() if not os.path.islink(tmp_path / rel) else b""
        if rel in kept:  # passed the name/folder/size rules: must fail the content check with its reason
            assert corpus.check_content(data)[0] == reason, rel
        else:
            assert reason in skipped, (rel, reason, skipped)
    assert "drivers/net/alpha/Makefile" in kept and "drivers/net/alpha/Kconfig" in kept
    assert "drivers/net/alpha/alpha0.c" in kept and "drivers/net/alpha/alpha0.h" in kept


def test_shard_round_trip(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16) % 300
    p = tmp_path / "train-00000.tok"
    shards.write_shard(p, 300, tokens)
    vocab, got = shards.read_shard(p)
    assert vocab == 300 and np.array_equal(got, tokens)
    raw = open(p, "rb").read()
    assert raw[:8] == b"PATHLMTK" and len(raw) == 32 + 2000
    assert struct.unpack_from("<I", raw, 24)[0] == zlib.crc32(raw[32:])


def test_shard_errors_name_the_problem(tmp_path):
    p = tmp_path / "s.tok"
    shards.write_shard(p, 50, np.arange(40, dtype=np.uint16))
    raw = bytearray(open(p, "rb").read())
    cases = {
        "bad magic": bytes(b"XATHLMTK" + raw[8:]),
        "truncated": bytes(raw[:-2]),
        "trailing bytes": bytes(raw + b"\0\0"),
        "checksum": bytes(raw[:40] + bytes([raw[40] ^ 1]) + raw[41:]),
        "version": bytes(raw[:8] + struct.pack("<I", 2) + raw[12:]),
    }
    for what, data in cases.items():
        q = tmp_path / f"{what.replace(' ', '_')}.tok"
        open(q, "wb").write(data)
        with pytest.raises(ValueError, match=what) as e:
            shards.read_shard(q)
        assert str(q) in str(e.value)
    with pytest.raises(ValueError, match="not below vocab"):
        shards.write_shard(p, 10, np.array([3, 12], dtype=np.uint16))


def test_split_writer_cuts_the_stream(tmp_path):
    w = shards.SplitWriter(str(tmp_path), "train", 100, shard_tokens=64)
    docs = [np.arange(n, dtype=np.uint16) % 100 for n in (10, 70, 5, 100)]
    for d in docs:
        w.append(d)
    w.close()
    assert w.shards == 3 and w.tokens == 185  # 64 + 64 + 57
    stream = np.concatenate([shards.read_shard(tmp_path / shards.shard_name("train", i))[1] for i in range(w.shards)])
    assert np.array_equal(stream, np.concatenate(docs))
    empty = shards.SplitWriter(str(tmp_path), "valid", 100, shard_tokens=64)
    empty.close()  # an empty split still has shard 0, so the reader says "too few tokens", not "no shards"
    assert empty.shards == 1 and shards.read_shard(tmp_path / "valid-00000.tok")[1].size == 0

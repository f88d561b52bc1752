#!/usr/bin/python3
"""Packs LM shards for the trip to the GPU machine, whose calls carry at most 64 MiB in all (the working tree
included): each file xz-compressed on its own (uint16 kernel tokens compress about 4x, measured), grouped into
parts of at most --max-mib, each part a folder to carry in one call. tools/lm_unpack.py restores the files on the
other side (Python's lzma; or `xz -dk`), checking sizes and the shards' checksums.

  /usr/bin/python3 tools/lm_pack.py DATA OUT --train-shards N [--max-mib 48]

Part 0 holds the tokenizer, stats, valid and test shards, then train shards in order; later parts hold the rest of
the first N train shards. Every part has a MANIFEST.json (file, raw bytes, compressed bytes).
"""
import argparse
import json
import lzma
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lmdata import shards  # noqa: E402


def shard_files(data, split):
    names = sorted(n for n in os.listdir(data) if n.startswith(split + "-") and n.endswith(".tok"))
    if [shards.shard_name(split, i) for i in range(len(names))] != names:
        sys.exit(f"lm_pack: {split} shards in {data} are not numbered 0..{len(names) - 1} without gaps")
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="tools/lm_data.py output folder")
    ap.add_argument("out", help="folder for part-00, part-01, ...")
    ap.add_argument("--train-shards", type=int, required=True, help="first N train shards to pack")
    ap.add_argument("--max-mib", type=float, default=48, help="compressed MiB per part (a call carries 64 in all)")
    ap.add_argument("--preset", type=int, default=6, help="xz preset (9 gained nothing on tokens, measured)")
    args = ap.parse_args()
    train = shard_files(args.data, "train")
    if not 0 < args.train_shards <= len(train):
        ap.error(f"--train-shards: expected 1..{len(train)} (the train shards in {args.data}), got {args.train_shards}")
    files = [n for n in ("tokenizer.model", "tokenizer.vocab", "stats.json", "stats.md")
             if os.path.exists(os.path.join(args.data, n))]
    files += shard_files(args.data, "valid") + shard_files(args.data, "test") + train[:args.train_shards]
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    limit = int(args.max_mib * (1 << 20))
    parts, part, used = [], None, 0
    for name in files:
        with open(os.path.join(args.data, name), "rb") as f:
            raw = f.read()
        packed = lzma.compress(raw, preset=args.preset)
        if part is None or (used + len(packed) > limit and part["files"]):
            part = {"dir": os.path.join(args.out, f"part-{len(parts):02d}"), "files": []}
            os.makedirs(part["dir"])
            parts.append(part)
            used = 0
        if len(packed) > limit:
            sys.exit(f"lm_pack: {name} compresses to {len(packed) / 2**20:.1f} MiB, over --max-mib {args.max_mib}")
        with open(os.path.join(part["dir"], name + ".xz"), "wb") as f:
            f.write(packed)
        part["files"].append({"file": name, "bytes": len(raw), "xz_bytes": len(packed)})
        used += len(packed)
    for p in parts:
        with open(os.path.join(p["dir"], "MANIFEST.json"), "w") as f:
            json.dump(p["files"], f, indent=1)
        raw = sum(e["bytes"] for e in p["files"])
        xz = sum(e["xz_bytes"] for e in p["files"])
        print(f"{p['dir']}: {len(p['files'])} files, {raw / 2**20:.1f} MiB -> {xz / 2**20:.1f} MiB "
              f"({raw / max(xz, 1):.2f}x)")


if __name__ == "__main__":
    main()

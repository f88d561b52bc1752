#!/usr/bin/env python3
"""Restores parts written by tools/lm_pack.py into a data folder (any Python 3 with its standard lzma module: the
GPU machine's). Checks every file's size against the part's MANIFEST.json and every shard's checksum.

  python3 tools/lm_unpack.py PART [PART ...] --into DATA
"""
import argparse
import json
import lzma
import os
import struct
import zlib


def check_shard(name, data):
    # The header of tools/lmdata/shards.py (kept standalone here: this runs with nothing but the standard library).
    if len(data) < 32:
        raise SystemExit(f"lm_unpack: {name} is shorter than a shard header")
    magic, version, vocab, count, crc, token_bytes = struct.unpack_from("<8sIIQII", data)
    if magic != b"PATHLMTK" or len(data) != 32 + 2 * count or zlib.crc32(data[32:]) != crc:
        raise SystemExit(f"lm_unpack: {name} is damaged (magic, size or checksum)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", help="part folders (part-00, ...)")
    ap.add_argument("--into", required=True, help="data folder to write")
    args = ap.parse_args()
    os.makedirs(args.into, exist_ok=True)
    for part in args.parts:
        with open(os.path.join(part, "MANIFEST.json")) as f:
            manifest = json.load(f)
        for e in manifest:
            with open(os.path.join(part, e["file"] + ".xz"), "rb") as f:
                data = lzma.decompress(f.read())
            if len(data) != e["bytes"]:
                raise SystemExit(f"lm_unpack: {e['file']}: {len(data)} bytes, the manifest says {e['bytes']}")
            if e["file"].endswith(".tok"):
                check_shard(e["file"], data)
            with open(os.path.join(args.into, e["file"]), "wb") as f:
                f.write(data)
        print(f"lm_unpack: {part}: {len(manifest)} files into {args.into}")


if __name__ == "__main__":
    main()

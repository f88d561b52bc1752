"""The shard format (the C++ reader is model/lm_shard.h; keep the two in step).

A shard: a 32-byte little-endian header, then `count` token ids as uint16.
  0 magic b"PATHLMTK" | 8 u32 version 1 | 12 u32 vocab | 16 u64 count | 24 u32 crc32 (zlib) of the token bytes
  | 28 u32 bytes per token (2)
The shards of a split, <split>-00000.tok, <split>-00001.tok, ..., are one token stream in that order.
"""
import os
import struct
import zlib

import numpy as np

MAGIC = b"PATHLMTK"
VERSION = 1
HEADER = struct.Struct("<8sIIQII")  # 32 bytes


def shard_name(split, index):
    return f"{split}-{index:05d}.tok"


def write_shard(path, vocab, tokens):
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    if not 0 < vocab <= 65536:
        raise ValueError(f"vocab: expected 1..65536 (uint16 ids), got {vocab}")
    if tokens.size and int(tokens.max()) >= vocab:
        raise ValueError(f"tokens: id {int(tokens.max())} is not below vocab {vocab}")
    payload = tokens.tobytes()
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, vocab, tokens.size, zlib.crc32(payload), 2))
        f.write(payload)


def read_shard(path):
    """(vocab, tokens as uint16 array); raises ValueError naming the file and what was expected."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        raise ValueError(f"shard {path}: truncated: {len(data)} bytes, expected at least the {HEADER.size}-byte header")
    magic, version, vocab, count, crc, token_bytes = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"shard {path}: bad magic: expected {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"shard {path}: version {version}, expected {VERSION}")
    if token_bytes != 2:
        raise ValueError(f"shard {path}: bytes per token {token_bytes}, expected 2")
    expected = HEADER.size + 2 * count
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes"
        raise ValueError(f"shard {path}: {what}: {len(data)} bytes, expected {expected} for {count} tokens")
    payload = data[HEADER.size:]
    if zlib.crc32(payload) != crc:
        raise ValueError(f"shard {path}: checksum mismatch")
    return vocab, np.frombuffer(payload, dtype="<u2")


class SplitWriter:
    """Appends documents to one split's token stream, cutting it into shards of `shard_tokens` tokens."""

    def __init__(self, out_dir, split, vocab, shard_tokens):
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens: expected >= 1, got {shard_tokens}")
        self.out_dir, self.split, self.vocab, self.shard_tokens = out_dir, split, vocab, shard_tokens
        self.pending, self.pending_n, self.shards, self.tokens = [], 0, 0, 0

    def append(self, ids):
        ids = np.asarray(ids, dtype=np.uint16)
        self.pending.append(ids)
        self.pending_n += ids.size
        self.tokens += ids.size
        while self.pending_n >= self.shard_tokens:
            buf = np.concatenate(self.pending)
            self._write(buf[: self.shard_tokens])
            rest = buf[self.shard_tokens:]
            self.pending, self.pending_n = [rest], rest.size

    def close(self):
        if self.pending_n > 0 or self.shards == 0:
            self._write(np.concatenate(self.pending) if self.pending else np.zeros(0, np.uint16))
        self.pending, self.pending_n = [], 0

    def _write(self, tokens):
        write_shard(os.path.join(self.out_dir, shard_name(self.split, self.shards)), self.vocab, tokens)
        self.shards += 1

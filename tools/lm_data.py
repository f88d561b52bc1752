#!/usr/bin/python3
"""Turns a source tree into language-model shards: selection and split (tools/lmdata/corpus.py), a SentencePiece
tokenizer trained on a sample of the train split (tools/lmdata/tokenizer.py), uint16 shards (tools/lmdata/shards.py,
read by model/lm_shard.h), and statistics.

  /usr/bin/python3 tools/lm_data.py --source TREE --out OUT [--vocab 8192] [--shard-tokens 8388608]

OUT gets train-NNNNN.tok, valid-NNNNN.tok, test-NNNNN.tok, tokenizer.model (+ .vocab), stats.json, stats.md.
Every file becomes its tokens followed by </s> (id 1); files follow the split's order (corpus.py).
tools/lm_data.sh runs this on the pinned Linux source package.
"""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lmdata import corpus, shards, tokenizer  # noqa: E402


def read_selected(root, kept, valid_permille, test_permille, skipped):
    """Content checks and split of every kept file: {split: [(relpath, bytes)]}, in the split's order."""
    by_split = {s: [] for s in corpus.SPLITS}
    for rel in kept:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        reason, _ = corpus.check_content(data)
        if reason:
            fb = skipped.setdefault(reason, [0, 0])
            fb[0] += 1
            fb[1] += len(data)
            continue
        by_split[corpus.split_of(rel, valid_permille, test_permille)].append((rel, len(data)))
    for s in by_split:
        by_split[s].sort(key=lambda e: corpus.order_key(e[0]))
    return by_split


def write_sample(root, train_files, sample_bytes, path):
    """The tokenizer's training text: train files in the order of a second hash until sample_bytes."""
    order = sorted(train_files, key=lambda e: corpus.path_hash(e[0], b"tokenizer:"))
    files = total = 0
    with open(path, "w", encoding="utf-8") as out:
        for rel, size in order:
            if total >= sample_bytes:
                break
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            out.write(text if text.endswith("\n") else text + "\n")
            files += 1
            total += size
    return files, total


def encode_split(root, files, sp, writer, threads, roundtrip_permille, log):
    """Encodes the split's files in order into writer; checks decode(encode(text)) == text on a hashed sample."""
    checked = 0
    batch = 256
    for i in range(0, len(files), batch):
        chunk = files[i:i + batch]
        texts = []
        for rel, _ in chunk:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                texts.append(f.read())
        ids = sp.encode(texts, num_threads=threads)
        for (rel, _), text, doc in zip(chunk, texts, ids):
            writer.append(doc + [tokenizer.EOS_ID])
            if corpus.path_hash(rel, b"roundtrip:") % 1000 < roundtrip_permille:
                if sp.decode(doc) != text:
                    raise RuntimeError(f"tokenizer: decode(encode({rel})) differs from the file")
                checked += 1
        log(i + len(chunk), len(files))
    writer.close()
    return checked


def stats_markdown(st):
    lines = [f"# LM data: {st['source']}", "",
             f"Tokenizer: SentencePiece BPE, {st['tokenizer']['vocab']} pieces, trained on "
             f"{st['tokenizer']['sample_files']} train files ({st['tokenizer']['sample_bytes'] / 1e6:.1f} MB) in "
             f"{st['tokenizer']['train_seconds']:.0f} s; round trip checked on "
             f"{st['tokenizer']['roundtrip_checked']} files.", "",
             "| split | files | bytes | tokens | tokens/byte | shards |", "| --- | --- | --- | --- | --- | --- |"]
    for s in corpus.SPLITS:
        d = st["splits"][s]
        lines.append(f"| {s} | {d['files']} | {d['bytes']} | {d['tokens']} | {d['tokens_per_byte']:.4f} "
                     f"| {d['shards']} |")
    lines += ["", "| skipped because | files | bytes |", "| --- | --- | --- |"]
    for reason, (n, b) in sorted(st["skipped"].items()):
        lines.append(f"| {reason} | {n} | {b} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="root of the source tree")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--label", default="", help="what the tree is (recorded in stats)")
    ap.add_argument("--vocab", type=int, default=8192, help="SentencePiece vocabulary size (<= 65536)")
    ap.add_argument("--valid-permille", type=int, default=10, help="files per thousand (by path hash) in valid")
    ap.add_argument("--test-permille", type=int, default=10, help="files per thousand (by path hash) in test")
    ap.add_argument("--shard-tokens", type=int, default=8 << 20, help="tokens per shard (16 MiB at the default)")
    ap.add_argument("--sample-mib", type=float, default=24, help="tokenizer training text, MiB of train files")
    ap.add_argument("--tokenizer", default="", help="use this tokenizer.model instead of training one")
    ap.add_argument("--roundtrip-permille", type=int, default=20, help="files per thousand whose round trip is checked")
    ap.add_argument("--threads", type=int, default=2, help="tokenizer threads")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if not 256 < args.vocab <= 65536:
        ap.error(f"--vocab: expected 257..65536 (byte fallback needs 256 pieces; ids are uint16), got {args.vocab}")
    if not os.path.isdir(args.source):
        ap.error(f"--source: {args.source} is not a folder")
    os.makedirs(args.out, exist_ok=True)
    for name in os.listdir(args.out):
        if name.endswith(".tok"):
            os.remove(os.path.join(args.out, name))  # stale shards would join the stream

    def say(msg):
        if not args.quiet:
            print(msg, flush=True)

    t0 = time.time()
    kept, skipped = corpus.scan(args.source)
    by_split = read_selected(args.source, kept, args.valid_permille, args.test_permille, skipped)
    say(f"lm_data: {sum(len(v) for v in by_split.values())} files kept, "
        + ", ".join(f"{s} {len(by_split[s])}" for s in corpus.SPLITS) + f" ({time.time() - t0:.0f} s)")
    if not by_split["train"]:
        sys.exit("lm_data: no train files (check --source and the split rates)")

    model_path = os.path.join(args.out, "tokenizer.model")
    tok = {"vocab": args.vocab, "type": "sentencepiece bpe"}
    if args.tokenizer:
        shutil.copy(args.tokenizer, model_path)
        vocab_file = os.path.splitext(args.tokenizer)[0] + ".vocab"
        if os.path.exists(vocab_file):
            shutil.copy(vocab_file, os.path.join(args.out, "tokenizer.vocab"))
        tok.update(sample_files=0, sample_bytes=0, train_seconds=0.0, given=args.tokenizer)
    else:
        sample = os.path.join(args.out, "tokenizer-sample.txt")
        files, nbytes = write_sample(args.source, by_split["train"], int(args.sample_mib * (1 << 20)), sample)
        say(f"lm_data: training the tokenizer ({args.vocab} pieces) on {files} files, {nbytes / 1e6:.1f} MB")
        secs = tokenizer.train(sample, os.path.join(args.out, "tokenizer"), args.vocab, args.threads)
        os.remove(sample)
        tok.update(sample_files=files, sample_bytes=nbytes, train_seconds=secs)
    sp = tokenizer.load(model_path)
    tok["vocab"] = sp.vocab_size()

    splits, checked = {}, 0
    t1 = time.time()
    for s in corpus.SPLITS:
        writer = shards.SplitWriter(args.out, s, sp.vocab_size(), args.shard_tokens)
        last = [0.0]

        def log(done, total, s=s, last=last):
            if time.time() - last[0] > 30 or done == total:
                last[0] = time.time()
                say(f"lm_data: {s} {done}/{total} files, {writer.tokens} tokens ({time.time() - t1:.0f} s)")

        checked += encode_split(args.source, by_split[s], sp, writer, args.threads, args.roundtrip_permille, log)
        nbytes = sum(b for _, b in by_split[s])
        splits[s] = {"files": len(by_split[s]), "bytes": nbytes, "tokens": writer.tokens,
                     "tokens_per_byte": writer.tokens / nbytes if nbytes else 0.0, "shards": writer.shards}
    tok["roundtrip_checked"] = checked
    st = {"source": args.label or os.path.abspath(args.source), "splits": splits, "skipped": skipped,
          "tokenizer": tok, "shard_tokens": args.shard_tokens, "valid_permille": args.valid_permille,
          "test_permille": args.test_permille, "rules": {"extensions": list(corpus.SOURCE_EXTENSIONS),
                                                         "name_prefixes": list(corpus.SOURCE_PREFIXES),
                                                         "excluded_dirs": list(corpus.EXCLUDED_DIRS),
                                                         "max_bytes": corpus.MAX_BYTES},
          "encode_seconds": time.time() - t1, "total_seconds": time.time() - t0}
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(st, f, indent=1)
    with open(os.path.join(args.out, "stats.md"), "w") as f:
        f.write(stats_markdown(st))
    say(stats_markdown(st))


if __name__ == "__main__":
    main()

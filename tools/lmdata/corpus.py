"""Which files of a source tree are data, which split each belongs to, and the order they are written in.

Selection (a file is kept when all hold; otherwise it is counted under the first reason that fails):
  - a regular file (no symlinks) whose name is source-like: extension .c .h .S (C and assembly), .rs (Rust),
    .rst (documentation), .sh .py .pl (scripts), or a name starting with Kconfig, Makefile or Kbuild;
  - not under an excluded folder: by default drivers/gpu/drm/amd/include/asic_reg/, generated register maps
    (373 MB of #define lists in Linux 6.1, 29% of the tree's bytes, that would dominate the data);
  - at most MAX_BYTES (256 KiB): larger files are mostly generated tables and firmware arrays;
  - non-empty, valid UTF-8, no NUL byte, and no U+2581 (SentencePiece's whitespace mark: it would decode as a space).

Split: by a hash of the file's path relative to the tree root (forward slashes): h = the first 8 bytes of
SHA-256(path), little-endian, mod 1000; h < valid_permille -> valid, h < valid_permille + test_permille -> test,
else train. It depends on the path alone, so a file keeps its split across versions of the tree and runs.

Order within a split: folders in the order of SHA-256(folder path), files within a folder by name. Shards are
then a random sample of folders (the first shards of train stand for the whole split), while files of one folder
(one driver, one subsystem) stay adjacent: long windows see related code, which is what length extrapolation
is measured on.
"""
import hashlib
import os

SOURCE_EXTENSIONS = (".c", ".h", ".S", ".rs", ".rst", ".sh", ".py", ".pl")
SOURCE_PREFIXES = ("Kconfig", "Makefile", "Kbuild")
EXCLUDED_DIRS = ("drivers/gpu/drm/amd/include/asic_reg/",)
MAX_BYTES = 256 * 1024
SPLITS = ("train", "valid", "test")


def path_hash(relpath, salt=b""):
    """First 8 bytes of SHA-256(salt + path), little-endian."""
    return int.from_bytes(hashlib.sha256(salt + relpath.encode("utf-8")).digest()[:8], "little")


def split_of(relpath, valid_permille, test_permille):
    if not (0 <= valid_permille and 0 <= test_permille and valid_permille + test_permille < 1000):
        raise ValueError(f"valid_permille ({valid_permille}) + test_permille ({test_permille}): expected 0..999 in all")
    h = path_hash(relpath) % 1000
    if h < valid_permille:
        return "valid"
    if h < valid_permille + test_permille:
        return "test"
    return "train"


def order_key(relpath):
    folder = relpath.rsplit("/", 1)[0] if "/" in relpath else ""
    return (path_hash(folder), folder, relpath)


def name_is_source(name):
    return name.endswith(SOURCE_EXTENSIONS) or name.startswith(SOURCE_PREFIXES)


def check_content(data):
    """None when the bytes are usable text, else the reason (the text is returned too)."""
    if not data:
        return "empty", None
    if b"\0" in data:
        return "NUL byte", None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8", None
    if "\u2581" in text:
        return "contains U+2581", None
    return None, text


def scan(root, excluded_dirs=EXCLUDED_DIRS, max_bytes=MAX_BYTES):
    """Walks root: returns (kept relative paths, sorted; skipped: reason -> [files, bytes])."""
    kept, skipped = [], {}

    def skip(reason, size):
        files_bytes = skipped.setdefault(reason, [0, 0])
        files_bytes[0] += 1
        files_bytes[1] += size

    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if os.path.islink(full) or not os.path.isfile(full):
                skip("not a regular file", 0)
                continue
            size = os.path.getsize(full)
            if not name_is_source(name):
                skip("not a source-like name", size)
            elif any(rel.startswith(d) for d in excluded_dirs):
                skip("excluded folder", size)
            elif size > max_bytes:
                skip(f"larger than {max_bytes} bytes", size)
            else:
                kept.append(rel)
    return kept, skipped

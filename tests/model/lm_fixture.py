"""A small kernel-like source tree for the LM pipeline test (tests/model/test_lm_pipeline.py), generated from a seed:
C files, headers, Makefiles and Kconfig files built from a few templates with varied names, plus one file for
each reason that tools/lmdata/corpus.py skips a file. Not kernel source: every line comes from the templates here.
"""
import os
import random

NOUNS = ["queue", "buffer", "device", "packet", "ring", "table", "entry", "port", "frame", "slot", "page", "timer"]
VERBS = ["init", "reset", "alloc", "free", "lookup", "insert", "remove", "flush", "update", "check", "map", "poll"]
FIELDS = [("int", "count"), ("unsigned long", "flags"), ("u32", "id"), ("size_t", "len"), ("void *", "priv"),
          ("struct list_head", "list"), ("spinlock_t", "lock"), ("u64", "stamp")]
DIRS = ["drivers/net/alpha", "drivers/net/beta", "drivers/usb/gamma", "drivers/usb/delta", "sound/core/eps",
        "fs/zeta", "fs/eta", "kernel/theta", "mm/iota", "net/kappa", "lib/lambda", "block/mu"]


def _function(rng, prefix, struct):
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    n = rng.randint(2, 16)
    body = rng.choice([
        f"\tint i, ret = 0;\n\n\tfor (i = 0; i < n; i++) {{\n\t\tif (p->count > i)\n\t\t\tret += i;\n"
        f"\t\telse\n\t\t\tp->flags |= 1UL << (i & {n - 1});\n\t}}\n\treturn ret;\n",
        f"\tif (!p)\n\t\treturn -EINVAL;\n\tp->count = n;\n\tp->flags = 0;\n\treturn 0;\n",
        f"\tunsigned long flags;\n\n\tspin_lock_irqsave(&p->lock, flags);\n\tp->count -= n;\n"
        f"\tspin_unlock_irqrestore(&p->lock, flags);\n\treturn p->count;\n",
        f"\tswitch (n) {{\n\tcase {n}:\n\t\treturn {prefix}_{noun}_{rng.choice(VERBS)}(p, n - 1);\n"
        f"\tdefault:\n\t\tbreak;\n\t}}\n\treturn -ENODEV;\n",
    ])
    name = f"{prefix}_{verb}_{noun}"
    return name, f"static int {name}(struct {struct} *p, int n)\n{{\n{body}}}\n"


def _c_file(rng, prefix, path):
    struct = f"{prefix}_{rng.choice(NOUNS)}"
    fields = "".join(f"\t{t} {f};\n" for t, f in rng.sample(FIELDS, rng.randint(2, 5)))
    funcs = [_function(rng, prefix, struct) for _ in range(rng.randint(3, 7))]
    exported = funcs[0][0]
    what = f"{rng.choice(NOUNS)} {rng.choice(VERBS)}"
    text = (f"// SPDX-License-Identifier: GPL-2.0\n/*\n * {path}: {what} helpers\n */\n"
            f"#include <linux/kernel.h>\n#include <linux/module.h>\n#include \"{prefix}.h\"\n\n"
            f"struct {struct} {{\n{fields}}};\n\n" + "\n".join(f for _, f in funcs) +
            f"\nEXPORT_SYMBOL_GPL({exported});\nMODULE_LICENSE(\"GPL\");\n")
    return text


def _h_file(rng, prefix):
    guard = f"_{prefix.upper()}_H"
    defs = "".join(f"#define {prefix.upper()}_{rng.choice(NOUNS).upper()}_{i}\t0x{rng.randint(0, 255):02x}\n"
                   for i in range(rng.randint(3, 9)))
    return f"/* SPDX-License-Identifier: GPL-2.0 */\n#ifndef {guard}\n#define {guard}\n\n{defs}\n#endif /* {guard} */\n"


def generate(root, seed=12, files_per_dir=4):
    """Writes the tree under root; returns {relative path: reason} for the files the selection must skip."""
    rng = random.Random(seed)
    for d in DIRS:
        os.makedirs(os.path.join(root, d), exist_ok=True)
        objs = []
        for k in range(files_per_dir):
            prefix = f"{os.path.basename(d)}{k}"
            with open(os.path.join(root, d, prefix + ".c"), "w") as f:
                f.write(_c_file(rng, prefix, f"{d}/{prefix}.c"))
            with open(os.path.join(root, d, prefix + ".h"), "w") as f:
                f.write(_h_file(rng, prefix))
            objs.append(prefix + ".o")
        cfg = os.path.basename(d).upper()
        with open(os.path.join(root, d, "Makefile"), "w") as f:
            f.write(f"# SPDX-License-Identifier: GPL-2.0\nobj-$(CONFIG_{cfg}) += {' '.join(objs)}\n")
        with open(os.path.join(root, d, "Kconfig"), "w") as f:
            f.write(f"config {cfg}\n\ttristate \"{cfg} support\"\n\tdefault n\n\thelp\n\t  Say Y here.\n")
    skipped = {
        "drivers/net/alpha/firmware.bin": (b"\x00\x01\x02binary", "not a source-like name"),
        "drivers/gpu/drm/amd/include/asic_reg/regs.h": (b"#define REG 1\n", "excluded folder"),
        "drivers/usb/gamma/huge.c": (b"int x;\n" * (40 * 1024), "larger than 262144 bytes"),
        "fs/zeta/latin1.c": (b"/* caf\xe9 */\n", "not UTF-8"),
        "fs/eta/nul.h": (b"int a;\x00\n", "NUL byte"),
        "lib/lambda/empty.h": (b"", "empty"),
        "mm/iota/mark.c": ("/* \u2581 */\n".encode(), "contains U+2581"),
    }
    for rel, (data, _) in skipped.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    os.symlink("alpha0.c", os.path.join(root, "drivers/net/alpha/link.c"))
    reasons = {rel: reason for rel, (_, reason) in skipped.items()}
    reasons["drivers/net/alpha/link.c"] = "not a regular file"
    return reasons

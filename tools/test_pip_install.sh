#!/usr/bin/env bash
# `pip install .` as a user does it, checked end to end: the repository's files (tracked and untracked, not ignored:
# what a clone with your changes has, no build folders) are copied to a temp dir, a fresh venv over the system
# packages (torch from Debian here, or the GPU machine's torch) installs them offline without build isolation, and
# that venv's python, run outside the source tree and without PATHATTN_LIBRARY, imports pathattn and runs a tiny
# forward + backward on the CPU, and on CUDA against the CPU when the torch has CUDA. Needs python3-venv, python3-pip, python3-setuptools, python3-wheel, cmake.
#   PYTHON=/usr/bin/python3 (default) picks the python, hence the torch; KEEP=1 keeps the temp dir; VENV=0 installs
#   with pip --target instead of into a venv (below).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "test_pip_install: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi

mkdir "$tmp/src"
# (files deleted in the work tree but still tracked are left out: what is there must build)
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$tmp/src"
else  # a copy of the tree without .git (the GPU machine's): what the build reads
  cp -r CMakeLists.txt setup.py pyproject.toml README.md include src torch python examples "$tmp/src"
fi
# VENV=0 installs into a plain folder instead (pip --target): where PYTHON is itself a venv's python (the GPU
# machine's torch lives in one), a venv made from it would not see that torch.
if [ "${VENV:-1}" = 1 ]; then
  "$PYTHON" -m venv --system-site-packages "$tmp/venv"
  PY="$tmp/venv/bin/python" INSTALL=() PREFIX="$tmp/venv" SITE=""
else
  PY="$PYTHON" INSTALL=(--target "$tmp/site") PREFIX="$tmp/site" SITE="$tmp/site"
fi
start=$(date +%s)
(cd "$tmp/src" && PATHATTN_LIBRARY= "$PY" -m pip install -q --no-build-isolation --no-index --no-deps \
   --disable-pip-version-check "${INSTALL[@]}" .)
echo "test_pip_install: pip install took $(( $(date +%s) - start )) s"

cd "$tmp"
env -u PATHATTN_LIBRARY PYTHONPATH="$SITE" OMP_NUM_THREADS=1 PREFIX="$PREFIX" "$PY" - <<'EOF'
import os
import torch, pathattn

lib = pathattn.library_path()
prefix = os.environ["PREFIX"]
for path in (lib, pathattn.__file__):  # the installed package and its library, not the source tree's or build/
    assert str(path).startswith(prefix), f"{path} is not inside the install {prefix}"
torch.manual_seed(0)
B, T, H, D = 1, 16, 2, 8
q, k, v = (torch.randn(B, T, H, D, requires_grad=True) for _ in range(3))
w = torch.nn.functional.normalize(torch.randn(B, T, H, D), dim=-1).requires_grad_()
beta = (2 * torch.rand(B, T, H)).requires_grad_()
o = pathattn.path_attention(q, k, v, w, beta)
o.square().sum().backward()
assert o.shape == (B, T, H, D) and torch.isfinite(o).all()
for name, x in dict(q=q, k=k, v=v, w=w, beta=beta).items():
    assert x.grad is not None and torch.isfinite(x.grad).all(), name
# Without the Householder factors (beta = 0) PaTH is plain causal softmax attention.
o0 = pathattn.path_attention(q, k, v, w, torch.zeros_like(beta))
s = torch.einsum("bihd,bjhd->bhij", q, k) * D ** -0.5
s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
ref = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)
assert torch.allclose(o0, ref, atol=1e-5), (o0 - ref).abs().max()
if torch.cuda.is_available():
    # The installed library's CUDA kernels (wgmma forward and backward at D = 64, the gate, T not a multiple of the
    # chunk) against its CPU path on the same bf16-rounded inputs: a smoke check of the install, not of precision
    # (tests/cuda holds that): bf16 operands leave ~1e-2 relative, a missing or wrong kernel O(1).
    B, T, H, D = 2, 200, 2, 64
    x = [torch.randn(B, T, H, D).bfloat16().float() for _ in range(3)]
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D), dim=-1)
    beta, g = 2 * torch.rand(B, T, H), -0.1 * torch.rand(B, T, H)
    def run(dev, dt):
        args = [t.to(dev, dt).requires_grad_() for t in x] + [t.to(dev).requires_grad_() for t in (w, beta, g)]
        q, k, v, w_, b_, g_ = args
        o = pathattn.path_attention(q, k, v, w_, b_, g=g_)
        o.float().square().sum().backward()
        return [o.float().cpu()] + [a.grad.float().cpu() for a in args]
    for name, a, b in zip("o dq dk dv dw dbeta dg".split(), run("cuda", torch.bfloat16), run("cpu", torch.float32)):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 5e-2, f"CUDA {name} differs from the CPU path: relative L2 {err:.3g}"
    print(f"test_pip_install: CUDA forward + backward agree with the CPU path ({torch.cuda.get_device_name()})")
print(f"test_pip_install: OK, pathattn from {pathattn.__file__}, library {lib}, torch {torch.__version__}")
EOF

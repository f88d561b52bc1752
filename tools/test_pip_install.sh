#!/usr/bin/env bash
# `pip install .` as a user does it, checked end to end: the repository's files (tracked and untracked, not ignored:
# what a clone with your changes has, no build folders) are copied to a temp dir, a fresh venv over the system
# packages (torch from Debian here, or the GPU machine's torch) installs them offline without build isolation, and
# that venv's python, run outside the source tree and without PATHATTN_LIBRARY, imports pathattn and runs a tiny
# forward + backward on the CPU. Needs python3-venv, python3-pip, python3-setuptools, python3-wheel, cmake.
#   PYTHON=/usr/bin/python3 (default) picks the python, hence the torch; KEEP=1 keeps the temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "test_pip_install: keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi

mkdir "$tmp/src"
# (files deleted in the work tree but still tracked are left out: what is there must build)
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$tmp/src"
"$PYTHON" -m venv --system-site-packages "$tmp/venv"
start=$(date +%s)
(cd "$tmp/src" && PATHATTN_LIBRARY= "$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index \
   --disable-pip-version-check .)
echo "test_pip_install: pip install took $(( $(date +%s) - start )) s"

cd "$tmp"
env -u PATHATTN_LIBRARY -u PYTHONPATH OMP_NUM_THREADS=1 "$tmp/venv/bin/python" - <<'EOF'
import sys
import torch, pathattn

lib = pathattn.library_path()
for path in (lib, pathattn.__file__):  # the installed package and its library, not the source tree's or build/
    assert str(path).startswith(sys.prefix), f"{path} is not inside the venv {sys.prefix}"
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
print(f"test_pip_install: OK, pathattn from {pathattn.__file__}, library {lib}, torch {torch.__version__}")
EOF

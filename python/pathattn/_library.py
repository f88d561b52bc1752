"""Finds and loads libpathattn_torch.so, which registers torch.ops.pathattn.fwd / .bwd.

Where it looks, first match wins:
  1. $PATHATTN_LIBRARY, when set (development: a build of your choice; a set but wrong path is an error, never
     silently replaced by another library);
  2. next to this file: the library that `pip install .` built against the installing torch and put in the package;
  3. <repo>/build/torch/libpathattn_torch.so: the default CMake build folder of a checkout used with
     PYTHONPATH=python.
"""
import os
from pathlib import Path

import torch

LIBRARY_NAME = "libpathattn_torch.so"
PACKAGE_PATH = Path(__file__).resolve().parent / LIBRARY_NAME
# <repo>/python/pathattn/_library.py -> <repo>/build/torch/libpathattn_torch.so (the default build folder).
_REPO = Path(__file__).resolve().parents[2]
DEFAULT_PATH = _REPO / "build" / "torch" / LIBRARY_NAME

BUILD_HINT = (
    "install the package with `pip install --no-build-isolation .` from the repository root (it builds the "
    "library against the torch it finds), or build it with: cmake -S {repo} -B {repo}/build && cmake --build "
    "{repo}/build -j --target pathattn_torch (needs libtorch: Debian's libtorch-dev, or "
    "CMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')), or point "
    "PATHATTN_LIBRARY at an existing libpathattn_torch.so"
)


class LibraryNotFoundError(ImportError):
    """libpathattn_torch.so is not where PATHATTN_LIBRARY, the package folder or the default build folder says."""


def _candidates():
    """(path, where it came from) in search order."""
    env = os.environ.get("PATHATTN_LIBRARY")
    if env:
        return [(Path(env), "PATHATTN_LIBRARY")]
    return [(PACKAGE_PATH, "the package folder"), (DEFAULT_PATH, "the default build folder")]


def library_path() -> Path:
    """The library that load() takes: the first candidate that exists, else the last one tried."""
    candidates = _candidates()
    for path, _ in candidates:
        if path.is_file():
            return path
    return candidates[-1][0]


def load() -> Path:
    candidates = _candidates()
    path = next((p for p, _ in candidates if p.is_file()), None)
    if path is None:
        tried = "; ".join(f"{p} (from {origin})" for p, origin in candidates)
        raise LibraryNotFoundError(
            f"pathattn: the compiled library was not found at {tried}; " + BUILD_HINT.format(repo=_REPO)
        )
    # A library built against another torch fails here with OSError (undefined symbols): that is a real error,
    # not a missing build, so it propagates as is.
    torch.ops.load_library(str(path))
    return path

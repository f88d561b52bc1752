"""Finds and loads libpathattn_torch.so, which registers torch.ops.pathattn.fwd / .bwd."""
import os
from pathlib import Path

import torch

# <repo>/python/pathattn/_library.py -> <repo>/build/torch/libpathattn_torch.so (the default build folder).
_REPO = Path(__file__).resolve().parents[2]
DEFAULT_PATH = _REPO / "build" / "torch" / "libpathattn_torch.so"

BUILD_HINT = (
    "build it with: cmake -S {repo} -B {repo}/build && cmake --build {repo}/build -j --target pathattn_torch "
    "(needs libtorch: Debian's libtorch-dev, or CMAKE_PREFIX_PATH=$(python3 -c 'import torch; "
    "print(torch.utils.cmake_prefix_path)')), or point PATHATTN_LIBRARY at an existing libpathattn_torch.so"
)


class LibraryNotFoundError(ImportError):
    """libpathattn_torch.so is not where PATHATTN_LIBRARY or the default build folder says."""


def library_path() -> Path:
    env = os.environ.get("PATHATTN_LIBRARY")
    return Path(env) if env else DEFAULT_PATH


def load() -> Path:
    path = library_path()
    if not path.is_file():
        origin = "PATHATTN_LIBRARY" if os.environ.get("PATHATTN_LIBRARY") else "the default build folder"
        raise LibraryNotFoundError(
            f"pathattn: the compiled library was not found at {path} (from {origin}); "
            + BUILD_HINT.format(repo=_REPO)
        )
    # A library built against another torch fails here with OSError (undefined symbols): that is a real error,
    # not a missing build, so it propagates as is.
    torch.ops.load_library(str(path))
    return path

"""Builds the torch extension with the project's CMake and installs the `pathattn` package with it.

    pip install --no-build-isolation .

builds libpathattn_torch.so (CMake target pathattn_torch) against the torch that the installing python imports,
with the CUDA kernels when that torch has CUDA and nvcc is found, and puts it inside the installed package, where
`import pathattn` finds it. --no-build-isolation: the build needs that torch, not a fresh one from an index.
Metadata is in pyproject.toml. Environment knobs:
  PATHATTN_CUDA=ON|OFF       force the CUDA kernels on or off (default: on when torch.version.cuda and nvcc)
  PATHATTN_CMAKE_ARGS        extra CMake arguments, split on spaces
  CMAKE_BUILD_PARALLEL_LEVEL build jobs (default: all cores)
"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
LIBRARY_NAME = "libpathattn_torch.so"


class CMakeExtension(Extension):
    """The shared library of the CMake target pathattn_torch; no sources of its own for setuptools."""

    def __init__(self, name):
        super().__init__(name, sources=[])


def find_nvcc():
    """nvcc on PATH, else in $CUDA_HOME or /usr/local/cuda (where the GPU image and tools/setup.sh look)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


class CMakeBuild(build_ext):
    def get_ext_filename(self, fullname):
        # libpathattn_torch.so, the name _library.py looks for, not a Python module's suffixed name. setuptools asks
        # with the last component ("libpathattn_torch", then joined to the package folder) or the full dotted name.
        if fullname.split(".")[-1] == LIBRARY_NAME[: -len(".so")]:
            return os.path.join(*fullname.split(".")[:-1], LIBRARY_NAME)
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        try:
            import torch
        except ImportError as e:
            raise RuntimeError(
                "pathattn: building needs torch importable by this python; install with --no-build-isolation "
                "so that the build sees the torch you will run with"
            ) from e
        nvcc = find_nvcc()
        mode = os.environ.get("PATHATTN_CUDA", "").upper()
        cuda = mode == "ON" or (mode != "OFF" and torch.version.cuda is not None and nvcc is not None)
        if cuda and nvcc is None:
            raise RuntimeError("pathattn: PATHATTN_CUDA=ON but no nvcc on PATH, in $CUDA_HOME or /usr/local/cuda")

        # One CMake build folder per (torch, CUDA) pair: a rebuild after switching torch never reuses a cache
        # configured for the other one.
        flavour = f"torch{torch.__version__.split('+')[0]}-{'cuda' if cuda else 'cpu'}"
        build_dir = Path(self.build_temp).resolve() / f"cmake-{flavour}"
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            "-DPATHATTN_TORCH=ON",
            f"-DPATHATTN_CUDA={'ON' if cuda else 'OFF'}",
            "-DPATHATTN_TESTS=OFF",
            "-DPATHATTN_BENCH=OFF",
            "-DPATHATTN_MODEL=OFF",
        ]
        if cuda:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        args += shlex.split(os.environ.get("PATHATTN_CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        print(f"pathattn: building {LIBRARY_NAME} against torch {torch.__version__} "
              f"({'with' if cuda else 'without'} CUDA kernels) in {build_dir}", flush=True)
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args], check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "pathattn_torch", "-j", jobs], check=True)

        built = build_dir / "torch" / LIBRARY_NAME
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(
    packages=["pathattn"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("pathattn." + LIBRARY_NAME[: -len(".so")])],
    cmdclass={"build_ext": CMakeBuild},
    # Not ./build: that is the CMake build folder of tools/setup.sh.
    options={"build": {"build_base": "build-pip"}},
    zip_safe=False,
)

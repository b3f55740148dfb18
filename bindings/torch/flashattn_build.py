"""PEP 517 build backend of the flashattn-torch package (pyproject.toml at the repository root).

setuptools, plus one step: build_py puts libflashattn.so into flashattn_torch/lib/. The library
is $FLASHATTN_LIBRARY when that is set (an existing build is packed as it is), else it is built
here with CMake into <repo>/build-python (target flashattn only; the CUDA backend when nvcc is
found; extra CMake arguments in $FLASHATTN_CMAKE_ARGS, e.g. "-DFLASHATTN_CUDA=OFF").
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools.build_meta import *  # noqa: F401,F403  (the PEP 517 hooks)
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parents[2]
(ROOT / "build-python").mkdir(exist_ok=True)  # pyproject.toml points setuptools' scratch files here


def _library():
    given = os.environ.get("FLASHATTN_LIBRARY")
    if given:
        path = Path(given)
        if not path.is_file():
            raise FileNotFoundError(f"FLASHATTN_LIBRARY={given} is not a file")
        return path
    build_dir = ROOT / "build-python"
    configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 "-DFLASHATTN_TESTS=OFF", "-DFLASHATTN_BENCH=OFF"]
    subprocess.check_call(configure + shlex.split(os.environ.get("FLASHATTN_CMAKE_ARGS", "")))
    subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "flashattn", "-j", str(os.cpu_count() or 1)])
    return build_dir / "libflashattn.so"


class BuildPy(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "flashattn_torch" / "lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_library(), dest / "libflashattn.so")


class BdistWheel(bdist_wheel):
    """The wheel holds a native library but no Python extension: py3-none-<platform>."""

    def finalize_options(self):
        # Counted as binary, so the package goes to platlib at the wheel's root.
        self.distribution.has_ext_modules = lambda: True
        super().finalize_options()

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]

"""Builds the _strata extension with the project's CMake for `pip install
./python` (pyproject.toml has the metadata). STRATA_BUILD_DIR names an
existing build tree of the project to build in (e.g. build/, which `make
build` made: then only what changed is built); by default a fresh one in
pip's build directory (ccache helps where installed). setuptools' own build
and egg-info directories go to the temporary directory, not into the source
tree."""

import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRATCH_DIR = os.path.join(tempfile.gettempdir(), "strata-pip-%d" % os.getuid())


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("STRATA_BUILD_DIR") or os.path.join(
            os.path.abspath(self.build_temp), "cmake")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.run(["cmake", "-S", SOURCE_DIR, "-B", build_dir, "-G", "Ninja",
                            "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DSTRATA_BUILD_TESTS=OFF",
                            "-DSTRATA_BUILD_PYTHON=ON",
                            "-DPython_EXECUTABLE=" + os.path.realpath(sys.executable)],
                           check=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", "strata_python"], check=True)
        package_dir = os.path.join(build_dir, "python", "strata")
        built = [f for f in os.listdir(package_dir) if f.startswith("_strata") and f.endswith(".so")]
        if len(built) != 1:
            raise RuntimeError("expected one _strata module in %s, found %s" % (package_dir, built))
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(package_dir, built[0]), target)


os.makedirs(SCRATCH_DIR, exist_ok=True)
setup(ext_modules=[Extension("strata._strata", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": os.path.join(SCRATCH_DIR, "build")},
               "egg_info": {"egg_base": SCRATCH_DIR}})

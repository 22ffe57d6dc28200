"""`pip install ./python` as a torch user installs a package: into a fresh
venv made with --system-site-packages (Debian's torch), offline
(--no-build-isolation: the system's setuptools), building the module with
the project's CMake in STRATA_BUILD_DIR. The installed package imports from
the venv, not from the build tree, and its module works.

Run by ctest (tests/CMakeLists.txt) with STRATA_BUILD_DIR set."""

import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class PipInstallTest(unittest.TestCase):
    def test_installs_into_a_fresh_venv_and_imports(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           check=True)
            python = os.path.join(venv, "bin", "python")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            subprocess.run([python, "-m", "pip", "install", "--no-build-isolation",
                            "--no-index", "--quiet", os.path.join(SOURCE_DIR, "python")],
                           check=True, env=env, timeout=1200)
            probe = ("import strata, strata.torch, strata._strata as m; "
                     "print(strata.__file__); "
                     "print(m.flat_layout([('w', [3, 5]), ('b', [5])], 64))")
            out = subprocess.run([python, "-c", probe], check=True, env=env, cwd=tmp,
                                 capture_output=True, text=True).stdout.splitlines()
            self.assertTrue(out[0].startswith(venv), out[0])
            # Tensors start at multiples of 64: w at 0, b at 64; 69 in all.
            self.assertEqual(out[1], "([0, 64], 69)")


if __name__ == "__main__":
    unittest.main()

"""`pip install clients/python` into a venv made by Debian's python3
(--system-site-packages, no index), then the installed package talks to a
real kilnd. The package and proto/ are copied to a temp dir first so the
build leaves the source tree clean (KILN_PROTO_DIR says where proto/ is)."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import Kilnd  # noqa: E402

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))

PROGRAM = r"""
import sys, numpy as np, kiln
assert "site-packages" in kiln.__file__, kiln.__file__
kiln.connect(sys.argv[1])
a = kiln.tensor(np.array([[1, -2], [3, -4]], np.float32))
w = kiln.tensor(np.array([[1], [1]], np.float32))
print(((a + 1).relu() @ w).numpy().ravel().tolist())
"""


class PipInstallTest(unittest.TestCase):
    def test_pip_install_into_a_venv(self):
        tmp = tempfile.mkdtemp(prefix="kiln_pip.")
        kilnd = None
        try:
            src = os.path.join(tmp, "python")
            shutil.copytree(SOURCE / "clients" / "python", src,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           check=True)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["KILN_PROTO_DIR"] = str(SOURCE / "proto")
            r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-index",
                                "--disable-pip-version-check", "-q", src],
                               env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            kilnd = Kilnd(os.path.join(tmp, "cache"))
            r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", PROGRAM, kilnd.addr],
                               env=env, cwd=tmp, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "[2.0, 4.0]")
        finally:
            if kilnd:
                kilnd.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

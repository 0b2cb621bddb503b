"""README.md's "Using it" examples, run exactly as written (ctest label `deploy`).

Every fenced block of that section runs against a real kilnd (ephemeral port,
$KILN_ADDR) from a scratch directory where `build/` is the test build and
`examples/` the repository's: plain blocks with bash (-e: every command must
succeed), ```python blocks with /usr/bin/python3 and
PYTHONPATH=build/clients/python, as the README says. A README example that
stops working fails here."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_util as du  # noqa: E402


def using_it_blocks():
    text = (du.SOURCE / "README.md").read_text()
    m = re.search(r"^## Using it\n(.*?)^## ", text, re.S | re.M)
    if not m:
        raise AssertionError('README.md has no "## Using it" section')
    return re.findall(r"^```(\w*)\n(.*?)^```", m.group(1), re.S | re.M)


class ReadmeTest(unittest.TestCase):
    def test_using_it_runs_as_written(self):
        blocks = using_it_blocks()
        self.assertGreaterEqual(len(blocks), 3)
        tmp = tempfile.mkdtemp(prefix="kiln_readme.")
        kilnd = du.Kilnd(os.path.join(tmp, "cache"))
        try:
            work = os.path.join(tmp, "repo")
            os.makedirs(work)
            os.symlink(os.environ["KILN_BUILD_DIR"], os.path.join(work, "build"))
            os.symlink(du.SOURCE / "examples", os.path.join(work, "examples"))
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["KILN_ADDR"] = kilnd.addr
            outputs = []
            for lang, body in blocks:
                if lang == "python":
                    cmd = ["/usr/bin/python3", "-c", body]
                    run_env = dict(env, PYTHONPATH="build/clients/python")
                else:
                    self.assertEqual(lang, "", f"a {lang!r} block in Using it")
                    cmd = ["bash", "-e", "-o", "pipefail", "-c", body]
                    run_env = env
                r = subprocess.run(cmd, cwd=work, env=run_env, capture_output=True, text=True,
                                   timeout=240)
                self.assertEqual(r.returncode, 0,
                                 f"README block failed:\n{body}\n{r.stdout}\n{r.stderr}\n"
                                 f"kilnd:\n{kilnd.output()}")
                outputs.append(r.stdout)
            text = "\n".join(outputs)
            self.assertIn("cpu:0", text)                  # devices
            self.assertIn("SERVING", text)                # health
            self.assertIn("(4, 10)", text)                # the mlp's logits
            self.assertIn("7.84", text)                   # the Python example's answer
            self.assertTrue(os.path.getsize(os.path.join(work, "trace.json")) > 0)
        finally:
            kilnd.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

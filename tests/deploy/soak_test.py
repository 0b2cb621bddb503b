"""The short soak of `make test` (ctest labels `deploy;soak`): bench/soak.py for
30 s, c=64 mixed tiny session, one-shot and encoder-layer runs of two tenants
against a real kilnd. Every answer must be right, no call may fail (a quota
refusal would be counted apart; the soak's quotas admit c=64), kilnd must drain
and exit 0, and its RSS must stay flat from the middle to the end (within
64 MiB; the 10-minute run is `bench/soak.py --seconds 600`, docs/benchmarks.md)."""

import json
import os
import subprocess
import unittest

import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_util as du  # noqa: E402


class SoakTest(unittest.TestCase):
    def test_c64_mixed_30s(self):
        r = subprocess.run(["/usr/bin/python3", str(du.SOURCE / "bench" / "soak.py"),
                            "--kilnd", du.KILND, "--seconds", "30", "--clients", "64",
                            "--encoder-clients", "4", "--max-rss-growth-mib", "64"],
                           capture_output=True, text=True, timeout=240)
        self.assertTrue(r.stdout.strip(), r.stderr)
        result = json.loads(r.stdout.strip().splitlines()[-1])
        print("soak:", json.dumps(result))
        self.assertEqual(result["errors"], 0, result["first_errors"])
        self.assertEqual(result["kilnd_exit"], 0)
        for kind in ("tiny", "oneshot", "encoder"):
            self.assertGreater(result["runs"][kind], 0, kind)
        self.assertLessEqual(result["rss_growth_middle_to_end_mib"], 64, result["rss_mib"])
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()

"""Training and autodiff through kilnd with the Python package (ctest label
`clients`): train_session(...).step(...) matches PyTorch over 100 steps (the
reference of tests/engine/train/torch_reference.py), kiln.grad / kiln.hvp
through one-shot runs, and the server's errors for bad training requests.

Run by ctest with /usr/bin/python3 and the environment of
python_client_test.py (PYTHONPATH, KILND, KILN_SOURCE_DIR).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

import kiln

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from python_client_test import Kilnd  # noqa: E402 (the same kilnd helper)

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", HERE.parents[1]))

MLP = """graph "py_train_mlp"
input x: f32[16, 6]
input y: i64[16]
param w1: f32[6, 12]
param b1: f32[12]
param w2: f32[12, 3]
param b2: f32[3]
let h = tanh(x @ w1 + b1)
let logits = h @ w2 + b2
let loss = softmax_cross_entropy(logits, y)
out loss
"""


def reference(request):
    out = subprocess.run(["/usr/bin/python3", str(SOURCE / "tests/engine/train/torch_reference.py"),
                          json.dumps(request)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def setUpModule():
    global CACHE, KILND_PROC, CLIENT
    CACHE = tempfile.mkdtemp(prefix="kiln_py_train_cache.")
    KILND_PROC = Kilnd(CACHE)
    CLIENT = kiln.connect(KILND_PROC.addr)


def tearDownModule():
    CLIENT.close()
    KILND_PROC.stop()
    shutil.rmtree(CACHE, ignore_errors=True)


class TrainTest(unittest.TestCase):
    def test_train_session_matches_pytorch(self):
        ref = reference({"mode": "mlp", "kind": "sgd", "lr": 0.1, "momentum": 0.9,
                         "steps": 100, "batch": 16, "sizes": [6, 12, 3], "seed": 5})
        shapes = {"w1": (6, 12), "b1": (12,), "w2": (12, 3), "b2": (3,)}
        init = {n: np.array(ref["init"][n], np.float32).reshape(s) for n, s in shapes.items()}
        s = CLIENT.train_session(kiln.parse(MLP), loss="loss", params=init,
                                 optimizer=kiln.SGD(lr=0.1, momentum=0.9), device="cpu:0")
        self.assertIsInstance(s, kiln.TrainSession)
        for i, b in enumerate(ref["batches"]):
            loss = s.step({"x": np.array(b["x"], np.float32).reshape(16, 6),
                           "y": np.array(b["y"], np.int64)})
            want = ref["losses"][i]
            self.assertLessEqual(abs(loss - want), 1e-4 * abs(want), f"step {i + 1}")
            self.assertEqual(s.last.step, i + 1)
        params = s.get_params()
        for n, shape in shapes.items():
            np.testing.assert_allclose(params[n], np.array(ref["final"][n]).reshape(shape),
                                       rtol=1e-4, atol=1e-4)
        self.assertIn("opt/w1/momentum", params)
        s.close()

    def test_streamed_steps_equal_single_steps(self):
        rng = np.random.default_rng(2)
        init = {"w1": rng.normal(0, 0.3, (6, 12)).astype(np.float32),
                "b1": np.zeros(12, np.float32),
                "w2": rng.normal(0, 0.3, (12, 3)).astype(np.float32),
                "b2": np.zeros(3, np.float32)}
        batches = [{"x": rng.normal(0, 1, (16, 6)).astype(np.float32),
                    "y": rng.integers(0, 3, 16).astype(np.int64)} for _ in range(6)]
        one = CLIENT.train_session(kiln.parse(MLP), loss="loss", params=init,
                                   optimizer=kiln.Lion(lr=1e-3), device="cpu:0")
        many = CLIENT.train_session(kiln.parse(MLP), loss="loss", params=init,
                                    optimizer=kiln.Lion(lr=1e-3), device="cpu:0")
        want = [one.step(b) for b in batches]
        got = list(many.steps(batches))
        self.assertEqual(got, want)
        self.assertEqual(many.last.step, 6)
        one.close()
        many.close()

    def test_grad_and_hvp_one_shot(self):
        g = kiln.parse("graph \"q\"\ninput x: f32[3]\nparam w: f32[3]\n"
                       "let loss = reduce_sum(x * w * w * w)\nout loss\n")
        x = np.array([1, 2, 3], np.float32)
        w = np.array([0.5, -1, 2], np.float32)
        out = CLIENT.run(kiln.grad(g, wrt=["w"], with_loss=True), {"x": x}, params={"w": w})
        self.assertEqual(list(out), ["loss", "grad/w"])
        np.testing.assert_allclose(out["grad/w"], 3 * x * w * w, rtol=1e-6)
        v = np.array([1, 0.5, -1], np.float32)
        out = CLIENT.run(kiln.hvp(g, wrt="w"), {"x": x, "tangent/w": v}, params={"w": w})
        np.testing.assert_allclose(out["hvp/w"], 6 * x * w * v, rtol=1e-6)

    def test_bad_requests_are_named(self):
        g = kiln.parse(MLP)
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.train_session(g, loss="loss", params={}, optimizer=kiln.Adam(lr=0.01, betas=(1.5, 0.9)))
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("beta1 = 1.5", e.exception.message)
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.train_session(g, loss="logitz", params={}, optimizer=kiln.SGD(lr=0.1))
        self.assertIn('"logitz" is no output', e.exception.message)
        with self.assertRaises(TypeError):
            kiln.SGD(lr=0.1, betas=(0.9, 0.9))


if __name__ == "__main__":
    unittest.main()

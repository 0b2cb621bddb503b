"""Training and autodiff through kilnd with the Python package (ctest label
`clients`): train_session(...).step(...) matches PyTorch over 100 steps (the
reference of tests/engine/train/torch_reference.py), kiln.grad / kiln.hvp
and kiln.vmap (per-slice runs, per-example gradients) through one-shot runs, the server's errors for bad training requests, and
checkpoints: TrainSession.save / train_session(resume=...) continue a run bit
for bit, and bad or hostile files are refused with errors naming the fault.

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

    def test_vmap_equals_per_slice_runs_and_gives_per_example_grads(self):
        g = kiln.parse("graph \"v\"\ninput x: f32[4]\nparam w: f32[4, 3]\n"
                       "let h = tanh(x @ w)\nlet loss = reduce_sum(h * h)\nout h\nout loss\n")
        rng = np.random.default_rng(3)
        w = rng.normal(0, 0.5, (4, 3)).astype(np.float32)
        xs = rng.normal(0, 1, (5, 4)).astype(np.float32)
        out = CLIENT.run(kiln.vmap(g), {"x": xs}, params={"w": w})  # size from the inputs
        grads = CLIENT.run(kiln.vmap(kiln.grad(g, wrt=["w"], with_loss=True)), {"x": xs},
                           params={"w": w})
        self.assertEqual(out["h"].shape, (5, 3))
        self.assertEqual(grads["grad/w"].shape, (5, 4, 3))
        for i in range(5):
            one = CLIENT.run(g, {"x": xs[i]}, params={"w": w})
            np.testing.assert_allclose(out["h"][i], one["h"], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(out["loss"][i], one["loss"], rtol=1e-6)
            gi = CLIENT.run(kiln.grad(g, wrt=["w"]), {"x": xs[i]}, params={"w": w})
            np.testing.assert_allclose(grads["grad/w"][i], gi["grad/w"], rtol=1e-5, atol=1e-6)
        # The batch at axis 1 of x and of h (loss, a scalar, has no axis 1).
        g2 = kiln.parse("graph \"v2\"\ninput x: f32[4]\nparam w: f32[4, 3]\n"
                        "let h = tanh(x @ w)\nout h\n")
        out = CLIENT.run(kiln.vmap(g2, axis=1), {"x": xs.T.copy()}, params={"w": w})
        self.assertEqual(out["h"].shape, (3, 5))
        np.testing.assert_allclose(out["h"].T, np.tanh(xs @ w), rtol=1e-5, atol=1e-6)
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.run(kiln.vmap(g, axis=1), {"x": xs.T.copy()}, params={"w": w})
        self.assertIn('vmap axis 1 is out of range for output "loss" of rank 0', e.exception.message)
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.run(kiln.vmap(g, size=7), {"x": xs}, params={"w": w})
        self.assertIn('input "x" has 5 at the vmap axis, but the batch is 7', e.exception.message)

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


def _mlp_setup(seed=2):
    rng = np.random.default_rng(seed)
    init = {"w1": rng.normal(0, 0.3, (6, 12)).astype(np.float32),
            "b1": np.zeros(12, np.float32),
            "w2": rng.normal(0, 0.3, (12, 3)).astype(np.float32),
            "b2": np.zeros(3, np.float32)}
    batches = [{"x": rng.normal(0, 1, (16, 6)).astype(np.float32),
                "y": rng.integers(0, 3, 16).astype(np.int64)} for _ in range(6)]
    return init, batches


def _adamw(lr=0.01):
    return kiln.AdamW(lr=lr, schedule=kiln.cosine(total_steps=6, warmup_steps=2), max_grad_norm=1.0)


class CheckpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kiln_py_ckpt.")
        self.sessions = []

    def tearDown(self):
        for s in self.sessions:
            try:
                s.close()
            except kiln.KilnError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def session(self, **kw):
        kw.setdefault("optimizer", _adamw())
        s = CLIENT.train_session(kiln.parse(MLP), loss="loss", device="cpu:0", **kw)
        self.sessions.append(s)
        return s

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_resume_continues_bit_exactly(self):
        init, batches = _mlp_setup()
        full = self.session(params=init)
        want = [full.step(b) for b in batches]
        full.save(self.path("full.safetensors"))
        cut = self.session(params=init)
        for b in batches[:3]:
            cut.step(b)
        self.assertEqual(cut.save(self.path("cut.safetensors"), extra={"note": "mine"}), 3)
        resumed = self.session(resume=self.path("cut.safetensors"))
        got = [resumed.step(b) for b in batches[3:]]
        self.assertEqual(got, want[3:])  # bit for bit
        self.assertEqual(resumed.last.step, 6)
        a, b = full.get_params(), resumed.get_params()
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name].dtype, b[name].dtype, name)
            self.assertEqual(a[name].tobytes(), b[name].tobytes(), name)
        resumed.save(self.path("resumed.safetensors"))
        self.assertEqual(pathlib.Path(self.path("full.safetensors")).read_bytes(),
                         pathlib.Path(self.path("resumed.safetensors")).read_bytes())
        tensors, meta = kiln.checkpoint.read(self.path("cut.safetensors"))
        self.assertEqual(meta["step"], "3")
        self.assertEqual(meta["note"], "mine")
        self.assertEqual(meta["format"], "kiln.checkpoint")
        self.assertIn("opt/w1/m", tensors)
        # load() into a session that already trained replaces its state too.
        other = self.session(params=init)
        other.step(batches[0])
        other.load(self.path("cut.safetensors"))
        self.assertEqual([other.step(b) for b in batches[3:]], want[3:])

    def test_f16_amp_resume_keeps_the_loss_scale(self):
        # f16 AMP with dynamic loss scaling from 2^24 (f16's backward
        # overflows at first: skipped steps halve it); the scale, its good
        # steps and the skip count ride in the checkpoint and the resumed run
        # equals the uninterrupted one bit for bit.
        init, batches = _mlp_setup()
        amp = kiln.Amp("f16", init_scale=2.0 ** 24, growth_interval=2)
        full = self.session(params=init, amp=amp)
        want = [full.step(b) for b in batches]
        cut = self.session(params=init, amp=amp)
        for b in batches[:3]:
            cut.step(b)
        cut.save(self.path("amp.safetensors"))
        tensors, _ = kiln.checkpoint.read(self.path("amp.safetensors"))
        self.assertGreater(int(tensors["opt/skipped_steps"]), 0)
        self.assertLess(float(tensors["opt/loss_scale"]), 2.0 ** 24)
        resumed = self.session(resume=self.path("amp.safetensors"), amp=amp)
        self.assertEqual([resumed.step(b) for b in batches[3:]], want[3:])
        a, b = full.get_params(), resumed.get_params()
        self.assertIn("opt/loss_scale_good_steps", a)
        for name in a:
            self.assertEqual(a[name].tobytes(), b[name].tobytes(), name)

    def test_qat_lsq_resume_keeps_the_learned_scales(self):
        # QAT with learned (LSQ) weight scales: the scales are params the
        # steps move; they ride in the checkpoint with their Adam state, and
        # the resumed run equals the uninterrupted one bit for bit.
        init, batches = _mlp_setup()
        qat = kiln.Qat(bits=8, per_channel=True, lsq=True)
        full = self.session(params=init, optimizer=kiln.Adam(lr=0.02), qat=qat)
        want = [full.step(b) for b in batches]
        cut = self.session(params=init, optimizer=kiln.Adam(lr=0.02), qat=qat)
        for b in batches[:3]:
            cut.step(b)
        cut.save(self.path("lsq.safetensors"))
        tensors, _ = kiln.checkpoint.read(self.path("lsq.safetensors"))
        self.assertIn("w1/lsq_scale", tensors)
        self.assertIn("opt/w1/lsq_scale/m", tensors)
        # Learned: the scale at step 3 is not the one at step 6.
        self.assertNotEqual(np.asarray(tensors["w1/lsq_scale"]).tobytes(),
                            full.get_params()["w1/lsq_scale"].tobytes())
        resumed = self.session(resume=self.path("lsq.safetensors"),
                               optimizer=kiln.Adam(lr=0.02), qat=qat)
        self.assertEqual([resumed.step(b) for b in batches[3:]], want[3:])
        a, b = full.get_params(), resumed.get_params()
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name].tobytes(), b[name].tobytes(), name)

    def test_qat_session_trains(self):
        init, batches = _mlp_setup()
        s = self.session(params=init, optimizer=kiln.Adam(lr=0.02),
                         qat=kiln.Qat(bits=8, per_channel=True, lsq=True))
        losses = [s.step(b) for b in batches * 5]
        self.assertLess(sum(losses[-6:]), sum(losses[:6]))
        self.assertIn("w1/lsq_scale", s.get_params())
        with self.assertRaises(ValueError):
            kiln.Qat(bits=3)
        with self.assertRaises(ValueError):
            kiln.Amp("f64")

    def test_checkpoints_that_do_not_fit_are_refused(self):
        init, batches = _mlp_setup()
        s = self.session(params=init)
        for b in batches[:2]:
            s.step(b)
        good = self.path("good.safetensors")
        s.save(good)
        tensors, meta = kiln.checkpoint.read(good)

        def variant(name, change):
            t = {k: v.copy() for k, v in tensors.items()}
            m = dict(meta)
            change(t, m)
            path = self.path(name + ".safetensors")
            kiln.checkpoint.write(path, t, m)
            return path

        def refused(path, needle, **kw):
            with self.assertRaises(kiln.CheckpointError) as e:
                self.session(resume=path, **kw)
            self.assertIn(needle, str(e.exception))

        refused(good, "optimizer.lr: 0.01 -> 0.02", optimizer=_adamw(lr=0.02))
        refused(good, "optimizer.kind", optimizer=kiln.Adam(
            lr=0.01, schedule=kiln.cosine(total_steps=6, warmup_steps=2), max_grad_norm=1.0))
        with self.assertRaises(kiln.CheckpointError) as e:
            CLIENT.train_session(kiln.parse(MLP.replace("tanh", "relu")), loss="loss",
                                 optimizer=_adamw(), resume=good)
        self.assertIn("saved from another graph", str(e.exception))
        refused(variant("no_b2", lambda t, m: t.pop("b2")), "no tensor for param 'b2'")
        refused(variant("w1_shape", lambda t, m: t.update(w1=np.zeros((12, 6), np.float32))),
                "param 'w1' is float32[12, 6] in the file")
        refused(variant("extra", lambda t, m: t.update(zz=np.zeros(1, np.float32))),
                "tensor 'zz' is neither a param of the graph nor optimizer state")
        refused(variant("step", lambda t, m: m.update(step="5")),
                "opt/step holds 2 but the metadata's step is 5")
        refused(variant("newer", lambda t, m: m.update(format_version="2")),
                "format_version 2 is newer than this client reads (1)")
        refused(variant("long_step", lambda t, m: m.update(step="9" * 5000)),
                "is not a non-negative integer")
        refused(variant("odd_digits", lambda t, m: m.update(format_version="\u00b2")),
                "is not a positive integer")
        refused(variant("not_kiln", lambda t, m: m.pop("graph_sha256")),
                "the metadata has no 'graph_sha256'")
        with self.assertRaises(kiln.KilnError) as e:
            self.session(resume=variant("state", lambda t, m: t.update(
                {"opt/w1/m": np.zeros(3, np.float32)})))
        self.assertIn('optimizer state "opt/w1/m" must have the type of param "w1"',
                      e.exception.message)
        with self.assertRaises(TypeError):
            self.session(params=init, resume=good)
        # A continued run missing part of its state: the next step refuses it.
        partial = self.session(resume=variant("no_v", lambda t, m: t.pop("opt/b1/v")))
        with self.assertRaises(kiln.KilnError) as e:
            partial.step(batches[2])
        self.assertIn('optimizer state "opt/b1/v" (f32[12]) is not given', e.exception.message)

    @unittest.skipUnless(os.environ.get("KILNCTL"), "KILNCTL not set")
    def test_kilnctl_checkpoints_resume_in_python(self):
        """One format for both clients: kilnctl's checkpoint is rewritten byte
        for byte by the Python writer, and a Python session resumes it."""
        rng = np.random.default_rng(7)
        x = rng.normal(0, 1, (64, 6)).astype(np.float32)
        y = rng.integers(0, 3, 64).astype(np.int64)
        np.save(self.path("x.npy"), x)
        np.save(self.path("y.npy"), y)
        graph = self.path("mlp.kiln")
        text = MLP.replace("f32[16, 6]", "f32[batch, 6]").replace("i64[16]", "i64[batch]")
        pathlib.Path(graph).write_text(text)
        ckpt = self.path("kilnctl.safetensors")
        r = subprocess.run([os.environ["KILNCTL"], f"--addr={KILND_PROC.addr}", "train", graph,
                            "--data", "x=" + self.path("x.npy"), "--data", "y=" + self.path("y.npy"),
                            "--optimizer", "adamw", "--lr", "0.01", "--batch", "16", "--steps", "3",
                            "--checkpoint", ckpt], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        tensors, meta = kiln.checkpoint.read(ckpt)
        self.assertEqual(meta["step"], "3")
        kiln.checkpoint.write(self.path("again.safetensors"), tensors, meta)
        self.assertEqual(pathlib.Path(ckpt).read_bytes(),
                         pathlib.Path(self.path("again.safetensors")).read_bytes())
        s = CLIENT.train_session(kiln.parse(text), loss="loss", device="auto", resume=ckpt,
                                 optimizer=kiln.AdamW(lr=0.01, schedule=kiln.constant()))
        self.sessions.append(s)
        s.step({"x": x[48:], "y": y[48:]})  # the batch kilnctl's step 4 reads (no shuffle)
        self.assertEqual(s.last.step, 4)

    def test_hostile_files_are_refused_without_a_crash(self):
        def raw(header, data=b""):
            text = json.dumps(header).encode() if not isinstance(header, bytes) else header
            return len(text).to_bytes(8, "little") + text + data

        def t(dtype, shape, offsets):
            return {"dtype": dtype, "shape": shape, "data_offsets": offsets}

        cases = {
            "short": (b"abc", "shorter than the 8-byte header length"),
            "over_limit": ((256 << 20).to_bytes(8, "little") + b"{}", "over the limit"),
            "past_end": (b"\x40" + b"\0" * 7 + b"{}", "runs past the end of the file"),
            "not_json": (raw(b"{\"a\":"), "not valid JSON"),
            "not_object": (raw([1, 2]), "not a JSON object"),
            "duplicate": (raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                              b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy"),
                          "given twice"),
            "unknown_dtype": (raw({"a": t("F8_E4M3", [1], [0, 1])}, b"x"), "'F8_E4M3' is unknown"),
            "negative_dim": (raw({"a": t("U8", [-1], [0, 1])}, b"x"), "shape[0] is negative"),
            "float_dim": (raw({"a": t("U8", [1.5], [0, 1])}, b"x"), "shape[0] is not an integer"),
            "size_mismatch": (raw({"a": t("F32", [2], [0, 4])}, b"abcd"), "needs 8"),
            "past_data": (raw({"a": t("U8", [8], [0, 8])}, b"abcd"), "runs past the data buffer"),
            "overlap": (raw({"a": t("U8", [3], [0, 3]), "b": t("U8", [2], [2, 4])}, b"abcd"),
                        "overlaps tensor 'a'"),
            "gap": (raw({"a": t("U8", [1], [0, 1]), "b": t("U8", [1], [3, 4])}, b"abcd"),
                    "bytes 1..3 of the data buffer belong to no tensor"),
            "trailing": (raw({"a": t("U8", [1], [0, 1])}, b"abcd"),
                         "bytes 1..4 of the data buffer belong to no tensor"),
            "metadata": (raw({"__metadata__": {"k": 1}}), "__metadata__ is not an object of strings"),
            "deep": (raw(b"[" * 100000 + b"]" * 100000), "not valid JSON"),
        }
        for name, (content, needle) in cases.items():
            path = self.path(name)
            pathlib.Path(path).write_bytes(content)
            with self.assertRaises(kiln.CheckpointError, msg=name) as e:
                kiln.checkpoint.read(path)
            self.assertIn(needle, str(e.exception), name)
        with self.assertRaises(kiln.CheckpointError) as e:
            kiln.checkpoint.read(self.dir)
        self.assertIn("is not a regular file", str(e.exception))
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        with self.assertRaises(kiln.CheckpointError) as e:
            kiln.checkpoint.read(fifo)  # must not block
        self.assertIn("is not a regular file", str(e.exception))


if __name__ == "__main__":
    unittest.main()

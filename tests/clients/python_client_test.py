"""The Python package `kiln` against a real kilnd (ctest label `clients`).

Run by ctest with /usr/bin/python3, PYTHONPATH at the generated package in the
build tree, KILND/KILNCTL at the built binaries and KILN_SOURCE_DIR at the
repository. References are numpy in float64 (and torch where installed).
"""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import kiln

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
KILND = os.environ["KILND"]
KILNCTL = os.environ.get("KILNCTL", "")


class Kilnd:
    """kilnd on 127.0.0.1 with ephemeral ports and the given cache dir."""

    def __init__(self, cache_dir, extra=()):
        self.dir = tempfile.mkdtemp(prefix="kiln_py_kilnd.")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [KILND, "--listen=127.0.0.1:0", f"--port_file={port_file}",
             "--metrics_listen=127.0.0.1:0", f"--cache_dir={cache_dir}", "--log_level=warn",
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited with {self.proc.returncode}:\n{self._log()}")
            try:
                with open(port_file) as f:
                    port = int(f.read().strip())
                if port > 0:
                    self.addr = f"127.0.0.1:{port}"
                    return
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"kilnd wrote no port file in 60 s:\n{self._log()}")

    def _log(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


def setUpModule():
    global CACHE, KILND_PROC, CLIENT
    CACHE = tempfile.mkdtemp(prefix="kiln_py_cache.")
    KILND_PROC = Kilnd(CACHE)
    CLIENT = kiln.connect(KILND_PROC.addr)  # also the DSL's default client


def tearDownModule():
    CLIENT.close()
    KILND_PROC.stop()
    shutil.rmtree(CACHE, ignore_errors=True)


def mlp_params(rng, widths=(784, 512, 512, 10)):
    p = {}
    for i in range(1, len(widths)):
        scale = 1.0 / np.sqrt(widths[i - 1])
        p[f"w{i}"] = rng.uniform(-scale, scale, (widths[i - 1], widths[i])).astype(np.float32)
        p[f"b{i}"] = rng.uniform(-0.1, 0.1, (widths[i],)).astype(np.float32)
    return p


def mlp_graph(widths=(784, 512, 512, 10)):
    g = kiln.Graph("mlp")
    h = g.input("x", "f32", ["batch", widths[0]])
    for i in range(1, len(widths)):
        h = g.matmul(h, g.param(f"w{i}", "f32", [widths[i - 1], widths[i]]))
        h = g.add(h, g.param(f"b{i}", "f32", [widths[i]]))
        if i + 1 < len(widths):
            h = g.relu(h)
        g.named(f"fc{i}")
    g.output("logits", h)
    return g


def mlp_reference(p, x):
    h = x.astype(np.float64)
    n = len(p) // 2
    for i in range(1, n + 1):
        h = h @ p[f"w{i}"].astype(np.float64) + p[f"b{i}"]
        if i < n:
            h = np.maximum(h, 0)
    return h


def assert_close(test, got, want, atol, rtol):
    test.assertEqual(got.shape, want.shape)
    err = np.max(np.abs(got - want) / (atol + rtol * np.abs(want)))
    test.assertLessEqual(err, 1.0, f"worst error {err:.3f} of the budget")


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def erf(x):
    import math
    return np.vectorize(math.erf)(x)


def encoder_reference(p, x, heads=12):
    """BERT post-LN encoder layer in float64 (examples/encoder_layer.kiln)."""
    P = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    b, s, h = x.shape
    dh = h // heads

    def split(t):
        return t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)

    q, k, v = (split(x @ P[f"w{n}"] + P[f"b{n}"]) for n in "qkv")
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    logits -= logits.max(-1, keepdims=True)
    a = np.exp(logits)
    a /= a.sum(-1, keepdims=True)
    ctx = (a @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
    h1 = layer_norm(x + ctx @ P["wo"] + P["bo"], P["ln1_g"], P["ln1_b"], 1e-12)
    f = h1 @ P["w_ff1"] + P["b_ff1"]
    f = 0.5 * f * (1 + erf(f / np.sqrt(2)))
    return layer_norm(h1 + f @ P["w_ff2"] + P["b_ff2"], P["ln2_g"], P["ln2_b"], 1e-12)


def encoder_params(rng, h=768, ffn=3072):
    ws = 1 / np.sqrt(h)
    u = lambda shape, s, off=0.0: (rng.uniform(-s, s, shape) + off).astype(np.float32)  # noqa: E731
    p = {}
    for n in "qkvo":
        p[f"w{n}"], p[f"b{n}"] = u((h, h), ws), u((h,), 0.02)
    p["ln1_g"], p["ln1_b"] = u((h,), 0.1, 1.0), u((h,), 0.1)
    p["w_ff1"], p["b_ff1"] = u((h, ffn), ws), u((ffn,), 0.02)
    p["w_ff2"], p["b_ff2"] = u((ffn, h), 1 / np.sqrt(ffn)), u((h,), 0.02)
    p["ln2_g"], p["ln2_b"] = u((h,), 0.1, 1.0), u((h,), 0.1)
    return p


class ClientTest(unittest.TestCase):
    def test_health_devices_and_server_info(self):
        self.assertEqual(CLIENT.health(), "SERVING")
        devices = CLIENT.devices()
        self.assertEqual(devices[0].id, "cpu:0")
        info = CLIENT.server_info()
        self.assertTrue(info.version)
        self.assertEqual(info.cache.dir, CACHE)

    def test_mlp_builder_one_shot_with_report(self):
        rng = np.random.default_rng(1)
        p = mlp_params(rng)
        x = rng.uniform(-1, 1, (3, 784)).astype(np.float32)
        out, report = CLIENT.run(mlp_graph(), {"x": x}, params=p, report=True)
        self.assertEqual(list(out), ["logits"])
        self.assertEqual(out["logits"].dtype, np.float32)
        assert_close(self, out["logits"], mlp_reference(p, x), 1e-4, 1e-4)

        self.assertGreater(len(report.steps), 0)
        self.assertTrue(report.request_id)
        table = kiln.format_report(report)
        header = next(line for line in table.splitlines() if line.startswith("kernel"))
        for column in ("implementation", "path", "device", "nodes", "flops", "bytes",
                       "start us", "duration us"):
            self.assertIn(column, header)
        self.assertIn("fc1", table)  # node names from g.named
        trace = json.loads(json.dumps(kiln.chrome_trace(report)))
        self.assertEqual(sum(e["ph"] == "X" for e in trace["traceEvents"]), len(report.steps) + 1)
        # The server kept it.
        self.assertEqual(CLIENT.report(request_id=report.request_id).request_id, report.request_id)
        self.assertEqual(len(CLIENT.report(last=1)), 1)

    def test_cuda_graphs_option(self):
        # Each mode is its own executable; a bad mode never reaches kilnd, and
        # a value kilnd does not know is INVALID_ARGUMENT naming the option.
        shapes = {"x": [2, 784]}
        keys = {CLIENT.compile(mlp_graph(), shapes, cuda_graphs=m).executable_key
                for m in ("auto", "on", "off")}
        self.assertEqual(len(keys), 3)
        self.assertEqual(CLIENT.compile(mlp_graph(), shapes, cuda_graphs=True).executable_key,
                         CLIENT.compile(mlp_graph(), shapes, cuda_graphs="on").executable_key)
        with self.assertRaises(ValueError):
            CLIENT.compile(mlp_graph(), shapes, cuda_graphs="always")
        req = kiln.service_pb2.CompileRequest(
            graph=kiln.graph_source(mlp_graph()),
            options=kiln.service_pb2.CompileOptions(cuda_graphs=9))
        req.input_shapes.add(name="x", dims=[2, 784])
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT._call("Compile", req)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("cuda_graphs", e.exception.message)

    def test_builder_follows_the_cpp_conventions(self):
        g = mlp_graph().proto()
        self.assertEqual(g.ir_version, 1)
        self.assertEqual([n.id for n in g.nodes], list(range(len(g.nodes))))
        self.assertEqual(g.nodes[0].op, kiln.graph_pb2.OP_INPUT)
        self.assertEqual(g.nodes[0].outputs[0].dims[0].symbol, "batch")
        self.assertTrue(g.nodes[0].attrs.HasField("input"))
        self.assertEqual(g.nodes[1].name, "w1")  # made inside the matmul call, so first
        self.assertTrue(g.nodes[2].attrs.HasField("matmul"))
        s = kiln.Graph("s")
        v = s.softmax(s.input("x", np.float32, [2, 3]))
        self.assertTrue(s.proto().nodes[v.node].attrs.softmax.HasField("axis"))
        # A scalar operand becomes a constant of the other operand's dtype, made first.
        y = s.input("y", "f16", [3]) * 2
        self.assertEqual(s.proto().nodes[y.node - 1].attrs.constant.value.dtype,
                         kiln.tensor_pb2.DTYPE_F16)

    def test_mlp_session_streams_params(self):
        rng = np.random.default_rng(2)
        p = mlp_params(rng)
        total = sum(a.nbytes for a in p.values())
        seen = []
        with kiln.Client(KILND_PROC.addr, chunk_bytes=64 << 10) as c:
            with c.create_session(mlp_graph()) as s:
                self.assertEqual(len(s.signature.params), 6)
                r = s.set_params(p, progress=lambda done, tot: seen.append((done, tot)))
                self.assertEqual((r.params, r.bytes), (6, total))
                self.assertGreater(len(seen), 25)
                self.assertEqual(seen[-1], (total, total))
                self.assertTrue(all(a[0] < b[0] for a, b in zip(seen, seen[1:])))
                back = s.get_params()
                self.assertEqual(sorted(back), sorted(p))
                for name, value in p.items():
                    np.testing.assert_array_equal(back[name], value)
                x = rng.uniform(-1, 1, (5, 784)).astype(np.float32)
                out = s.run({"x": x})
                assert_close(self, out["logits"], mlp_reference(p, x), 1e-4, 1e-4)
                sid = s.id
            with self.assertRaises(kiln.KilnError) as e:
                c.run(sid, {"x": x})
            self.assertEqual(e.exception.code.name, "NOT_FOUND")

    def test_encoder_layer_from_text(self):
        rng = np.random.default_rng(3)
        p = encoder_params(rng)
        x = rng.uniform(-1, 1, (1, 128, 768)).astype(np.float32)
        g = kiln.parse((SOURCE / "examples" / "encoder_layer.kiln").read_text())
        self.assertEqual(g.name, "bert_encoder_layer")
        sig = g.verify(CLIENT)
        self.assertEqual(sorted(e.name for e in sig.params), sorted(p))
        with CLIENT.create_session(g) as s:
            s.set_params(p)
            y = s.run({"x": x})["y"]
        want = encoder_reference(p, x)
        assert_close(self, y, want, 2e-4, 2e-4)
        try:
            import torch
        except ImportError:
            return
        # torch agrees with the numpy reference, so both check the same model.
        t = {k: torch.from_numpy(v).double() for k, v in p.items()}
        tx = torch.from_numpy(x).double()
        mha = lambda z, n: (z @ t[f"w{n}"] + t[f"b{n}"]).view(1, 128, 12, 64).transpose(1, 2)  # noqa
        ctx = torch.nn.functional.scaled_dot_product_attention(mha(tx, "q"), mha(tx, "k"), mha(tx, "v")) \
            if hasattr(torch.nn.functional, "scaled_dot_product_attention") else \
            torch.softmax(mha(tx, "q") @ mha(tx, "k").transpose(-1, -2) / 8.0, -1) @ mha(tx, "v")
        ctx = ctx.transpose(1, 2).reshape(1, 128, 768)
        ln = torch.nn.functional.layer_norm
        h1 = ln(tx + ctx @ t["wo"] + t["bo"], (768,), t["ln1_g"], t["ln1_b"], 1e-12)
        f = torch.nn.functional.gelu(h1 @ t["w_ff1"] + t["b_ff1"]) @ t["w_ff2"] + t["b_ff2"]
        ty = ln(h1 + f, (768,), t["ln2_g"], t["ln2_b"], 1e-12).numpy()
        assert_close(self, ty, want, 1e-9, 1e-9)
        assert_close(self, y, ty, 2e-4, 2e-4)

    def test_errors_surface_with_codes_and_messages(self):
        bad = kiln.parse('graph "bad"\ninput x: f32[4]\nlet y = frobnicate(x)\nout y\n')
        with self.assertRaises(kiln.KilnError) as e:
            bad.verify(CLIENT)
        self.assertEqual(e.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("frobnicate", e.exception.message)
        self.assertIn("Compile: INVALID_ARGUMENT: ", str(e.exception))

        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.run("no-such-session", {})
        self.assertEqual(e.exception.code.name, "NOT_FOUND")

        g = kiln.Graph("typed")
        g.output("y", g.relu(g.input("x", "f32", [4])))
        with self.assertRaises(kiln.KilnError) as e:
            CLIENT.run(g, {"x": np.ones(4, np.float64)})  # f64 where f32 is declared
        self.assertEqual(e.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("x", e.exception.message)

        g = kiln.Graph("g")
        with self.assertRaises(ValueError) as v:
            g.attention(None, None, None, mask="sideways")
        self.assertIn("causal", str(v.exception))  # lists the kinds there are
        self.assertEqual(len(g.proto().nodes), 0)  # checked before anything is added
        with self.assertRaises(TypeError):
            kiln.dtype(np.complex64)

    def test_restart_reports_cache_hit_disk(self):
        cache = tempfile.mkdtemp(prefix="kiln_py_restart.")
        try:
            rng = np.random.default_rng(4)
            p = mlp_params(rng, (16, 8, 4))
            g = mlp_graph((16, 8, 4))
            x = rng.uniform(-1, 1, (2, 16)).astype(np.float32)
            outcomes = []
            for _ in range(2):
                k = Kilnd(cache)
                try:
                    with kiln.Client(k.addr) as c:
                        _, report = c.run(g, {"x": x}, params=p, report=True)
                        outcomes.append(kiln.report_pb2.CacheOutcome.Name(
                            report.compile.executable_cache))
                finally:
                    self.assertEqual(k.stop(), 0)
            self.assertEqual(outcomes, ["CACHE_MISS", "CACHE_HIT_DISK"])
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    @unittest.skipUnless(KILNCTL, "KILNCTL not set")
    def test_kilnctl_reads_and_writes_numpy_files(self):
        rng = np.random.default_rng(5)
        p = mlp_params(rng)
        x = rng.uniform(-1, 1, (2, 784)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "params"))
            for name, v in p.items():
                np.save(os.path.join(d, "params", name + ".npy"), v)
            np.save(os.path.join(d, "x.npy"), x)
            r = subprocess.run([KILNCTL, f"--addr={KILND_PROC.addr}", "run",
                                str(SOURCE / "examples" / "mlp.kiln"), "--input",
                                f"x={d}/x.npy", "--params-dir", f"{d}/params", "--out", d],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = np.load(os.path.join(d, "logits.npy"))
        self.assertEqual(got.dtype, np.float32)
        assert_close(self, got, mlp_reference(p, x), 1e-4, 1e-4)

        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "x.npy"), np.asfortranarray(np.ones((2, 784), np.float32)))
            r = subprocess.run([KILNCTL, f"--addr={KILND_PROC.addr}", "run",
                                str(SOURCE / "examples" / "mlp.kiln"), "--input", f"x={d}/x.npy"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("Fortran-order", r.stderr)


class WireTest(unittest.TestCase):
    """kiln/_wire.py (Run's tensors without protobuf copies) against protobuf
    both ways, and through kilnd."""

    def tensors(self):
        rng = np.random.default_rng(5)
        return {"big": rng.standard_normal((7, 10000)).astype(np.float32),
                "s": np.float64(2.5), "empty": np.zeros((0, 3), np.int64),
                "b": np.array([True, False, True]), "h": np.ones((3, 2), np.float16),
                "name \u00e9": np.arange(6, dtype=np.int8)[::2]}  # not contiguous

    def test_request_parses_as_protobufs(self):
        from kiln import _wire
        from kiln._proto.kiln.v1 import service_pb2
        head = service_pb2.RunRequest(session_id="s-1", report=True, priority=-2)
        raw = _wire.run_request(head, self.tensors(), {"w": np.ones((4,), np.float32)})
        want = service_pb2.RunRequest()
        want.CopyFrom(head)
        for name, v in self.tensors().items():
            kiln._dtypes.to_proto(v, want.inputs.add(name=name).tensor)
        kiln._dtypes.to_proto(np.ones((4,), np.float32), want.params.add(name="w").tensor)
        self.assertEqual(service_pb2.RunRequest.FromString(raw), want)

    def test_response_is_read_only_views_of_protobufs_bytes(self):
        from kiln import _wire
        from kiln._proto.kiln.v1 import service_pb2
        for tensors in (self.tensors(), {"tiny": np.arange(3, dtype=np.int32)}):
            resp = service_pb2.RunResponse(request_id="r-9")
            resp.report.tenant = "t"
            for name, v in tensors.items():
                kiln._dtypes.to_proto(v, resp.outputs.add(name=name).tensor)
            outputs, rest = _wire.run_response(resp.SerializeToString())
            self.assertEqual(list(outputs), list(tensors))
            for name, v in tensors.items():
                np.testing.assert_array_equal(outputs[name], v)
                self.assertEqual(outputs[name].dtype, np.asarray(v).dtype)
                self.assertFalse(outputs[name].flags.writeable)
            self.assertEqual(rest.request_id, "r-9")
            self.assertEqual(rest.report.tenant, "t")

    def test_malformed_response_is_refused(self):
        from kiln import _wire
        from kiln._proto.kiln.v1 import service_pb2
        resp = service_pb2.RunResponse()
        kiln._dtypes.to_proto(np.zeros(50000, np.float32), resp.outputs.add(name="y").tensor)
        buf = resp.SerializeToString()
        for cut in (3, 30, len(buf) // 2, len(buf) - 1):
            with self.assertRaises(ValueError):
                _wire.run_response(buf[:cut])

    def test_four_mib_each_way_through_kilnd(self):
        x = np.linspace(-1, 1, 1 << 20, dtype=np.float32)
        g = kiln.parse('graph "twice"\ninput x: f32[n]\nlet y = x * 2\nout y\n')
        # Through shared memory (the default client, local kilnd) and as bytes:
        # read-only outputs either way (docs/clients.md).
        wire_only = kiln.Client(KILND_PROC.addr, shared_memory=False)
        try:
            for client, via_shm in ((CLIENT, True), (wire_only, False)):
                y = client.run(g, {"x": x})["y"]
                self.assertEqual(client.last_run_shared_memory, via_shm)
                np.testing.assert_array_equal(y, x * 2)
                self.assertFalse(y.flags.writeable)
        finally:
            wire_only.close()


class TensorDslTest(unittest.TestCase):
    def test_the_example(self):
        rng = np.random.default_rng(6)
        an = rng.standard_normal((4, 8)).astype(np.float32)
        bn = rng.standard_normal((4, 8)).astype(np.float32)
        wn = rng.standard_normal((8, 3)).astype(np.float32)
        a, b, w = kiln.tensor(an), kiln.tensor(bn), kiln.tensor(wn)
        y = (a + b).relu() @ w
        self.assertEqual(y.shape, (4, 3))
        np.testing.assert_allclose(y.numpy(), np.maximum(an + bn, 0) @ wn, rtol=1e-5, atol=1e-5)

    def test_operators_reductions_and_shapes(self):
        rng = np.random.default_rng(7)
        xn = rng.standard_normal((2, 3, 4)).astype(np.float32)
        x = kiln.tensor(xn)
        cases = [
            (2 - x * 0.5 + 1, 2 - xn * 0.5 + 1),
            (-x / 4, -xn / 4),
            (x.softmax(-1), np.exp(xn) / np.exp(xn).sum(-1, keepdims=True)),
            (x.sum(1), xn.sum(1)),
            (x.mean(axis=-1, keepdims=True), xn.mean(-1, keepdims=True)),
            (x.max(), xn.max()),
            (x.reshape(6, -1).T, xn.reshape(6, -1).T),
            (x.transpose(2, 0, 1), xn.transpose(2, 0, 1)),
            (x.gelu().sigmoid(), None),
            (x @ kiln.tensor(np.eye(4, dtype=np.float32)), xn),
        ]
        values = kiln.evaluate(*[t for t, _ in cases])  # one graph, one run
        for (t, want), got in zip(cases, values):
            self.assertEqual(got.shape, t.shape)
            if want is not None:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def test_inputs_are_fed_by_name(self):
        x = kiln.input("x", "f32", (2, 2))
        y = (x * 3).relu()
        np.testing.assert_array_equal(
            y.numpy({"x": np.array([[1, -1], [2, -2]], np.float32)}), [[3, 0], [6, 0]])
        g, params = y.graph()
        self.assertEqual(params, {})
        self.assertEqual(g.proto().nodes[0].op, kiln.graph_pb2.OP_INPUT)

    def test_mistakes_surface_where_they_are_made(self):
        a = kiln.tensor(np.ones((2, 3), np.float32))
        with self.assertRaises(ValueError):
            a @ a
        with self.assertRaises(ValueError):
            a + kiln.tensor(np.ones((4,), np.float32))
        with self.assertRaises(TypeError):
            a + kiln.tensor(np.ones((2, 3), np.int32))
        with self.assertRaises(ValueError):
            a.reshape(4, -1)


def write_safetensors(path, tensors):
    """The format by hand (Debian has no safetensors package): header length,
    JSON header, then the tensors' bytes back to back."""
    names = {"float32": "F32", "float64": "F64", "int64": "I64"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        blob = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


class ModelRepositoryTest(unittest.TestCase):
    """A kilnd with --model_repository: models listed, sessions by name."""

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="kiln_py_repo.")
        rng = np.random.default_rng(3)
        cls.w = rng.standard_normal((6, 4)).astype(np.float32)
        cls.b = rng.standard_normal(4).astype(np.float32)
        version = pathlib.Path(cls.repo, "tiny", "1")
        version.mkdir(parents=True)
        (version / "model.kiln").write_text(
            "graph \"tiny\"\ninput x: f32[batch, 6]\nparam w: f32[6, 4]\nparam b: f32[4]\n"
            "let y = tanh(x @ w + b)\nout y\n")
        write_safetensors(version / "weights.safetensors", {"w": cls.w, "b": cls.b})
        # The same model with its weights in a NumPy archive.
        npz_version = pathlib.Path(cls.repo, "tiny_npz", "1")
        npz_version.mkdir(parents=True)
        (npz_version / "model.kiln").write_text((version / "model.kiln").read_text())
        np.savez(npz_version / "weights.npz", w=cls.w, b=cls.b)
        cls.cache = tempfile.mkdtemp(prefix="kiln_py_cache.")
        cls.kilnd = Kilnd(cls.cache, extra=[f"--model_repository={cls.repo}"])
        cls.client = kiln.Client(cls.kilnd.addr)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.kilnd.stop()
        shutil.rmtree(cls.repo, ignore_errors=True)
        shutil.rmtree(cls.cache, ignore_errors=True)

    def test_lists_and_runs_a_model_by_name(self):
        models = self.client.models()
        self.assertEqual([(m.name, m.version) for m in models], [("tiny", 1), ("tiny_npz", 1)])
        self.assertEqual(models[0].state, kiln.service_pb2.MODEL_STATE_READY)
        self.assertEqual(models[0].param_bytes, self.w.nbytes + self.b.nbytes)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
        want = np.tanh(x.astype(np.float64) @ self.w + self.b)
        for name in ("tiny", "tiny_npz"):
            s = self.client.create_session(kiln.model(name))
            got = s.run({"x": x})["y"]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            s.close()
        with self.assertRaises(kiln.KilnError) as e:
            self.client.create_session(kiln.model("nope"))
        self.assertIn("its models: tiny, tiny_npz", str(e.exception))
        with self.assertRaises(ValueError):
            kiln.model("tiny", -1)

    @unittest.skipUnless(KILNCTL, "KILNCTL not set")
    def test_kilnctl_models_and_run_by_name(self):
        r = subprocess.run([KILNCTL, f"--addr={self.kilnd.addr}", "models"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"tiny\s+1\s+ready\s+model.kiln\s+weights.safetensors")
        self.assertRegex(r.stdout, r"tiny_npz\s+1\s+ready\s+model.kiln\s+weights.npz")
        with tempfile.TemporaryDirectory() as d:
            x = np.ones((1, 6), np.float32)
            np.save(os.path.join(d, "x.npy"), x)
            r = subprocess.run([KILNCTL, f"--addr={self.kilnd.addr}", "run", "--model", "tiny:1",
                                "-i", f"x={d}/x.npy", "-o", d], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            np.testing.assert_allclose(np.load(os.path.join(d, "y.npy")),
                                       np.tanh(x.astype(np.float64) @ self.w + self.b), rtol=1e-5)
            # The same graph from a local file with the weights from the
            # safetensors file (--weights), through a session.
            version = os.path.join(self.repo, "tiny", "1")
            r = subprocess.run([KILNCTL, f"--addr={self.kilnd.addr}", "run", f"{version}/model.kiln",
                                "--weights", f"{version}/weights.safetensors", "-i", f"x={d}/x.npy",
                                "-o", d], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            np.testing.assert_allclose(np.load(os.path.join(d, "y.npy")),
                                       np.tanh(x.astype(np.float64) @ self.w + self.b), rtol=1e-5)


class OnnxCnnExampleTest(unittest.TestCase):
    """examples/onnx_cnn as its README says: exported from PyTorch, run directly
    with kilnctl and from a model repository through kilnd and the client."""

    def test_export_run_and_serve(self):
        repo = tempfile.mkdtemp(prefix="kiln_py_cnn.")
        cache = tempfile.mkdtemp(prefix="kiln_py_cache.")
        try:
            version = os.path.join(repo, "cnn", "1")
            r = subprocess.run(["/usr/bin/python3", str(SOURCE / "examples/onnx_cnn/export_cnn.py"),
                                "--out", version], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            x = np.load(os.path.join(version, "x.npy"))
            expected = np.load(os.path.join(version, "expected.npy"))
            kilnd = Kilnd(cache, extra=[f"--model_repository={repo}"])
            try:
                with kiln.Client(kilnd.addr) as c:
                    [m] = c.models()
                    self.assertEqual((m.name, m.version, m.graph_file), ("cnn", 1, "model.onnx"))
                    s = c.create_session(kiln.model("cnn"))
                    np.testing.assert_allclose(s.run({"x": x})["logits"], expected, rtol=1e-4, atol=1e-5)
                    s.close()
                if KILNCTL:
                    with tempfile.TemporaryDirectory() as out:
                        r = subprocess.run([KILNCTL, f"--addr={kilnd.addr}", "run",
                                            os.path.join(version, "model.onnx"), "-i",
                                            f"x={version}/x.npy", "-o", out],
                                           capture_output=True, text=True, timeout=120)
                        self.assertEqual(r.returncode, 0, r.stderr)
                        np.testing.assert_allclose(np.load(os.path.join(out, "logits.npy")), expected,
                                                   rtol=1e-4, atol=1e-5)
            finally:
                kilnd.stop()
        finally:
            shutil.rmtree(repo, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)


class OnnxWhileScanTest(unittest.TestCase):
    """A torch.jit.script while loop appending to a list (exported by
    tests/engine/io/export_torch_models.py --models while_scan: an ONNX Loop
    whose body computes cond, with a scan output) served from a model
    repository: kilnd imports it as a While stacking into a bounded buffer
    and returns the buffer with its length; kiln.trim_stacked_outputs gives
    PyTorch's outputs; kilnctl run --model trims them itself."""

    def test_serve_and_trim(self):
        repo = tempfile.mkdtemp(prefix="kiln_py_while.")
        cache = tempfile.mkdtemp(prefix="kiln_py_cache.")
        export = tempfile.mkdtemp(prefix="kiln_py_export.")
        try:
            r = subprocess.run(["/usr/bin/python3", str(SOURCE / "tests/engine/io/export_torch_models.py"),
                                "--out", export, "--models", "while_scan"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            version = os.path.join(repo, "grow", "1")
            os.makedirs(version)
            shutil.copy(os.path.join(export, "while_scan.onnx"), os.path.join(version, "model.onnx"))
            kilnd = Kilnd(cache, extra=[f"--model_repository={repo}"])
            try:
                with kiln.Client(kilnd.addr) as c:
                    s = c.create_session(kiln.model("grow"))
                    for case, rows in (("few", 11), ("many", 22)):
                        x = np.load(os.path.join(export, f"while_scan.{case}.x.npy"))
                        raw = s.run({"x": x})
                        self.assertEqual(list(raw), ["y", "ys", "kiln.length.ys"])
                        self.assertEqual(raw["ys"].shape, (1024, 2, 3))  # the default bound
                        self.assertEqual(int(raw["kiln.length.ys"]), rows)
                        got = kiln.trim_stacked_outputs(raw)
                        self.assertEqual(list(got), ["y", "ys"])
                        for name in ("y", "ys"):
                            want = np.load(os.path.join(export, f"while_scan.{case}.{name}.npy"))
                            self.assertEqual(got[name].shape, want.shape, name)
                            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)
                    s.close()
                    # Past the bound: an error, never a truncated ys.
                    short = {"ys": np.zeros((4, 2, 3), np.float32),
                             "kiln.length.ys": np.array(5, np.int64)}
                    with self.assertRaises(kiln.KilnError) as e:
                        kiln.trim_stacked_outputs(short)
                    self.assertEqual(e.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                if KILNCTL:
                    with tempfile.TemporaryDirectory() as out:
                        r = subprocess.run([KILNCTL, f"--addr={kilnd.addr}", "run", "--model", "grow:1",
                                            "-i", f"x={export}/while_scan.few.x.npy", "-o", out],
                                           capture_output=True, text=True, timeout=120)
                        self.assertEqual(r.returncode, 0, r.stderr)
                        self.assertNotIn("kiln.length", r.stdout)
                        np.testing.assert_allclose(np.load(os.path.join(out, "ys.npy")),
                                                   np.load(os.path.join(export, "while_scan.few.ys.npy")),
                                                   rtol=1e-4, atol=1e-4)
            finally:
                kilnd.stop()
        finally:
            for d in (repo, cache, export):
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

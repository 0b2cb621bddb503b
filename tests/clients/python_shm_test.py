"""kiln.shm and Client(shared_memory=...) against a real kilnd (ctest label
`clients`): outputs through shared memory equal the bytes path's, misuse
gets kilnd's clear status, and a client that goes away leaves no region.

Run by ctest with /usr/bin/python3, PYTHONPATH at the generated package and
KILND at the built binary.
"""

import os
import sys
import time
import unittest

import numpy as np

import kiln
from kiln import shm
from kiln._proto.kiln.v1 import service_pb2, shm_pb2

sys.path.insert(0, os.path.dirname(__file__))
from python_client_test import Kilnd  # noqa: E402

TWO_OUTPUTS = "graph \"two\"\ninput x: f32[n]\nlet y = x * 2\nlet z = x + 1\nout y\nout z\n"
INTS = "graph \"ints\"\ninput i: i32[4]\nlet j = i + i\nout j\n"


def setUpModule():
    global KILND_PROC, CACHE
    import tempfile
    CACHE = tempfile.mkdtemp(prefix="kiln_py_shm_cache.")
    KILND_PROC = Kilnd(CACHE)


def tearDownModule():
    KILND_PROC.stop()


class ShmTest(unittest.TestCase):
    def test_outputs_through_shared_memory_equal_bytes(self):
        x = np.linspace(-3, 3, 250000, dtype=np.float32)
        with kiln.Client(KILND_PROC.addr) as c, kiln.Client(KILND_PROC.addr, shared_memory=False) as b:
            for _ in range(3):
                got = c.run(kiln.parse(TWO_OUTPUTS), {"x": x})
                self.assertTrue(c.last_run_shared_memory)
                np.testing.assert_array_equal(got["y"], x * 2)
                np.testing.assert_array_equal(got["z"], x + 1)
            want = b.run(kiln.parse(TWO_OUTPUTS), {"x": x})
            self.assertFalse(b.last_run_shared_memory)
            np.testing.assert_array_equal(got["y"], want["y"])
            i = np.array([1, -2, 30, 400], dtype=np.int32)
            np.testing.assert_array_equal(c.run(kiln.parse(INTS), {"i": i})["j"], 2 * i)
            self.assertTrue(c.last_run_shared_memory)
            # A session, too.
            s = c.create_session(kiln.parse(TWO_OUTPUTS))
            out = s.run({"x": x[:10]})
            np.testing.assert_array_equal(out["z"], x[:10] + 1)

    def test_train_step_batch_through_shared_memory(self):
        # The same steps, batch through shared memory and as bytes: equal
        # losses; bad offsets and other tenants' regions are kilnd's to refuse
        # (tests/server/shm/shm_test.cc TrainStepBatchThroughSharedMemory).
        g = kiln.parse("graph \"t\"\ninput x: f32[16, 8]\ninput y: i64[16]\n"
                       "param w: f32[8, 3]\nlet loss = softmax_cross_entropy(x @ w, y)\nout loss\n")
        rng = np.random.default_rng(3)
        init = {"w": rng.standard_normal((8, 3)).astype(np.float32) * 0.1}
        batches = [{"x": rng.standard_normal((16, 8)).astype(np.float32),
                    "y": rng.integers(0, 3, 16).astype(np.int64)} for _ in range(4)]
        with kiln.Client(KILND_PROC.addr) as c, kiln.Client(KILND_PROC.addr, shared_memory=False) as b:
            sc = c.train_session(g, loss="loss", params=init, optimizer=kiln.Adam(lr=0.05))
            sb = b.train_session(g, loss="loss", params=init, optimizer=kiln.Adam(lr=0.05))
            for batch in batches:
                lc, lb = sc.step(batch), sb.step(batch)
                self.assertTrue(c.last_train_step_shared_memory)
                self.assertFalse(b.last_train_step_shared_memory)
                self.assertEqual(lc, lb)
            self.assertEqual(sc.last.step, len(batches))
            # A batch outside its region is refused by kilnd, and no step runs.
            conn = shm.ShmConnection(c._call("ConnectSharedMemory",
                                              shm_pb2.ConnectSharedMemoryRequest()))
            r = conn.create_region("py-train-bad", 4096)
            req = service_pb2.TrainStepRequest(session_id=sc.id)
            shm.fill_inputs(req, r, batches[0])
            req.inputs[0].shm.offset = 4096 - 64
            with self.assertRaises(kiln.KilnError) as e:
                c._call("TrainStep", req)
            self.assertEqual(e.exception.code.name, "OUT_OF_RANGE")
            sc.step(batches[0])
            self.assertEqual(sc.last.step, len(batches) + 1)
            r.close()
            conn.close()

    def test_train_steps_stream_batches_through_shared_memory(self):
        # TrainSteps with each batch in a region of the client's ring (more
        # batches than regions, so regions are reused while kilnd reads ahead):
        # the same losses and params as a bytes stream, bit for bit.
        g = kiln.parse("graph \"t\"\ninput x: f32[32, 64]\ninput y: i64[32]\n"
                       "param w: f32[64, 5]\nlet loss = softmax_cross_entropy(x @ w, y)\nout loss\n")
        rng = np.random.default_rng(5)
        init = {"w": rng.standard_normal((64, 5)).astype(np.float32) * 0.1}
        batches = [{"x": rng.standard_normal((32, 64)).astype(np.float32),
                    "y": rng.integers(0, 5, 32).astype(np.int64)} for _ in range(12)]
        with kiln.Client(KILND_PROC.addr) as c, kiln.Client(KILND_PROC.addr, shared_memory=False) as b:
            sc = c.train_session(g, loss="loss", params=init, optimizer=kiln.Adam(lr=0.05))
            sb = b.train_session(g, loss="loss", params=init, optimizer=kiln.Adam(lr=0.05))
            got = list(sc.steps(iter(batches)))
            self.assertTrue(c.last_train_steps_shared_memory)
            want = list(sb.steps(batches))
            self.assertFalse(b.last_train_steps_shared_memory)
            self.assertEqual(got, want)
            self.assertEqual(sc.last.step, len(batches))
            np.testing.assert_array_equal(sc.get_params()["w"], sb.get_params()["w"])
            # Stopping early leaves the session usable and no region in use.
            for i, _ in enumerate(sc.steps(batches)):
                if i == 1:
                    break
            self.assertLessEqual(len(c._shm._idle), shm.ShmPool.MAX_IDLE)
            more = list(sc.steps(batches[:3]))
            self.assertEqual(len(more), 3)
            self.assertTrue(c.last_train_steps_shared_memory)
            # kilnd drops the regions with their connection: the steps it did
            # not run go again as bytes, and none is lost or run twice.
            before = sc.last.step
            c._shm._connection._sock.close()
            time.sleep(0.5)
            tail = list(sc.steps(batches[:4]))
            self.assertFalse(c.last_train_steps_shared_memory)
            self.assertEqual(len(tail), 4)
            self.assertEqual(sc.last.step, before + 4)

    def test_env_turns_it_off(self):
        os.environ["KILN_SHM"] = "0"
        try:
            with kiln.Client(KILND_PROC.addr) as c:
                c.run(kiln.parse(TWO_OUTPUTS), {"x": np.ones(4, np.float32)})
                self.assertFalse(c.last_run_shared_memory)
        finally:
            del os.environ["KILN_SHM"]

    def test_misuse_gets_clear_statuses(self):
        with kiln.Client(KILND_PROC.addr) as c:
            conn = shm.ShmConnection(c._call("ConnectSharedMemory",
                                              shm_pb2.ConnectSharedMemoryRequest()))
            r = conn.create_region("py-misuse", 4096)
            with self.assertRaises(shm.ShmError) as e:
                conn.create_region("py-misuse", 4096)
            self.assertEqual(e.exception.code, 6)  # ALREADY_EXISTS
            # Out of bounds.
            req = service_pb2.RunRequest()
            req.graph.text = TWO_OUTPUTS
            t = req.inputs.add(name="x")
            t.tensor.dtype = kiln.dtype("f32")
            t.tensor.dims.append(1000)
            t.shm.region_id = "py-misuse"
            t.shm.offset = 1024
            t.shm.bytes = 4000
            with self.assertRaises(kiln.KilnError) as e:
                c._call("Run", req)
            self.assertEqual(e.exception.code.name, "OUT_OF_RANGE")
            self.assertIn("not inside shared-memory region", e.exception.message)
            # A region unknown to the tenant.
            t.shm.region_id = "nobody"
            t.shm.offset = 0
            with self.assertRaises(kiln.KilnError) as e:
                c._call("Run", req)
            self.assertEqual(e.exception.code.name, "NOT_FOUND")
            r.close()
            conn.close()

    def test_region_reused_across_runs_not_registered_again(self):
        # Every call of a steady workload reuses one region: a registration
        # per call would cost kilnd an mmap and fresh page faults each time.
        # The two-output graph overflows the first region's output area once
        # (its second output comes back as bytes and sizes the next region).
        x = np.linspace(-1, 1, 250000, dtype=np.float32)
        with kiln.Client(KILND_PROC.addr) as c:
            s = c.create_session(kiln.parse(TWO_OUTPUTS))
            for _ in range(2):
                s.run({"x": x})
            conn = c._shm._connection
            self.assertIsNotNone(conn)
            registered = []
            register_fd = conn.register_fd

            def counting(region_id, fd):
                registered.append(region_id)
                return register_fd(region_id, fd)

            conn.register_fd = counting
            for i in range(5):
                out = s.run({"x": x + i})
                self.assertTrue(c.last_run_shared_memory)
                np.testing.assert_array_equal(out["y"], (x + i) * 2)
                np.testing.assert_array_equal(out["z"], (x + i) + 1)
            self.assertEqual(registered, [])
            self.assertIs(c._shm._connection, conn)

    def test_region_dropped_with_its_connection(self):
        with kiln.Client(KILND_PROC.addr) as c:
            ticket = lambda: c._call("ConnectSharedMemory", shm_pb2.ConnectSharedMemoryRequest())
            conn = shm.ShmConnection(ticket())
            r = conn.create_region("py-gone", 4096)
            r.close(unregister=False)
            conn.close()
            # kilnd unregisters on close (asynchronously): the id is free again.
            import time
            deadline = time.monotonic() + 10
            while True:
                conn2 = shm.ShmConnection(ticket())
                try:
                    conn2.create_region("py-gone", 4096).close()
                    conn2.close()
                    break
                except shm.ShmError as e:
                    conn2.close()
                    self.assertEqual(e.code, 6)
                    self.assertLess(time.monotonic(), deadline)
                    time.sleep(0.05)

    def test_runs_go_over_the_shm_socket(self):
        # run() goes over kilnd's shared-memory socket by default (one Unix-socket
        # round trip instead of gRPC): the same outputs as gRPC's, errors as
        # KilnError with gRPC's code and message, off by kwarg and by env.
        x = np.linspace(-2, 2, 100000, dtype=np.float32)
        with kiln.Client(KILND_PROC.addr) as c, kiln.Client(KILND_PROC.addr,
                                                              shm_runs=False) as g:
            s = c.create_session(kiln.parse(TWO_OUTPUTS))
            for i in range(3):
                got = s.run({"x": x + i})
                self.assertTrue(c.last_run_shared_memory)
                # The first region's output area holds one output of two: kilnd
                # refuses that run on the socket before running it, the client
                # sends it over gRPC and sizes the next region for both.
                self.assertEqual(c.last_run_over_shm_socket, i > 0)
                np.testing.assert_array_equal(got["y"], (x + i) * 2)
                np.testing.assert_array_equal(got["z"], (x + i) + 1)
            want = g.run(s.id, {"x": x + 2})
            self.assertTrue(g.last_run_shared_memory)
            self.assertFalse(g.last_run_over_shm_socket)
            np.testing.assert_array_equal(got["y"], want["y"])
            np.testing.assert_array_equal(got["z"], want["z"])
            # A report and a one-shot graph with params.
            out, report = c.run(kiln.parse(INTS), {"i": np.arange(4, dtype=np.int32)},
                                report=True)
            self.assertTrue(c.last_run_over_shm_socket)
            np.testing.assert_array_equal(out["j"], 2 * np.arange(4, dtype=np.int32))
            self.assertTrue(report.request_id)
            # Errors: the same code and message as over gRPC.
            errors = []
            for client in (c, g):
                with self.assertRaises(kiln.KilnError) as e:
                    client.run(s.id, {"x": np.ones(3, np.int32)})
                errors.append((e.exception.code, e.exception.message))
            self.assertTrue(c.last_run_over_shm_socket)
            self.assertEqual(errors[0], errors[1])
            self.assertEqual(errors[0][0].name, "INVALID_ARGUMENT")
            with self.assertRaises(kiln.KilnError) as e:
                c.run("no-such-session", {"x": x})
            self.assertEqual(e.exception.code.name, "NOT_FOUND")
        os.environ["KILN_SHM_RUN"] = "0"
        try:
            with kiln.Client(KILND_PROC.addr) as c:
                c.run(kiln.parse(TWO_OUTPUTS), {"x": np.ones(4, np.float32)})
                self.assertTrue(c.last_run_shared_memory)
                self.assertFalse(c.last_run_over_shm_socket)
        finally:
            del os.environ["KILN_SHM_RUN"]

    def test_train_steps_go_over_the_shm_socket(self):
        # train_step() goes over kilnd's shared-memory socket by default: the
        # same losses, step for step, as a twin session stepped over gRPC;
        # errors as KilnError with gRPC's code and message; off by kwarg and
        # by $KILN_SHM_TRAIN_STEP=0.
        g = kiln.parse("graph \"ts\"\ninput x: f32[16, 8]\ninput y: i64[16]\n"
                       "param w: f32[8, 3]\nparam b: f32[3]\n"
                       "let loss = softmax_cross_entropy(x @ w + b, y)\nout loss\n")
        rng = np.random.default_rng(5)
        init = {"w": rng.standard_normal((8, 3)).astype(np.float32) * 0.1,
                "b": np.zeros(3, np.float32)}
        batches = [{"x": rng.standard_normal((16, 8)).astype(np.float32),
                    "y": rng.integers(0, 3, 16).astype(np.int64)} for _ in range(4)]
        with kiln.Client(KILND_PROC.addr) as c, \
                kiln.Client(KILND_PROC.addr, shm_train_steps=False) as o:
            sc = c.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
            so = o.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
            for batch in batches:
                lc, lo = sc.step(batch), so.step(batch)
                self.assertTrue(c.last_train_step_shared_memory)
                self.assertTrue(c.last_train_step_over_shm_socket)
                self.assertTrue(o.last_train_step_shared_memory)
                self.assertFalse(o.last_train_step_over_shm_socket)
                self.assertEqual(lc, lo)
            self.assertEqual(sc.last.step, len(batches))
            self.assertTrue(sc.last.request_id)
            pc, po = c.get_params(sc), o.get_params(so)
            for name in ("w", "b", "opt/w/m", "opt/w/v"):
                np.testing.assert_array_equal(pc[name], po[name])
            errors = []
            for client, session in ((c, sc), (o, so)):
                with self.assertRaises(kiln.KilnError) as e:
                    client.train_step(session, {"x": np.ones((16, 7), np.float32),
                                                "y": batches[0]["y"]})
                errors.append((e.exception.code, e.exception.message))
            self.assertTrue(c.last_train_step_over_shm_socket)
            self.assertEqual(errors[0], errors[1])
            self.assertEqual(errors[0][0].name, "INVALID_ARGUMENT")
            sc.step(batches[0])
            self.assertEqual(sc.last.step, len(batches) + 1)
        os.environ["KILN_SHM_TRAIN_STEP"] = "0"
        try:
            with kiln.Client(KILND_PROC.addr) as c:
                s = c.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
                s.step(batches[0])
                self.assertTrue(c.last_train_step_shared_memory)
                self.assertFalse(c.last_train_step_over_shm_socket)
        finally:
            del os.environ["KILN_SHM_TRAIN_STEP"]

    def test_train_steps_stream_over_the_shm_socket(self):
        # steps() goes over kilnd's shared-memory socket by default, each
        # step sent once the one before it answered OK: the same losses and
        # params as unary steps over gRPC; a failed step ends the stream with
        # nothing after it run; the loop's body may use the client (its
        # calls, a new region's registration included, go on the same
        # connection); a caller that stops early ran no step it did not see.
        g = kiln.parse("graph \"tss\"\ninput x: f32[16, 8]\ninput y: i64[16]\n"
                       "param w: f32[8, 3]\nparam b: f32[3]\n"
                       "let loss = softmax_cross_entropy(x @ w + b, y)\nout loss\n")
        rng = np.random.default_rng(7)
        init = {"w": rng.standard_normal((8, 3)).astype(np.float32) * 0.1,
                "b": np.zeros(3, np.float32)}
        batches = [{"x": rng.standard_normal((16, 8)).astype(np.float32),
                    "y": rng.integers(0, 3, 16).astype(np.int64)} for _ in range(6)]
        with kiln.Client(KILND_PROC.addr) as c, \
                kiln.Client(KILND_PROC.addr, shm_train_steps=False) as o:
            sc = c.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
            so = o.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
            got = list(sc.steps(iter(batches)))
            self.assertTrue(c.last_train_steps_over_shm_socket)
            self.assertTrue(c.last_train_steps_shared_memory)
            want = [so.step(b) for b in batches]
            self.assertFalse(o.last_train_step_over_shm_socket)
            self.assertEqual(got, want)
            self.assertEqual(sc.last.step, len(batches))
            pc, po = c.get_params(sc), o.get_params(so)
            for name in ("w", "b", "opt/w/m", "opt/w/v"):
                np.testing.assert_array_equal(pc[name], po[name])
            # A failed step (a batch of the wrong shape) ends the stream with
            # kilnd's status; the batch after it never runs.
            bad = {"x": np.ones((16, 7), np.float32), "y": batches[0]["y"]}
            seen = []
            with self.assertRaises(kiln.KilnError) as e:
                for loss in sc.steps([batches[0], batches[1], bad, batches[2]]):
                    seen.append(loss)
            self.assertEqual(e.exception.code.name, "INVALID_ARGUMENT")
            self.assertEqual(len(seen), 2)
            sc.step(batches[3])
            self.assertEqual(sc.last.step, len(batches) + 3)
            # Runs in the loop's body, each with an input larger than any
            # region so far (a new region registered on the connection).
            s = c.create_session(kiln.parse(TWO_OUTPUTS))
            before = sc.last.step
            for i, _ in enumerate(sc.steps(batches[:3])):
                x = np.arange((i + 1) << 19, dtype=np.float32)
                np.testing.assert_array_equal(s.run({"x": x})["y"], x * 2)
                self.assertTrue(c.last_run_shared_memory)
            self.assertTrue(c.last_train_steps_over_shm_socket)
            self.assertEqual(sc.last.step, before + 3)
            # Stopping after the first answer: no other step ran, and the
            # connection serves the next calls.
            before = sc.last.step
            for _ in sc.steps(batches):
                break
            sc.step(batches[4])
            self.assertTrue(c.last_train_step_over_shm_socket)
            self.assertEqual(sc.last.step, before + 2)
            x = np.arange(5, dtype=np.float32)
            np.testing.assert_array_equal(s.run({"x": x})["y"], x * 2)
            self.assertTrue(c.last_run_over_shm_socket)
        os.environ["KILN_SHM_TRAIN_STEP"] = "0"
        try:
            with kiln.Client(KILND_PROC.addr) as c:
                s = c.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=0.05))
                self.assertEqual(len(list(s.steps(batches[:2]))), 2)
                self.assertFalse(c.last_train_steps_over_shm_socket)
                self.assertTrue(c.last_train_steps_shared_memory)
        finally:
            del os.environ["KILN_SHM_TRAIN_STEP"]

    def test_raw_run_message(self):
        # kiln.shm.ShmConnection.try_run: the raw call, and the ticket's limit.
        with kiln.Client(KILND_PROC.addr) as c:
            conn = shm.ShmConnection(c._call("ConnectSharedMemory",
                                              shm_pb2.ConnectSharedMemoryRequest()))
            self.assertEqual(conn.max_run_message_bytes, 128 << 10)
            self.assertTrue(conn.train_steps)
            req = service_pb2.RunRequest()
            req.graph.text = TWO_OUTPUTS
            t = req.inputs.add(name="x")
            t.tensor.dtype = kiln.dtype("f32")
            t.tensor.dims.append(2)
            t.tensor.data = np.array([1.5, -1], np.float32).tobytes()
            reply = conn.try_run(req.SerializeToString(), timeout=60)
            self.assertEqual(reply.code, 0, reply.message)
            self.assertTrue(reply.request_id)
            resp = service_pb2.RunResponse.FromString(reply.run_response)
            self.assertEqual([o.name for o in resp.outputs], ["y", "z"])
            # Too large for a datagram: not sent (gRPC's to carry).
            t.tensor.dims[0] = 40000
            t.tensor.data = np.zeros(40000, np.float32).tobytes()
            self.assertIsNone(conn.try_run(req.SerializeToString()))
            conn.close()

    def test_is_local_target(self):
        for t in ("127.0.0.1:7450", "localhost:1", "unix:/run/kiln/kilnd.sock", "[::1]:7450",
                  "ipv4:127.0.0.2:80", "dns:///localhost:7450"):
            self.assertTrue(shm.is_local_target(t), t)
        for t in ("10.0.0.1:7450", "example.com:443", "[2001:db8::1]:1"):
            self.assertFalse(shm.is_local_target(t), t)


if __name__ == "__main__":
    unittest.main()

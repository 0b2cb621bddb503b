"""The scale-out variant on loopback (ctest label `deploy`): two real kilnd
replicas sharing one compile-cache directory behind a real Debian nginx running
deploy/nginx/kiln-lb.conf's balancing directives (grpc_pass, max_fails,
grpc_next_upstream). Eight clients keep one-shot runs going through nginx; one
replica is killed (SIGKILL) mid-load. Every call ends with the right answer:
the calls in flight on the dead replica fail UNAVAILABLE, the client retries,
and the retry lands on the survivor. A session lives on the replica that made
it: after its replica died it answers NOT_FOUND, which is how a client learns
it must create the session again (docs/deploy.md, "Scale-out")."""

import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_util as du  # noqa: E402
from kiln import _dtypes  # noqa: E402
from kiln._proto.kiln.v1 import service_pb2, service_pb2_grpc  # noqa: E402

N = 64        # rows of x; the graph's matrices are N x N
CHAIN = 6     # matmuls per run: long enough (ms) that runs are in flight at the kill
CLIENTS = 8
RETRIES = 8


def graph_text():
    # y = x @ W @ W ... with W = 1/N everywhere (W @ W = W), so y = row means of
    # x broadcast across: exact in f32 for small integer x and N a power of 2.
    lines = ['graph "rowmean"', f"input x: f32[{N}, {N}]", f"input w: f32[{N}, {N}]",
             "let y0 = x @ w"]
    for i in range(1, CHAIN):
        lines.append(f"let y{i} = y{i - 1} @ w")
    lines.append(f"out y{CHAIN - 1}")
    return "\n".join(lines) + "\n"


GRAPH = graph_text()
W = np.full((N, N), 1.0 / N, np.float32)


def run_request(x):
    req = service_pb2.RunRequest()
    req.graph.text = GRAPH
    for name, value in (("x", x), ("w", W)):
        t = req.inputs.add()
        t.name = name
        _dtypes.to_proto(value, t.tensor)
    return req


def expected(x):
    return np.repeat(x.astype(np.float64).mean(axis=1, keepdims=True), N, axis=1)


def boot_tag(call):
    """The replica that answered: kilnd's request ids are <boot tag>-<n>."""
    for k, v in call.initial_metadata():
        if k == "x-request-id":
            return v.split("-")[0]
    return ""


class ScaleOutTest(unittest.TestCase):
    def setUp(self):
        self.passed = False
        self.cache = tempfile.mkdtemp(prefix="kiln_deploy_cache.")
        self.replicas = [du.Kilnd(self.cache, flags=["--drain_timeout=1s"]) for _ in range(2)]
        ports = [r.port for r in self.replicas]
        self.lb = du.Nginx(lambda port, prefix: du.loopback_lb_config(ports, port, prefix))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.lb.port}")
        self.stub = service_pb2_grpc.KilnStub(self.channel)
        # Each replica's boot tag, asked directly.
        self.tags = []
        for r in self.replicas:
            with grpc.insecure_channel(r.addr) as ch:
                _, call = service_pb2_grpc.KilnStub(ch).ServerInfo.with_call(
                    service_pb2.ServerInfoRequest(), timeout=10)
                self.tags.append(boot_tag(call))
        self.assertNotEqual(self.tags[0], self.tags[1])

    def tearDown(self):
        self.channel.close()
        if not self.passed:
            print("nginx log:\n" + self.lb.output())
            for r in self.replicas:
                print("kilnd log:\n" + r.output())
        self.lb.stop()
        for r in self.replicas:
            r.stop()
        shutil.rmtree(self.cache, ignore_errors=True)

    def call(self, method, request, retries=0):
        """Calls through the balancer; UNAVAILABLE is retried `retries` times
        (what a client does when a replica goes away). Returns (response,
        replica index, attempts)."""
        for attempt in range(retries + 1):
            try:
                resp, call = getattr(self.stub, method).with_call(request, timeout=30)
                return resp, self.tags.index(boot_tag(call)), attempt + 1
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == retries:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def test_killed_replica_mid_load_loses_no_answer(self):
        # A session on each replica, made through the balancer (round robin).
        sessions = {}
        create = service_pb2.CreateSessionRequest()
        create.graph.text = GRAPH
        for _ in range(20):
            resp, replica, _ = self.call("CreateSession", create)
            sessions.setdefault(replica, resp.session_id)
            if len(sessions) == 2:
                break
        self.assertEqual(len(sessions), 2, "nginx sent every CreateSession to one replica")

        lock = threading.Lock()
        stats = {"ok": 0, "retried_calls": 0, "retries": 0, "wrong": 0, "failed": [],
                 "served": [0, 0], "served_after_kill": [0, 0]}
        killed = threading.Event()
        stop = threading.Event()

        def client(seed):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                x = rng.integers(-8, 9, size=(N, N)).astype(np.float32)
                after_kill = killed.is_set()
                try:
                    resp, replica, attempts = self.call("Run", run_request(x), retries=RETRIES)
                except grpc.RpcError as e:
                    with lock:
                        stats["failed"].append(f"{e.code()}: {e.details()}")
                    continue
                y = _dtypes.from_proto(resp.outputs[0].tensor)
                with lock:
                    stats["ok"] += 1
                    stats["served"][replica] += 1
                    if after_kill:
                        stats["served_after_kill"][replica] += 1
                    if attempts > 1:
                        stats["retried_calls"] += 1
                        stats["retries"] += attempts - 1
                    if y.shape != (N, N) or not np.array_equal(y.astype(np.float64), expected(x)):
                        stats["wrong"] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        # Both replicas serve before the kill.
        du.wait_for("both replicas to serve runs",
                    lambda: min(stats["served"]) >= 10 and stats["ok"] >= 40, timeout=60)
        victim = 0
        self.replicas[victim].kill()
        killed.set()
        ok_at_kill = stats["ok"]
        du.wait_for("runs after the kill", lambda: stats["ok"] >= ok_at_kill + 80, timeout=60)
        stop.set()
        for t in threads:
            t.join(60)

        print(f"scale-out: {stats['ok']} runs OK ({stats['served'][0]} on the killed replica, "
              f"{stats['served'][1]} on the survivor), {stats['retried_calls']} calls retried "
              f"({stats['retries']} retries), {stats['wrong']} wrong, {len(stats['failed'])} failed")
        self.assertEqual(stats["failed"], [])
        self.assertEqual(stats["wrong"], 0)
        # Calls that started after the kill were answered by the survivor only
        # (a retry of a call in flight on the dead replica included).
        self.assertEqual(stats["served_after_kill"][victim], 0)
        self.assertGreater(stats["served_after_kill"][1 - victim], 0)
        # The kill caught calls in flight on the victim (8 clients, one run in
        # flight on each replica at any moment): their retries landed.
        self.assertGreaterEqual(stats["retried_calls"], 1)

        # Sessions are pinned: the survivor's still runs; the victim's is gone,
        # answered NOT_FOUND once the balancer has moved on, and a client makes
        # it again to carry on.
        x = np.arange(N * N, dtype=np.float32).reshape(N, N) % 7
        run = service_pb2.RunRequest(session_id=sessions[1 - victim])
        for name, value in (("x", x), ("w", W)):
            t = run.inputs.add()
            t.name = name
            _dtypes.to_proto(value, t.tensor)
        resp, replica, _ = self.call("Run", run, retries=RETRIES)
        self.assertEqual(replica, 1 - victim)
        np.testing.assert_array_equal(_dtypes.from_proto(resp.outputs[0].tensor), expected(x))
        run.session_id = sessions[victim]
        with self.assertRaises(grpc.RpcError) as lost:
            self.call("Run", run, retries=RETRIES)
        self.assertEqual(lost.exception.code(), grpc.StatusCode.NOT_FOUND, lost.exception.details())
        self.assertIn("not found", lost.exception.details())
        again, replica, _ = self.call("CreateSession", create, retries=RETRIES)
        self.assertEqual(replica, 1 - victim)
        run.session_id = again.session_id
        resp, _, _ = self.call("Run", run, retries=RETRIES)
        np.testing.assert_array_equal(_dtypes.from_proto(resp.outputs[0].tensor), expected(x))
        self.passed = True


if __name__ == "__main__":
    unittest.main()

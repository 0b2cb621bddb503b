"""Debian's Prometheus against real kilnds under load (ctest label `deploy`).

Prometheus scrapes, every second, three targets of job `kilnd`: kilnd A (tenants
alice and bob; bob's device queue holds one run), kilnd B (device waits bounded
far below what work takes, so a run on vulkan:0 is a device fault) and a port
nothing listens on. Against them it evaluates deploy/prometheus/alerts.yml
(every `for:` set to 0 s, so an alert fires at its first true evaluation).

While clients keep A and B busy (one-shot and session runs, uploads, downloads,
compiles, bad requests, bob's burst of slow runs, runs on B's vulkan:0), the
test evaluates through the HTTP API every PromQL expression of the Grafana
dashboard (deploy/grafana/dashboards/kiln.json, its variables set to "All"),
its variable queries, every recording rule and the expression of every alert
(the part before its threshold): each must parse and return data. Then the four
alerts whose conditions the load produces on purpose must fire: KilnDown (the
dead target), KilnDeviceFault and KilnServerErrorRatioHigh (B's vulkan:0) and
KilnRunQueueSaturated (bob)."""

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_util as du  # noqa: E402
from kiln import _dtypes  # noqa: E402
from kiln._proto.kiln.v1 import service_pb2, service_pb2_grpc  # noqa: E402

ALICE_KEY, BOB_KEY = "alice-deploy-test-key", "bob-deploy-test-key"

AFFINE = """graph "affine"
input x: f32[batch, 3]
param w: f32[3, 2]
param b: f32[2]
let y = relu(x @ w + b)
out y
"""


def sha256(s):
    import hashlib
    return hashlib.sha256(s.encode()).hexdigest()


CONFIG_A = f"""
default_quota {{ max_in_flight: 64 max_queue: 32 }}
tenants {{ name: "alice" api_key_sha256: "{sha256(ALICE_KEY)}" weight: 2 }}
tenants {{ name: "bob" api_key_sha256: "{sha256(BOB_KEY)}" quota {{ max_queue: 1 }} }}
"""
# Every device wait times out: a run on vulkan:0 is a device fault (its restart
# probe, bounded separately, brings the device back).
CONFIG_B = "device_wait_floor_seconds: 0.000001\ndevice_wait_slack: 0.000001\n"

RATE_INTERVAL = "10s"  # $__rate_interval, for a 1 s scrape interval
FIRED = ["KilnDown", "KilnDeviceFault", "KilnServerErrorRatioHigh", "KilnRunQueueSaturated"]


def slow_text(n, matmuls):
    t = (f'graph "slow"\ninput s: f32[1, 1]\nlet a = expand(s, shape=[{n}, {n}])\n'
         "let x0 = a @ a\n")
    for i in range(1, matmuls):
        t += f"let x{i} = x{i - 1} @ a\n"
    return t + f"let y = reduce_sum(x{matmuls - 1}, axes=[0, 1])\nout y\n"


def named(field, **tensors):
    for name, value in tensors.items():
        t = field.add()
        t.name = name
        _dtypes.to_proto(value, t.tensor)


def affine_run(x):
    req = service_pb2.RunRequest()
    req.graph.text = AFFINE
    named(req.inputs, x=x)
    named(req.params, w=np.array([[1, 0], [0, 1], [1, 1]], np.float32),
          b=np.array([0.5, -0.5], np.float32))
    return req


def dashboard_queries(dashboard):
    """(panel title, expr) of every target, variables set to All."""
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def substitute(expr):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$(instance|tenant)\b", ".*", expr)


def alert_lhs(expr):
    """`<expression> <comparison> <number>` -> expression (alerts.yml's convention)."""
    m = re.fullmatch(r"(?s)(.*\S)\s*(==|!=|>=|<=|>|<)\s*(-?[0-9.e+]+)\s*", expr)
    if not m:
        raise AssertionError(f"alert expr is not `<expression> <comparison> <number>`: {expr}")
    return m.group(1)


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = tempfile.mkdtemp(prefix="kiln_deploy_cache.")
        cls.a = du.Kilnd(os.path.join(cls.cache, "a"), CONFIG_A, ["--max_concurrent_runs=1"])
        cls.b = du.Kilnd(os.path.join(cls.cache, "b"), CONFIG_B)
        cls.dead_port = du.free_port()
        with open(du.DEPLOY / "prometheus" / "alerts.yml") as f:
            rules = yaml.safe_load(f)
        for g in rules["groups"]:
            g["interval"] = "1s"
            for r in g["rules"]:
                if "for" in r:
                    r["for"] = "0s"
        cls.rules = rules
        deploy_conf = yaml.safe_load((du.DEPLOY / "prometheus" / "prometheus.yml").read_text())
        job = next(j for j in deploy_conf["scrape_configs"] if j["job_name"] == "kilnd")
        job["static_configs"] = [{"targets": [f"127.0.0.1:{cls.a.metrics_port}"],
                                  "labels": {"replica": "a"}},
                                 {"targets": [f"127.0.0.1:{cls.b.metrics_port}"],
                                  "labels": {"replica": "b"}},
                                 {"targets": [f"127.0.0.1:{cls.dead_port}"],
                                  "labels": {"replica": "dead"}}]
        job["scrape_interval"] = "1s"
        job["scrape_timeout"] = "1s"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": ["alerts.yml"], "scrape_configs": [job]}
        cls.prom = du.Prometheus(config, {"alerts.yml": yaml.safe_dump(rules)})
        cls.stop = threading.Event()
        cls.errors = []
        cls.threads = [threading.Thread(target=cls.load, args=(f,), daemon=True)
                       for f in (cls.alice_load, cls.bob_load, cls.b_load)]
        for t in cls.threads:
            t.start()

    @classmethod
    def tearDownClass(cls):
        cls.stop.set()
        for t in cls.threads:
            t.join(60)
        cls.prom.stop()
        cls.a.stop()
        cls.b.stop()
        shutil.rmtree(cls.cache, ignore_errors=True)

    @classmethod
    def load(cls, fn):
        try:
            fn()
        except Exception as e:  # reported by the tests
            cls.errors.append(f"{fn.__name__}: {e!r}")

    @classmethod
    def alice_load(cls):
        md = (("authorization", f"Bearer {ALICE_KEY}"),)
        with grpc.insecure_channel(cls.a.addr) as ch:
            stub = service_pb2_grpc.KilnStub(ch)
            create = service_pb2.CreateSessionRequest()
            create.graph.text = AFFINE
            session = stub.CreateSession(create, metadata=md, timeout=30).session_id
            upload = [service_pb2.SetParamsChunk(session_id=session)]
            for name, value in (("w", np.ones((3, 2), np.float32)), ("b", np.zeros(2, np.float32))):
                c = service_pb2.SetParamsChunk(name=name, dtype=_dtypes.dtype(value.dtype),
                                               dims=list(value.shape), data=value.tobytes())
                upload.append(c)
            i = 0
            while not cls.stop.is_set():
                i += 1
                x = np.full((2, 3), float(i % 5), np.float32)
                out = stub.Run(affine_run(x), metadata=md, timeout=30)
                y = _dtypes.from_proto(out.outputs[0].tensor)
                np.testing.assert_array_equal(y, np.maximum(x @ np.array(
                    [[1, 0], [0, 1], [1, 1]], np.float32) + np.array([0.5, -0.5], np.float32), 0))
                if i % 5 == 0:
                    stub.SetParams(iter(upload), metadata=md, timeout=30)
                    run = service_pb2.RunRequest(session_id=session)
                    named(run.inputs, x=x)
                    stub.Run(run, metadata=md, timeout=30)
                    list(stub.GetParams(service_pb2.GetParamsRequest(session_id=session),
                                        metadata=md, timeout=30))
                    comp = service_pb2.CompileRequest()
                    comp.graph.text = AFFINE
                    comp.input_shapes.add(name="x", dims=[4, 3])
                    stub.Compile(comp, metadata=md, timeout=30)
                if i % 7 == 0:  # the caller's mistake: INVALID_ARGUMENT
                    bad = affine_run(x)
                    bad.inputs[0].name = "nope"
                    try:
                        stub.Run(bad, metadata=md, timeout=30)
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                time.sleep(0.01)

    @classmethod
    def bob_load(cls):
        """Bursts of 6 slow runs at once: one runs, one waits in bob's queue
        (max_queue 1), the others are refused RESOURCE_EXHAUSTED."""
        md = (("authorization", f"Bearer {BOB_KEY}"),)
        req = service_pb2.RunRequest()
        req.graph.text = slow_text(256, 8)
        named(req.inputs, s=np.full((1, 1), 1.0 / 256, np.float32))
        with grpc.insecure_channel(cls.a.addr) as ch:
            stub = service_pb2_grpc.KilnStub(ch)
            stub.Run(req, metadata=md, timeout=60)  # compiled once
            while not cls.stop.is_set():
                futures = [stub.Run.future(req, metadata=md, timeout=60) for _ in range(6)]
                for f in futures:
                    try:
                        f.result()
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                time.sleep(0.05)

    @classmethod
    def b_load(cls):
        """Runs on B's vulkan:0 (each one a device fault while the device is
        healthy, UNAVAILABLE either way)."""
        with grpc.insecure_channel(cls.b.addr) as ch:
            stub = service_pb2_grpc.KilnStub(ch)
            devices = [d.id for d in stub.ListDevices(service_pb2.ListDevicesRequest(),
                                                      timeout=30).devices]
            assert "vulkan:0" in devices, f"kilnd B has no vulkan:0 to fault (devices {devices})"
            req = service_pb2.RunRequest()
            req.graph.text = slow_text(128, 4)
            req.options.device = "vulkan:0"
            named(req.inputs, s=np.full((1, 1), 1.0 / 128, np.float32))
            while not cls.stop.is_set():
                try:
                    stub.Run(req, timeout=60)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                time.sleep(0.3)

    def eventually_data(self, what, expr, timeout=45):
        """Evaluates `expr` until it returns data; fails on a parse error at once."""
        last = None

        def ready():
            nonlocal last
            if self.errors:
                raise AssertionError(f"load failed: {self.errors}")
            status, error, result = self.prom.query(expr)
            self.assertEqual(status, "success", f"{what}: {expr}\n{error}")
            last = result
            return bool(result)

        try:
            du.wait_for(f"{what} to return data", ready, timeout=timeout, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}: {expr} (last result {last})") from None
        return last

    def test_1_every_query_returns_data(self):
        self.eventually_data("requests", f"rate(kiln_requests_total[{RATE_INTERVAL}]) > 0")
        dashboard = json.loads((du.DEPLOY / "grafana" / "dashboards" / "kiln.json").read_text())
        queries = dashboard_queries(dashboard)
        self.assertGreater(len(queries), 30)
        for title, expr in queries:
            self.eventually_data(f"panel {title!r}", substitute(expr))
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
            self.assertIsNotNone(m, var["query"])
            r = self.prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
            self.assertEqual(r["status"], "success", r)
            self.assertTrue(r["data"], f"variable {var['name']}: {var['query']} has no values")
        n_rules = 0
        for g in self.rules["groups"]:
            for r in g["rules"]:
                n_rules += 1
                if "record" in r:
                    self.eventually_data(f"rule {r['record']}", r["expr"])
                    self.eventually_data(f"recorded {r['record']}", r["record"])
                else:
                    self.eventually_data(f"alert {r['alert']}", alert_lhs(r["expr"]))
        self.assertEqual(n_rules, 13)
        print(f"prometheus: {len(queries)} dashboard queries, {n_rules} rules returned data")

    def test_2_provoked_alerts_fire(self):
        names = {r["alert"] for g in self.rules["groups"] for r in g["rules"] if "alert" in r}
        self.assertTrue(set(FIRED) <= names, names)
        firing = {}

        def all_firing():
            if self.errors:
                raise AssertionError(f"load failed: {self.errors}")
            r = self.prom.api("alerts")
            self.assertEqual(r["status"], "success", r)
            for a in r["data"]["alerts"]:
                if a["state"] == "firing":
                    firing.setdefault(a["labels"]["alertname"], a["labels"])
            return set(FIRED) <= set(firing)

        try:
            du.wait_for("the provoked alerts to fire", all_firing, timeout=60, interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}: firing {sorted(firing)}\n{self.prom.output()}") from None
        self.assertEqual(firing["KilnDown"]["instance"], f"127.0.0.1:{self.dead_port}")
        self.assertEqual(firing["KilnDeviceFault"]["device"], "vulkan:0")
        self.assertEqual(firing["KilnDeviceFault"]["instance"], f"127.0.0.1:{self.b.metrics_port}")
        self.assertEqual(firing["KilnRunQueueSaturated"]["tenant"], "bob")
        self.assertEqual(firing["KilnServerErrorRatioHigh"]["instance"],
                         f"127.0.0.1:{self.b.metrics_port}")
        print(f"prometheus: firing {sorted(firing)}")


    def test_3_label_values_come_from_the_config(self):
        """Whatever clients send (unknown keys, made-up session ids and request
        ids), the tenant label takes only the config's names."""
        import secrets
        with grpc.insecure_channel(self.a.addr) as ch:
            stub = service_pb2_grpc.KilnStub(ch)
            for _ in range(20):
                md = (("authorization", f"Bearer {secrets.token_hex(16)}"),
                      ("x-request-id", secrets.token_hex(8)))
                with self.assertRaises(grpc.RpcError) as e:
                    stub.ListDevices(service_pb2.ListDevicesRequest(), metadata=md, timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                md = (("authorization", f"Bearer {ALICE_KEY}"),)
                with self.assertRaises(grpc.RpcError) as e:
                    stub.CloseSession(service_pb2.CloseSessionRequest(
                        session_id=secrets.token_hex(12)), metadata=md, timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.eventually_data("unauthenticated calls",
                             'kiln_requests_total{tenant="unauthenticated", code="UNAUTHENTICATED"}')
        r = self.prom.api("label/tenant/values")
        self.assertEqual(r["status"], "success", r)
        self.assertLessEqual(set(r["data"]), {"alice", "bob", "default", "unauthenticated"})
        r = self.prom.api("label/method/values")
        self.assertLessEqual(set(r["data"]), {
            "Compile", "CreateSession", "SetParams", "GetParams", "Run", "CloseSession",
            "ListDevices", "GetReport", "ServerInfo"})


if __name__ == "__main__":
    unittest.main()

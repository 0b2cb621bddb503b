"""deploy/ checked without a Docker engine (ctest label `deploy`):

- Debian's docker-compose 1.29 validates every compose file combination
  (`docker-compose config`), and the merged result wires what docs/deploy.md says;
- promtool checks both Prometheus configs and the rules, and runs the rules' unit
  tests (deploy/prometheus/alerts_test.yml);
- the Grafana provisioning and dashboard JSON have the structure Grafana loads
  (no Grafana in Debian): unique ids, a 24-column grid without overlaps, targets
  on the provisioned datasource, only defined variables, and only documented metrics;
- nginx -t accepts deploy/nginx/kiln-lb.conf (hosts and files made local);
- deploy/stage.sh lays out the image's contents from the test build, the
  runtime package list covers every library the binaries load, the wheel installs,
  and deploy/init-secrets.sh writes a CA, certificates and a config that kilnd
  starts with (TLS + tenant) and answers the image's HEALTHCHECK command on.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_util as du  # noqa: E402

DEPLOY = du.DEPLOY
COMPOSE_SETS = [
    ["docker-compose.yml"],
    ["docker-compose.yml", "docker-compose.gpu.yml"],
    ["docker-compose.yml", "docker-compose.scale.yml"],
    ["docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.scale.yml"],
]


def compose_config(files):
    cmd = ["docker-compose", "--project-directory", str(DEPLOY)]
    for f in files:
        cmd += ["-f", str(DEPLOY / f)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    r = subprocess.run(cmd + ["config"], capture_output=True, text=True, env=env, cwd=DEPLOY)
    return r


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r.returncode, r.stdout + r.stderr


class ComposeTest(unittest.TestCase):
    def test_every_compose_combination_validates(self):
        for files in COMPOSE_SETS:
            with self.subTest(files=files):
                r = compose_config(files)
                self.assertEqual(r.returncode, 0, r.stderr)
                merged = yaml.safe_load(r.stdout)
                services = merged["services"]
                for s in ("kiln-init", "kilnd", "prometheus", "grafana"):
                    self.assertIn(s, services)
                self.assertTrue({"kiln-cache", "kiln-models", "kiln-secrets"} <= set(merged["volumes"]))
                kilnds = ["kilnd"] + (["kilnd-2"] if "docker-compose.scale.yml" in files else [])
                for k in kilnds:
                    vols = services[k]["volumes"]
                    self.assertIn("kiln-cache:/var/cache/kiln:rw", vols)
                    self.assertIn("kiln-models:/var/lib/kiln/models:rw", vols)
                    self.assertIn("kiln-secrets:/etc/kiln/secrets:ro", vols)
                    self.assertEqual(services[k]["depends_on"]["kiln-init"]["condition"],
                                     "service_completed_successfully")
                # Every bind-mounted file or directory exists in the tree.
                for name, svc in services.items():
                    for v in svc.get("volumes", []):
                        src = v.split(":")[0]
                        if src.startswith("/"):
                            self.assertTrue(os.path.exists(src), f"{name} mounts missing {src}")
                prom_conf = [v for v in services["prometheus"]["volumes"]
                             if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
                self.assertEqual(len(prom_conf), 1, services["prometheus"]["volumes"])
                if "docker-compose.gpu.yml" in files:
                    devices = services["kilnd"]["deploy"]["resources"]["reservations"]["devices"]
                    self.assertEqual(devices[0]["driver"], "nvidia")
                    self.assertIn("gpu", devices[0]["capabilities"])
                if "docker-compose.scale.yml" in files:
                    self.assertIn("kiln-lb", services)
                    self.assertTrue(prom_conf[0].split(":")[0].endswith("prometheus-scale.yml"))

    def test_v2_only_keys_are_refused(self):
        # The check above means something: 1.29 rejects what v1 cannot run.
        tmp = tempfile.mkdtemp(prefix="kiln_compose.")
        try:
            text = (DEPLOY / "docker-compose.yml").read_text()
            bad = os.path.join(tmp, "bad.yml")
            with open(bad, "w") as f:
                f.write("name: kiln\n" + text)
            r = subprocess.run(["docker-compose", "-f", bad, "config"], capture_output=True,
                               text=True, cwd=DEPLOY)
            self.assertNotEqual(r.returncode, 0, r.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class PrometheusConfigTest(unittest.TestCase):
    def test_promtool(self):
        prom = DEPLOY / "prometheus"
        for conf in ("prometheus.yml", "prometheus-scale.yml"):
            code, out = run(["promtool", "check", "config", conf], cwd=prom)
            self.assertEqual(code, 0, out)
        code, out = run(["promtool", "check", "rules", "alerts.yml"], cwd=prom)
        self.assertEqual(code, 0, out)
        code, out = run(["promtool", "test", "rules", "alerts_test.yml"], cwd=prom)
        self.assertEqual(code, 0, out)

    def test_every_alert_has_a_unit_test(self):
        rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
        alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
        tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())
        tested = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", [])
                  if a.get("exp_alerts")}
        self.assertEqual(alerts, tested)


class GrafanaTest(unittest.TestCase):
    def setUp(self):
        self.dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "kiln.json").read_text())
        prov = DEPLOY / "grafana" / "provisioning"
        self.datasources = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
        self.providers = yaml.safe_load((prov / "dashboards" / "kiln.yml").read_text())

    def test_provisioning_points_at_the_dashboard(self):
        self.assertEqual(self.datasources["apiVersion"], 1)
        ds = self.datasources["datasources"]
        self.assertEqual(len(ds), 1)
        self.assertEqual(ds[0]["type"], "prometheus")
        self.assertEqual(ds[0]["url"], "http://prometheus:9090")  # the compose service
        self.assertEqual(self.providers["apiVersion"], 1)
        (p,) = self.providers["providers"]
        self.assertEqual(p["type"], "file")
        # The compose file mounts deploy/grafana/dashboards where the provider looks.
        compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
        mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
        self.assertEqual(mounts[p["options"]["path"]], "./grafana/dashboards")
        self.assertEqual(mounts["/etc/grafana/provisioning"], "./grafana/provisioning")
        home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        self.assertEqual(home, p["options"]["path"] + "/kiln.json")
        # The dashboard's datasource variable defaults to the provisioned uid.
        (dsvar,) = [v for v in self.dashboard["templating"]["list"] if v["type"] == "datasource"]
        self.assertEqual(dsvar["query"], "prometheus")
        self.assertEqual(dsvar["current"]["value"], ds[0]["uid"])

    def test_dashboard_structure(self):
        d = self.dashboard
        for key in ("uid", "title", "panels", "templating", "schemaVersion", "time"):
            self.assertIn(key, d)
        self.assertRegex(d["uid"], r"^[a-zA-Z0-9_-]{1,40}$")
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")
        variables = {v["name"] for v in d["templating"]["list"]}
        builtins = {"__rate_interval", "__interval", "__range"}
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            self.assertTrue(0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, f"panel {p['title']!r} overlaps another")
                    cells.add((x, y))
            self.assertIn(p["type"], {"row", "timeseries", "stat"})
            if p["type"] == "row":
                continue
            self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${datasource}"})
            self.assertTrue(p["targets"], p["title"])
            refs = [t["refId"] for t in p["targets"]]
            self.assertEqual(len(refs), len(set(refs)), p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"], p["datasource"])
                for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                    self.assertIn(var, variables | builtins, f"{p['title']}: ${var} is not defined")

    def test_every_metric_is_documented(self):
        """Each kiln_ metric the dashboard and rules use is in docs/server.md's table."""
        docs = (du.SOURCE / "docs" / "server.md").read_text()
        documented = set(re.findall(r"`(kiln_[a-z_]+)`", docs))
        used = set()
        texts = [t["expr"] for p in self.dashboard["panels"] for t in p.get("targets", [])]
        rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
        texts += [r["expr"] for g in rules["groups"] for r in g["rules"]]
        for text in texts:
            used |= set(re.findall(r"\b(kiln_[a-z_]+)", text))
        base = {re.sub(r"_(bucket|sum|count)$", "", m) for m in used}
        missing = sorted(m for m in base if m not in documented)
        self.assertEqual(missing, [], "used by the dashboard or rules, not in docs/server.md")


class NginxConfigTest(unittest.TestCase):
    def test_lb_config_parses(self):
        tmp = tempfile.mkdtemp(prefix="kiln_nginx_t.")
        try:
            code, out = run([str(DEPLOY / "init-secrets.sh"), f"{tmp}/secrets"])
            self.assertEqual(code, 0, out)
            text = (DEPLOY / "nginx" / "kiln-lb.conf").read_text()
            self.assertIn("grpc_pass grpcs://kilnd_replicas;", text)
            text = text.replace("/etc/kiln/secrets", f"{tmp}/secrets")
            text = re.sub(r"server kilnd(-2)?:7450", "server 127.0.0.1:7450", text)
            text = text.replace("pid /tmp/nginx.pid", f"pid {tmp}/nginx.pid")
            text = text.replace("http {", "http {\n" + "".join(
                f"  {t}_temp_path {tmp}/{t};\n"
                for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")))
            with open(f"{tmp}/nginx.conf", "w") as f:
                f.write(text)
            code, out = run(["nginx", "-t", "-p", tmp, "-c", f"{tmp}/nginx.conf", "-e",
                             f"{tmp}/error.log"])
            self.assertEqual(code, 0, out)
            self.assertIn("syntax is ok", out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class StageTest(unittest.TestCase):
    """What the Dockerfile's runtime stage copies, built by the same script."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kiln_stage.")
        cls.stage = os.path.join(cls.tmp, "stage")
        cls.code, cls.out = run([str(DEPLOY / "stage.sh"), os.environ["KILN_BUILD_DIR"], cls.stage])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.code, 0, self.out)

    def test_layout_and_runtime_packages(self):
        configs = [f for f in os.listdir(du.SOURCE / "configs") if f.endswith(".textproto")]
        self.assertTrue(configs)
        for f in ["bin/kilnd", "bin/kilnctl", "bin/kiln-init-secrets", "etc/kiln/container.textproto"] + [
                f"etc/kiln/{c}" for c in configs]:
            self.assertTrue(os.path.exists(os.path.join(self.stage, f)), f)
        # kilnd's device worker ships beside kilnd whenever the tree builds one.
        if os.path.exists(os.path.join(os.environ["KILN_BUILD_DIR"], "backends",
                                       "kiln-device-worker")):
            self.assertTrue(os.path.exists(os.path.join(self.stage, "bin", "kiln-device-worker")))
        wheels = os.listdir(os.path.join(self.stage, "wheels"))
        self.assertEqual(len(wheels), 1, wheels)
        self.assertRegex(wheels[0], r"^kiln-0\.1\.0-py3-none-any\.whl$")
        with open(os.path.join(self.stage, "runtime-packages.txt")) as f:
            packages = f.read().split()
        for must in ("libgrpc++1.51", "libprotobuf32", "libdnnl2", "libspdlog1.10"):
            self.assertIn(must, packages)
        self.assertFalse([p for p in packages if p.endswith("-dev")], packages)
        # The Dockerfile installs exactly this list on Debian 12 slim: each is a
        # real package of this Debian (installed here).
        for p in packages:
            code, out = run(["dpkg-query", "-W", "-f=${Status}", p])
            self.assertIn("install ok installed", out, p)
        dockerfile = (DEPLOY / "Dockerfile").read_text()
        self.assertIn("$(cat /tmp/runtime-packages.txt)", dockerfile)
        self.assertIn("/src/deploy/stage.sh /build /stage", dockerfile)
        self.assertIn("/src/scripts/install-deps.sh", dockerfile)

    def test_wheel_installs(self):
        venv = os.path.join(self.tmp, "venv")
        code, out = run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
        self.assertEqual(code, 0, out)
        (wheel,) = os.listdir(os.path.join(self.stage, "wheels"))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        code, out = run([f"{venv}/bin/pip", "install", "--no-deps", "--no-index", "-q",
                         "--disable-pip-version-check", os.path.join(self.stage, "wheels", wheel)],
                        env=env)
        self.assertEqual(code, 0, out)
        code, out = run([f"{venv}/bin/python", "-c",
                         "import kiln; from kiln._proto.kiln.v1 import service_pb2_grpc; "
                         "print(kiln.__file__)"], env=env, cwd=self.tmp)
        self.assertEqual(code, 0, out)
        self.assertIn("site-packages", out)

    def test_secrets_config_starts_kilnd_and_passes_the_healthcheck(self):
        secrets = os.path.join(self.tmp, "secrets")
        code, out = run([os.path.join(self.stage, "bin", "kiln-init-secrets"), secrets,
                         os.path.join(self.stage, "etc", "kiln", "container.textproto")])
        self.assertEqual(code, 0, out)
        for f in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "api-key",
                  "kilnd.textproto"):
            self.assertTrue(os.path.exists(os.path.join(secrets, f)), f)
        code, out = run(["openssl", "verify", "-CAfile", f"{secrets}/ca.pem",
                         f"{secrets}/server.pem", f"{secrets}/client.pem"])
        self.assertEqual(code, 0, out)
        # Idempotent: a second start changes nothing.
        before = pathlib.Path(secrets, "kilnd.textproto").read_text()
        code, out = run([os.path.join(self.stage, "bin", "kiln-init-secrets"), secrets])
        self.assertEqual(code, 0, out)
        self.assertEqual(pathlib.Path(secrets, "kilnd.textproto").read_text(), before)
        # The staged kilnd with that config, off loopback as in the container
        # (kilnd starts there only with TLS and tenants) but on an ephemeral
        # port, then the image's HEALTHCHECK command.
        # The container's model volume is /var/lib/kiln/models; here a temp dir.
        models = os.path.join(self.tmp, "models")
        os.makedirs(models, exist_ok=True)
        kilnd = du.Kilnd(os.path.join(self.tmp, "cache"), before,
                         flags=["--listen=0.0.0.0:0", f"--model_repository={models}"],
                         binary=os.path.join(self.stage, "bin", "kilnd"))
        try:
            kilnctl = os.path.join(self.stage, "bin", "kilnctl")
            health = [kilnctl, "--addr", f"127.0.0.1:{kilnd.port}", "--tls", "--ca",
                      f"{secrets}/ca.pem", "health"]
            code, out = run(health)
            self.assertEqual(code, 0, out + kilnd.output())
            self.assertIn("SERVING", out)
            # Tenant "ops" by its API key, over TLS.
            key = pathlib.Path(secrets, "api-key").read_text().strip()
            code, out = run(health[:-1] + ["--api_key", key, "devices"])
            self.assertEqual(code, 0, out)
            self.assertIn("cpu:0", out)
            # Plaintext to the TLS port is refused.
            code, out = run([kilnctl, "--addr", f"127.0.0.1:{kilnd.port}", "--api_key", key,
                             "devices"])
            self.assertNotEqual(code, 0, out)
        finally:
            kilnd.stop()


if __name__ == "__main__":
    unittest.main()

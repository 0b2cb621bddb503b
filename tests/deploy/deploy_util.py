"""Real processes for the deploy tests: kilnd, Debian's prometheus and nginx, each
on 127.0.0.1 with ephemeral ports and its own temp directory, stopped by the
test. Environment (set by ctest): KILND, KILNCTL, KILN_SOURCE_DIR, PYTHONPATH
at the build tree's generated `kiln` package."""

import json
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
DEPLOY = SOURCE / "deploy"
KILND = os.environ.get("KILND", "")
KILNCTL = os.environ.get("KILNCTL", "")


def free_port():
    """A port free right now on 127.0.0.1 (for programs that cannot report the
    port they bound; the caller retries if another process takes it first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, timeout=60.0, interval=0.05):
    """Polls `predicate` until it returns a truthy value, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http_get(url, timeout=10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def stop_process(proc, log, directory):
    """SIGTERM, 30 s to exit (then SIGKILL); closes its log, removes its directory."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
    shutil.rmtree(directory, ignore_errors=True)


class Kilnd:
    """A kilnd child on 127.0.0.1 (gRPC and metrics on ephemeral ports)."""

    def __init__(self, cache_dir, config_text="", flags=(), binary=None):
        self.dir = tempfile.mkdtemp(prefix="kiln_deploy_kilnd.")
        args = [binary or KILND, "--listen=127.0.0.1:0", f"--port_file={self.dir}/port",
                "--metrics_listen=127.0.0.1:0", f"--metrics_port_file={self.dir}/metrics_port",
                f"--cache_dir={cache_dir}", "--calibration=never", "--log_level=warn"]
        if config_text:
            with open(f"{self.dir}/config.textproto", "w") as f:
                f.write(config_text)
            args.append(f"--config={self.dir}/config.textproto")
        args += list(flags)
        self.log = open(f"{self.dir}/log", "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = wait_for("kilnd's port file", lambda: self._read(f"{self.dir}/port"))
        self.metrics_port = wait_for("kilnd's metrics port file",
                                     lambda: self._read(f"{self.dir}/metrics_port"))
        self.addr = f"127.0.0.1:{self.port}"

    def _read(self, path):
        if self.proc.poll() is not None:
            raise RuntimeError(f"kilnd exited with {self.proc.returncode}:\n{self.output()}")
        try:
            with open(path) as f:
                return int(f.read().strip()) or None
        except (FileNotFoundError, ValueError):
            return None

    def output(self):
        self.log.flush()
        with open(f"{self.dir}/log") as f:
            return f.read()

    def metrics(self):
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def kill(self):
        """SIGKILL: no drain, no goodbye (a crashed replica)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        stop_process(self.proc, self.log, self.dir)


class Prometheus:
    """Debian's prometheus with `config` (a dict, written as YAML) and any rule
    files (name -> text) beside it, on an ephemeral loopback port."""

    def __init__(self, config, rule_files=None):
        import yaml
        self.dir = tempfile.mkdtemp(prefix="kiln_deploy_prom.")
        for name, text in (rule_files or {}).items():
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        self.log = open(os.path.join(self.dir, "log"), "w+")
        for _ in range(5):  # the port is picked before prometheus binds it
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={self.dir}/prometheus.yml",
                 f"--storage.tsdb.path={self.dir}/data",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
                stdout=self.log, stderr=subprocess.STDOUT)
            if self._ready():
                return
        raise RuntimeError(f"prometheus did not start:\n{self.output()}")

    def _ready(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if "Ready" in http_get(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def output(self):
        self.log.flush()
        with open(os.path.join(self.dir, "log")) as f:
            return f.read()

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            body = http_get(url)
        except urllib.error.HTTPError as e:
            body = e.read().decode()
        return json.loads(body)

    def query(self, expr):
        """An instant query: (status, error, result list)."""
        r = self.api("query", query=expr)
        return r["status"], r.get("error", ""), r.get("data", {}).get("result", [])

    def stop(self):
        stop_process(self.proc, self.log, self.dir)


def unprivileged():
    """How to drop root for a child (nginx, here): (uid, gid), or None when
    this process is not root and the child runs as ourselves anyway."""
    if os.getuid() != 0:
        return None
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def loopback_lb_config(upstream_ports, port, prefix):
    """deploy/nginx/kiln-lb.conf for loopback: its balancing directives as they
    are (upstream, max_fails, fail_timeout, keepalive, grpc_next_upstream, the
    timeouts), with the replicas at `upstream_ports`, plaintext h2c on `port`
    instead of TLS on both sides, and every path inside `prefix`."""
    text = (DEPLOY / "nginx" / "kiln-lb.conf").read_text()
    out = []
    replicas = iter(upstream_ports)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("ssl_", "grpc_ssl_")):
            continue  # TLS: the loopback test speaks h2c on both sides
        if stripped.startswith("server ") and ":7450" in stripped:
            line = line.replace(stripped.split()[1], f"127.0.0.1:{next(replicas)}")
        elif stripped.startswith("listen "):
            line = f"    listen 127.0.0.1:{port} http2;"
        elif stripped.startswith("pid "):
            line = f"pid {prefix}/nginx.pid;"
        elif stripped.startswith("error_log "):
            line = f"error_log {prefix}/error.log info;"
        elif stripped.startswith("worker_processes "):
            line = "worker_processes 1;"
        line = line.replace("grpcs://", "grpc://")
        out.append(line)
        if stripped == "http {":
            # Debian's nginx keeps its temp files under /var/lib/nginx; this one
            # keeps them in its prefix so that it runs unprivileged.
            for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
                out.append(f"  {t}_temp_path {prefix}/{t}_temp;")
    if next(replicas, None) is not None:
        raise AssertionError("kiln-lb.conf has fewer upstream servers than the test starts")
    return "\n".join(out) + "\n"


class Nginx:
    """Debian's nginx with the config `render(port, prefix)` returns,
    in its own prefix (a temp dir), on an ephemeral loopback port, never as root:
    as this user, or as `nobody` when the test runs as root."""

    def __init__(self, render):
        self.dir = tempfile.mkdtemp(prefix="kiln_deploy_nginx.")
        os.chmod(self.dir, 0o755)
        drop = unprivileged()
        if drop:
            os.chown(self.dir, *drop)
        self.log_path = os.path.join(self.dir, "error.log")
        for _ in range(5):  # the port is picked before nginx binds it
            self.port = free_port()
            conf = os.path.join(self.dir, "nginx.conf")
            with open(conf, "w") as f:
                f.write(render(self.port, self.dir))
            cmd = ["nginx", "-p", self.dir, "-c", conf, "-e", self.log_path, "-g", "daemon off;"]
            if drop:
                cmd = ["setpriv", f"--reuid={drop[0]}", f"--regid={drop[1]}", "--clear-groups"] + cmd
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if self._listening():
                return
            self.stop(keep_dir=True)
        raise RuntimeError(f"nginx did not start:\n{self.output()}")

    def _listening(self):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def output(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, keep_dir=False):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish open requests
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

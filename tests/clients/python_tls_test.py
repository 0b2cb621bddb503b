"""The Python client over TLS and mTLS against a real kilnd (ctest label `clients`).

Certificates are made by the openssl CLI here, in a temp dir: a CA, kilnd's
certificate (SAN localhost, 127.0.0.1), a client certificate that maps to a
tenant and a CA nobody trusts. Run with /usr/bin/python3, PYTHONPATH at the
generated package, KILND at the built binary.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import grpc

import kiln

KILND = os.environ["KILND"]
ALICE_KEY = "alice-python-tls-key"


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    for ca, cn in (("ca", "Kiln Test CA"), ("other-ca", "Other CA")):
        openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/O=Kiln Test/CN={cn}")

    def sign(name, subject, ext):
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl(d, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-sha256", "-extfile", f"{name}.ext",
                "-out", f"{name}.pem")

    sign("kilnd", "/O=Kiln/CN=kilnd",
         "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    sign("carol", "/O=Kiln/CN=carol",
         "subjectAltName=DNS:carol.clients.kiln\nextendedKeyUsage=clientAuth")


class TlsKilnd:
    def __init__(self, pki):
        self.dir = tempfile.mkdtemp(prefix="kiln_py_tls.")
        config = os.path.join(self.dir, "tenants.textproto")
        with open(config, "w") as f:
            f.write(f'tenants {{ name: "alice" api_key_sha256: '
                    f'"{hashlib.sha256(ALICE_KEY.encode()).hexdigest()}" }}\n'
                    'tenants { name: "carol" client_cert_san: "carol.clients.kiln" }\n')
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [KILND, "--listen=127.0.0.1:0", f"--port_file={port_file}", "--metrics_listen=off",
             f"--cache_dir={self.dir}/cache", f"--config={config}", "--log_level=warn",
             f"--tls_cert={pki}/kilnd.pem", f"--tls_key={pki}/kilnd.key",
             f"--tls_client_ca={pki}/ca.pem"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"kilnd exited with {self.proc.returncode}:\n{self.log.read()}")
            try:
                with open(port_file) as f:
                    self.addr = f"127.0.0.1:{int(f.read().strip())}"
                    return
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)
        raise RuntimeError("kilnd wrote no port file in 60 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def setUpModule():
    global PKI, KILND_PROC
    PKI = tempfile.mkdtemp(prefix="kiln_py_pki.")
    make_pki(PKI)
    KILND_PROC = TlsKilnd(PKI)


def tearDownModule():
    KILND_PROC.stop()
    shutil.rmtree(PKI, ignore_errors=True)


class PythonTlsTest(unittest.TestCase):
    def info(self, **kwargs):
        with kiln.Client(KILND_PROC.addr, timeout=20, **kwargs) as c:
            return c.server_info()

    def test_api_key_over_tls(self):
        info = self.info(api_key=ALICE_KEY, tls=True, ca=f"{PKI}/ca.pem")
        self.assertEqual(info.tenant, "alice")

    def test_client_certificate_is_the_tenant(self):
        info = self.info(ca=f"{PKI}/ca.pem", cert=f"{PKI}/carol.pem", key=f"{PKI}/carol.key")
        self.assertEqual(info.tenant, "carol")
        self.assertFalse(info.cache.server_wide)
        self.assertEqual(info.cache.dir, "")

    def test_environment_variables(self):
        env = {"KILN_TLS": "1", "KILN_CA": f"{PKI}/ca.pem", "KILN_CERT": f"{PKI}/carol.pem",
               "KILN_KEY": f"{PKI}/carol.key"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.assertEqual(self.info().tenant, "carol")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_plaintext_and_wrong_ca_are_refused(self):
        with self.assertRaises(kiln.KilnError) as e:
            self.info(api_key=ALICE_KEY, tls=False)
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(kiln.KilnError) as e:
            self.info(api_key=ALICE_KEY, ca=f"{PKI}/other-ca.pem")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_certificate_needs_its_key_and_files_must_exist(self):
        with self.assertRaisesRegex(ValueError, "needs its key"):
            kiln.Client(KILND_PROC.addr, cert=f"{PKI}/carol.pem", key="")
        with self.assertRaisesRegex(ValueError, "nope.pem"):
            kiln.Client(KILND_PROC.addr, ca=f"{PKI}/nope.pem")


if __name__ == "__main__":
    unittest.main()

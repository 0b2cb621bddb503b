"""`pip install clients/python`: the kiln package, with its protobuf and gRPC
stubs generated from the repository's proto/ at build time (protoc and
grpc_python_plugin from protobuf-compiler-grpc).

There is deliberately no pyproject.toml: with one, pip builds in an isolated
environment and must download setuptools, which an offline machine cannot.
Without it, pip builds with the setuptools already installed (Debian's), so
`/usr/bin/python3 -m venv --system-site-packages v && v/bin/pip install
clients/python` works offline. Set KILN_PROTO_DIR to build from a copy of the
package outside the repository.
"""

import os
import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, str(HERE))
        from gen_proto import generate
        proto_dir = os.environ.get("KILN_PROTO_DIR", str(HERE.parent.parent / "proto"))
        if not (pathlib.Path(proto_dir) / "kiln/v1/service.proto").exists():
            sys.exit(f"kiln: no kiln/v1/service.proto under {proto_dir}; set KILN_PROTO_DIR")
        generate(proto_dir, os.path.join(self.build_lib, "kiln", "_proto"),
                 os.environ.get("PROTOC", "protoc"))


setup(
    name="kiln",
    version="0.1.0",
    description="Client of kilnd, the Kiln ML compiler and runtime daemon",
    packages=["kiln"],
    python_requires=">=3.9",
    install_requires=["grpcio>=1.51", "protobuf>=4.21", "numpy>=1.21"],
    cmdclass={"build_py": BuildWithStubs},
)

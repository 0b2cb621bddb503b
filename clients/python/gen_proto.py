#!/usr/bin/env python3
"""Generates the kiln package's protobuf and gRPC stubs from proto/.

Used by the CMake target `kiln_python` and by setup.py (`pip install
clients/python`). protoc writes modules that import each other as `kiln.v1`
and `grpc.health.v1`; inside the package they live under `kiln._proto`, so the
imports are rewritten to relative ones (and `grpc.health` can never shadow the
real `grpc` package).
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys

PROTOS = [
    "kiln/v1/tensor.proto",
    "kiln/v1/graph.proto",
    "kiln/v1/report.proto",
    "kiln/v1/train.proto",
    "kiln/v1/service.proto",
    "kiln/v1/config.proto",
    "kiln/v1/shm.proto",
    "grpc/health/v1/health.proto",
]

_IMPORT = re.compile(r"^from ((?:kiln|grpc\.health)(?:\.\w+)*) import (\w+)", re.M)


def _fix_imports(path: pathlib.Path, out: pathlib.Path) -> None:
    own_package = ".".join(path.parent.relative_to(out).parts)
    text = path.read_text()

    def repl(m: re.Match) -> str:
        package, module = m.group(1), m.group(2)
        if package == own_package:
            return f"from . import {module}"
        up = "." * (len(own_package.split(".")) + 1)
        return f"from {up}{package} import {module}"

    path.write_text(_IMPORT.sub(repl, text))


def generate(proto_dir: str, out: str, protoc: str = "protoc", plugin: str = "") -> None:
    proto_dir_p = pathlib.Path(proto_dir).resolve()
    out_p = pathlib.Path(out).resolve()
    plugin = plugin or shutil.which("grpc_python_plugin") or ""
    if not plugin:
        sys.exit("gen_proto: grpc_python_plugin not found (apt install protobuf-compiler-grpc)")
    protos = [p for p in PROTOS if (proto_dir_p / p).exists()]
    missing = sorted(set(PROTOS) - set(protos))
    if "kiln/v1/service.proto" in missing:
        sys.exit(f"gen_proto: {proto_dir_p} lacks kiln/v1/service.proto")
    if out_p.exists():
        shutil.rmtree(out_p)
    out_p.mkdir(parents=True)
    subprocess.run(
        [protoc, f"-I{proto_dir_p}", f"--python_out={out_p}", f"--grpc_out={out_p}",
         f"--plugin=protoc-gen-grpc={plugin}"] + protos,
        check=True)
    for py in out_p.rglob("*_pb2*.py"):
        _fix_imports(py, out_p)
    # Regular packages all the way down (no namespace-package surprises).
    for d in [out_p] + [p for p in out_p.rglob("*") if p.is_dir()]:
        (d / "__init__.py").touch()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--proto_dir", required=True)
    ap.add_argument("--out", required=True, help="the package's _proto directory")
    ap.add_argument("--protoc", default=os.environ.get("PROTOC", "protoc"))
    ap.add_argument("--plugin", default="", help="grpc_python_plugin path")
    a = ap.parse_args()
    generate(a.proto_dir, a.out, a.protoc, a.plugin)


if __name__ == "__main__":
    main()

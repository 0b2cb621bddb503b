"""Training checkpoints (docs/training.md, "Checkpoints"): the Python side of
clients/cpp/checkpoint.h, the same file format, readable by either client.

One safetensors file: every param and optimizer-state tensor by name
("w1", "opt/w1/m", ..., "opt/step"), and in `__metadata__` the format
("kiln.checkpoint"), format_version ("1"), the step, the training spec
(kiln.v1.TrainingSpec as protobuf JSON) and graph_sha256 (the SHA-256 of the
GraphSource's deterministic serialization), plus the caller's own keys.

The reader treats the file as hostile, as engine/io/safetensors.h does: a
header over 100 MiB or past the file, JSON that is not an object of objects,
an unknown dtype, bad shapes, offsets that do not match dtype x shape, run
past the data, overlap or leave gaps are refused with CheckpointError naming
the tensor and the field. Nothing is allocated from a size the file states
before that size is checked against the file's length.
"""

import hashlib
import json
import math
import os
import re
import tempfile

import numpy as np

from ._proto.kiln.v1 import train_pb2
from google.protobuf import json_format

FORMAT = "kiln.checkpoint"
VERSION = 1
MAX_HEADER_BYTES = 100 << 20
_OWN_KEYS = ("format", "format_version", "step", "training_spec", "graph_sha256")
_STEP = "opt/step"
_LSQ_SUFFIX = "/lsq_scale"  # QAT's learned weight scales (engine/passes/qat.h)
_COUNT = re.compile(r"[0-9]{1,18}")  # fits int64; no signs, spaces or other scripts' digits

# safetensors dtype names <-> numpy (bf16 as uint16 bit patterns, as _dtypes).
_NUMPY = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_NAME = {v.newbyteorder("="): k for k, v in _NUMPY.items() if k != "BF16"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the session."""


def graph_identity(source) -> str:
    """graph_sha256 of a kiln.v1.GraphSource (the C++ GraphIdentity)."""
    return hashlib.sha256(source.SerializeToString(deterministic=True)).hexdigest()


def spec_json(spec: train_pb2.TrainingSpec) -> str:
    return json_format.MessageToJson(spec, preserving_proto_field_name=True, indent=None)


def _differences(a, b, prefix=""):
    """'optimizer.lr: 0.01 -> 0.02' for each field where messages a and b differ."""
    out = []
    for field in a.DESCRIPTOR.fields:
        name = prefix + field.name
        va, vb = getattr(a, field.name), getattr(b, field.name)
        if field.message_type is not None and field.label != field.LABEL_REPEATED:
            if a.HasField(field.name) != b.HasField(field.name):
                out.append(f"{name}: {'set' if a.HasField(field.name) else 'unset'} -> "
                           f"{'set' if b.HasField(field.name) else 'unset'}")
            elif va != vb:
                out.extend(_differences(va, vb, name + "."))
            continue
        present = field.has_presence and field.label != field.LABEL_REPEATED
        if present and a.HasField(field.name) != b.HasField(field.name):
            out.append(f"{name}: {va if a.HasField(field.name) else 'unset'} -> "
                       f"{vb if b.HasField(field.name) else 'unset'}")
        elif va != vb:
            shown = (list(va), list(vb)) if field.label == field.LABEL_REPEATED else (va, vb)
            out.append(f"{name}: {shown[0]} -> {shown[1]}")
    return out


def write(path, tensors, metadata) -> None:
    """Writes {name: array} and {key: str} as safetensors at `path`,
    atomically (a temporary file in the same directory, fsync, rename).
    Tensors are laid out in name order; the header is padded with spaces to a
    multiple of 8 bytes."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        kind = _NAME.get(arr.dtype.newbyteorder("="))
        if kind is None:
            raise CheckpointError(f"tensor {name!r}: numpy dtype {arr.dtype} has no safetensors type")
        data = np.ascontiguousarray(arr, dtype=_NUMPY[kind]).tobytes()
        header[name] = {"dtype": kind, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    # Sorted keys, compact, UTF-8: the bytes the C++ writer (nlohmann::json) gives.
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()
    text += b" " * (-(8 + len(text)) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kiln-ckpt.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _int(value, what):
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{what} is not an integer")
    return value


def read(path, max_header_bytes=MAX_HEADER_BYTES):
    """({name: array}, {key: str}) of the safetensors file at `path`."""
    try:
        if not os.path.isfile(path):  # before open: a FIFO would block it
            if not os.path.exists(path):
                raise CheckpointError(f"checkpoint {path!r} does not exist")
            raise CheckpointError(f"checkpoint {path!r} is not a regular file")
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {e.strerror}") from None
    where = f"checkpoint {path!r}"
    if len(blob) < 8:
        raise CheckpointError(f"{where}: file is {len(blob)} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(blob[:8], "little")
    if n > max_header_bytes:
        raise CheckpointError(f"{where}: header of {n} bytes is over the limit of {max_header_bytes}")
    if n > len(blob) - 8:
        raise CheckpointError(f"{where}: header of {n} bytes runs past the end of the file "
                              f"({len(blob)} bytes)")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise CheckpointError(f"{where}: a name is given twice in the header")
        return dict(pairs)

    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{where}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{where}: __metadata__ is not an object of strings")
    spans, tensors = [], {}
    for name, e in header.items():
        t = f"{where}: tensor {name!r}"
        if not isinstance(e, dict):
            raise CheckpointError(f"{t} is not an object")
        kind = e.get("dtype")
        if kind not in _NUMPY:
            raise CheckpointError(f"{t}: dtype {kind!r} is unknown")
        shape = e.get("shape")
        offsets = e.get("data_offsets")
        if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            raise CheckpointError(f"{t}: shape or data_offsets is missing or not a list")
        for i, d in enumerate(shape):
            if _int(d, f"{t}: shape[{i}]") < 0:
                raise CheckpointError(f"{t}: shape[{i}] is negative")
        begin, end = (_int(o, f"{t}: data_offsets") for o in offsets)
        size = math.prod(shape) * _NUMPY[kind].itemsize
        if begin < 0 or end < begin:
            raise CheckpointError(f"{t}: data_offsets [{begin}, {end}] is not a range")
        if end > len(data):
            raise CheckpointError(f"{t}: data_offsets end {end} runs past the data buffer "
                                  f"({len(data)} bytes)")
        if end - begin != size:
            raise CheckpointError(f"{t}: data_offsets hold {end - begin} bytes, dtype x shape "
                                  f"needs {size}")
        spans.append((begin, end, name))
        tensors[name] = (kind, tuple(shape), begin, end)
    at, last = 0, None
    for begin, end, name in sorted(spans):
        if begin < at:
            raise CheckpointError(f"{where}: tensor {name!r} overlaps tensor {last!r}")
        if begin > at:
            raise CheckpointError(f"{where}: bytes {at}..{begin} of the data buffer belong to no tensor")
        at, last = end, name
    if at != len(data):
        raise CheckpointError(f"{where}: bytes {at}..{len(data)} of the data buffer belong to no tensor")
    out = {name: np.frombuffer(data[b:e], dtype=_NUMPY[k]).reshape(s).copy()
           for name, (k, s, b, e) in tensors.items()}
    return out, metadata


def save(session, path, extra=None) -> int:
    """Writes the session's params and optimizer state; returns the step."""
    extra = dict(extra or {})
    for key in _OWN_KEYS:
        if key in extra:
            raise CheckpointError(f"checkpoint metadata key {key!r} is Kiln's own")
    values = session.get_params()
    step = 0
    if _STEP in values:
        step = int(np.asarray(values[_STEP]).reshape(()))
    else:
        values[_STEP] = np.array(0, np.int64)
    extra.update(format=FORMAT, format_version=str(VERSION), step=str(step),
                 training_spec=spec_json(session.spec), graph_sha256=session.graph_sha256)
    write(path, values, extra)
    return step


def check(path, spec, graph_sha256, signature):
    """Reads and checks the checkpoint at `path` against a training session's
    spec, graph identity and signature; returns (tensors to upload, metadata).
    Raises CheckpointError naming what does not fit."""
    tensors, meta = read(path)
    where = f"checkpoint {path!r}"

    def get(key):
        if key not in meta:
            raise CheckpointError(f"{where}: the metadata has no {key!r} (not a Kiln checkpoint, "
                                  f"or a damaged one)")
        return meta[key]

    if get("format") != FORMAT:
        raise CheckpointError(f"{where}: format is {meta['format']!r}, not {FORMAT!r}")
    version = get("format_version")
    if not _COUNT.fullmatch(version) or int(version) < 1:
        raise CheckpointError(f"{where}: format_version {version[:40]!r} is not a positive integer")
    if int(version) > VERSION:
        raise CheckpointError(f"{where}: format_version {version} is newer than this client "
                              f"reads ({VERSION}): upgrade the client")
    step_text = get("step")
    if not _COUNT.fullmatch(step_text):
        raise CheckpointError(f"{where}: step {step_text[:40]!r} is not a non-negative integer")
    step = int(step_text)
    saved = train_pb2.TrainingSpec()
    try:
        json_format.Parse(get("training_spec"), saved)
    except json_format.ParseError as e:
        raise CheckpointError(f"{where}: training_spec is not a kiln.v1.TrainingSpec in JSON: {e}") from None
    if saved != spec:
        raise CheckpointError(f"{where}: it was saved with another training spec (saved -> now: "
                              f"{'; '.join(_differences(saved, spec))}); resume with the same "
                              f"loss, params, optimizer and schedule")
    if get("graph_sha256") != graph_sha256:
        raise CheckpointError(f"{where}: it was saved from another graph (graph_sha256 "
                              f"{meta['graph_sha256'][:16]}..., this one {graph_sha256[:16]}...)")
    from ._dtypes import numpy_dtype
    declared = set()
    for e in signature.params:
        declared.add(e.name)
        if e.name not in tensors:
            raise CheckpointError(f"{where}: it has no tensor for param {e.name!r}")
        arr = tensors[e.name]
        dims = [d.size if d.HasField("size") else None for d in e.type.dims]
        fits = arr.dtype == numpy_dtype(e.type.dtype) and len(dims) == arr.ndim and all(
            d is None or d == s for d, s in zip(dims, arr.shape))
        if not fits:
            raise CheckpointError(f"{where}: param {e.name!r} is {arr.dtype}{list(arr.shape)} in "
                                  f"the file, {numpy_dtype(e.type.dtype)}{dims} in the graph")
    has_state = False
    for name in tensors:
        if name in declared:
            continue
        if name.endswith(_LSQ_SUFFIX) and name[:-len(_LSQ_SUFFIX)] in declared:
            # A QAT run's learned weight scale (kiln.Qat(lsq=True)): trained
            # state as the optimizer's is; kilnd checks its shape.
            if tensors[name].dtype != np.float32:
                raise CheckpointError(f"{where}: {name!r} is {tensors[name].dtype}, not float32")
            has_state = True
            continue
        if not name.startswith("opt/"):
            raise CheckpointError(f"{where}: tensor {name!r} is neither a param of the graph nor "
                                  f"optimizer state")
        has_state = has_state or name != _STEP
    s = tensors.get(_STEP)
    if s is None or s.dtype != np.int64 or s.shape != ():
        raise CheckpointError(f"{where}: " + ("it has no opt/step tensor" if s is None else
                                              f"opt/step is {s.dtype}{list(s.shape)}, not int64[]"))
    if int(s) != step:
        raise CheckpointError(f"{where}: opt/step holds {int(s)} but the metadata's step is {step}")
    if step == 0 and not has_state:
        del tensors[_STEP]  # never stepped: a fresh run from these params
    return tensors, meta

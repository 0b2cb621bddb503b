"""Run requests and responses on the wire with one copy of tensor data each
way (issue 12, items 2 and 6; docs/clients.md, "Tensor bytes on the wire").

protobuf's Python API copies a `bytes` field on every set and every get: an
input went numpy -> bytes -> message -> serialized string (three copies) and
an output serialized string -> message -> bytes -> numpy (three more). Here a
request's tensors are written into the request bytes straight from the
arrays' memory (one copy, by bytes.join), and a large response's outputs are
read-only numpy views over the response bytes grpcio hands back (no copy).
The rest of each message (session id, report, request id) still goes through
the generated protobuf classes. The encoding is protobuf's wire format for
kiln.v1.NamedTensor; tests check it against protobuf both ways.
"""

import numpy as np
from google.protobuf.message import DecodeError

from . import _dtypes
from ._proto.kiln.v1 import service_pb2

# RunRequest.inputs / params, RunResponse.outputs (proto/kiln/v1/service.proto).
INPUTS, PARAMS, OUTPUTS = 4, 5, 1
# Smaller responses are parsed by protobuf (fewer Python steps for tiny ones);
# their outputs are views too.
HAND_PARSE_MIN_BYTES = 16 << 10

_SMALL_VARINTS = [bytes([i]) for i in range(128)]
_KIND = {}  # numpy dtype -> kiln dtype, as _dtypes.dtype() finds it


class WireError(ValueError):
    """Bytes that are not the message they should be."""


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def named_tensor(field: int, name: str, value) -> list:
    """Field `field` holding NamedTensor{name, Tensor{dtype, dims, data}} as
    protobuf encodes it: a list of bytes-like pieces, the data a view of the
    array's memory (copied once when the pieces are joined)."""
    arr = value if type(value) is np.ndarray else np.asarray(value)
    kd = _KIND.get(arr.dtype)
    if kd is None:
        kd = _KIND.setdefault(arr.dtype, _dtypes.dtype(arr.dtype))
    wire = _dtypes._NUMPY[kd]
    if arr.dtype != wire or not arr.flags.c_contiguous:
        arr = np.asarray(arr, dtype=wire, order="C")  # keeps 0-d
    head = b"\x08" + _varint(kd) if kd else b""
    if arr.ndim:
        dims = b"".join(_varint(d) for d in arr.shape)
        head += b"\x12" + _varint(len(dims)) + dims
    nbytes = arr.nbytes
    tensor_len = len(head) + (1 + len(_varint(nbytes)) + nbytes if nbytes else 0)
    encoded_name = name.encode()
    named = (b"\x0a" + _varint(len(encoded_name)) + encoded_name if encoded_name else b"") + \
        b"\x12" + _varint(tensor_len)
    prefix = _varint(field << 3 | 2) + _varint(len(named) + tensor_len) + named + head
    if not nbytes:
        return [prefix]
    return [prefix + b"\x1a" + _varint(nbytes), memoryview(arr.reshape(-1).view(np.uint8))]


def run_request(head: service_pb2.RunRequest, inputs, params) -> bytes:
    """`head` (no inputs or params of its own) serialized with `inputs` and
    `params` ({name: array}) added: one copy of each array."""
    pieces = [head.SerializeToString()]
    for field, tensors in ((INPUTS, inputs), (PARAMS, params)):
        for name, value in (tensors or {}).items():
            pieces += named_tensor(field, name, value)
    return b"".join(pieces)


def _read_varint(buf, pos: int, end: int):
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("a varint runs past its field")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _skip(buf, pos: int, end: int, wire_type: int) -> int:
    if wire_type == 0:
        return _read_varint(buf, pos, end)[1]
    if wire_type == 1:
        pos += 8
    elif wire_type == 2:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    elif wire_type == 5:
        pos += 4
    else:
        raise WireError(f"wire type {wire_type} is not supported here")
    if pos > end:
        raise WireError("a field runs past its message")
    return pos


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _tensor_view(buf, pos: int, end: int):
    """A kiln.v1.Tensor in buf[pos:end] as a read-only array over `buf`."""
    kd, dims, data, data_len = 0, [], pos, 0
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        field, wire_type = tag >> 3, tag & 7
        if field == 1 and wire_type == 0:
            v, pos = _read_varint(buf, pos, end)
            kd = _int64(v)
        elif field == 2 and wire_type == 2:
            n, pos = _read_varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                raise WireError("a tensor's dims run past it")
            while pos < stop:
                v, pos = _read_varint(buf, pos, stop)
                dims.append(_int64(v))
        elif field == 2 and wire_type == 0:
            v, pos = _read_varint(buf, pos, end)
            dims.append(_int64(v))
        elif field == 3 and wire_type == 2:
            data_len, pos = _read_varint(buf, pos, end)
            data = pos
            pos += data_len
            if pos > end:
                raise WireError("a tensor's data runs past it")
        else:
            pos = _skip(buf, pos, end, wire_type)
    return _dtypes.view_bytes(buf, kd, dims, data, data_len)


def _parse_response(buf) -> service_pb2.RunResponse:
    try:
        return service_pb2.RunResponse.FromString(buf)
    except DecodeError as e:
        raise WireError(str(e)) from None


def run_response(buf: bytes):
    """A serialized kiln.v1.RunResponse: ({output name: read-only array},
    RunResponse without its outputs). WireError (a ValueError) when `buf`
    is not one."""
    if len(buf) < HAND_PARSE_MIN_BYTES:
        resp = _parse_response(buf)
        outputs = {o.name: _dtypes.view_proto(o.tensor) for o in resp.outputs}
        return outputs, resp
    outputs, rest, pos, end = {}, [], 0, len(buf)
    while pos < end:
        start = pos
        tag, pos = _read_varint(buf, pos, end)
        field, wire_type = tag >> 3, tag & 7
        if field != OUTPUTS or wire_type != 2:
            pos = _skip(buf, pos, end, wire_type)
            rest.append(buf[start:pos])
            continue
        n, pos = _read_varint(buf, pos, end)
        stop = pos + n
        if stop > end:
            raise WireError("an output runs past the message")
        name, array = "", None
        while pos < stop:
            tag, pos = _read_varint(buf, pos, stop)
            f, wt = tag >> 3, tag & 7
            if f == 1 and wt == 2:
                k, pos = _read_varint(buf, pos, stop)
                name = bytes(buf[pos:pos + k]).decode()
                pos += k
            elif f == 2 and wt == 2:
                k, pos = _read_varint(buf, pos, stop)
                if pos + k > stop:
                    raise WireError("an output's tensor runs past it")
                array = _tensor_view(buf, pos, pos + k)
                pos += k
            else:
                pos = _skip(buf, pos, stop, wt)
        if pos != stop:
            raise WireError("an output's fields run past it")
        outputs[name] = array if array is not None else _dtypes.view_bytes(buf, 0, [], 0, 0)
    return outputs, _parse_response(b"".join(rest))

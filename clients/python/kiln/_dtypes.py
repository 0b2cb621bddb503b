"""NumPy dtypes <-> kiln.v1.DType, and ndarray <-> kiln.v1.Tensor.

NumPy has no bfloat16: a kiln bf16 tensor travels as a uint16 array of bit
patterns (kiln has no u16 type, so the mapping is unambiguous). Convert with
`f32_to_bf16` / `bf16_to_f32`.
"""

import math

import numpy as np

from ._proto.kiln.v1 import tensor_pb2

_BY_NAME = {
    "f32": tensor_pb2.DTYPE_F32,
    "f16": tensor_pb2.DTYPE_F16,
    "bf16": tensor_pb2.DTYPE_BF16,
    "f64": tensor_pb2.DTYPE_F64,
    "i8": tensor_pb2.DTYPE_I8,
    "u8": tensor_pb2.DTYPE_U8,
    "i16": tensor_pb2.DTYPE_I16,
    "i32": tensor_pb2.DTYPE_I32,
    "i64": tensor_pb2.DTYPE_I64,
    "bool": tensor_pb2.DTYPE_BOOL,
    # GGUF block-quantized weights: params only (a repository model's GGUF
    # file), consumed by dequant_matmul; no numpy equivalent.
    "q8_0": tensor_pb2.DTYPE_Q8_0,
    "q4_0": tensor_pb2.DTYPE_Q4_0,
    "q4_k": tensor_pb2.DTYPE_Q4_K,
    "q5_k": tensor_pb2.DTYPE_Q5_K,
    "q6_k": tensor_pb2.DTYPE_Q6_K,
}
_NAME_OF = {v: k for k, v in _BY_NAME.items()}

_NUMPY = {
    tensor_pb2.DTYPE_F32: np.dtype("<f4"),
    tensor_pb2.DTYPE_F16: np.dtype("<f2"),
    tensor_pb2.DTYPE_BF16: np.dtype("<u2"),
    tensor_pb2.DTYPE_F64: np.dtype("<f8"),
    tensor_pb2.DTYPE_I8: np.dtype("i1"),
    tensor_pb2.DTYPE_U8: np.dtype("u1"),
    tensor_pb2.DTYPE_I16: np.dtype("<i2"),
    tensor_pb2.DTYPE_I32: np.dtype("<i4"),
    tensor_pb2.DTYPE_I64: np.dtype("<i8"),
    tensor_pb2.DTYPE_BOOL: np.dtype("?"),
}
_FROM_NUMPY = {np.dtype(v).newbyteorder("="): k for k, v in _NUMPY.items()}


def dtype(x) -> int:
    """The kiln.v1.DType of `x`: a DType value, a name ("f32", "bf16"), or
    anything numpy.dtype() accepts (np.float32, "float32", an array's dtype)."""
    if isinstance(x, int) and not isinstance(x, bool) and x in _NAME_OF:
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        nd = np.dtype(x).newbyteorder("=")
    except TypeError:
        raise TypeError(f"not a dtype: {x!r}") from None
    if nd in _FROM_NUMPY:
        return _FROM_NUMPY[nd]
    raise TypeError(f"numpy dtype {nd} has no kiln equivalent "
                    f"(kiln has {', '.join(_BY_NAME)}; uint16 stands for bf16)")


def dtype_name(dt) -> str:
    return _NAME_OF.get(dtype(dt), str(dt))


def numpy_dtype(dt) -> np.dtype:
    """The numpy dtype that holds kiln dtype `dt` (uint16 for bf16)."""
    d = dtype(dt)
    if d not in _NUMPY:
        raise TypeError(f"kiln dtype {tensor_pb2.DType.Name(d)} has no numpy equivalent")
    return _NUMPY[d]


def to_proto(value, out=None) -> tensor_pb2.Tensor:
    """A numpy array (or anything np.asarray takes) as a kiln.v1.Tensor."""
    arr = np.asarray(value)
    kd = dtype(arr.dtype)
    wire = _NUMPY[kd]
    arr = np.asarray(arr, dtype=wire, order="C")  # keeps 0-d (ascontiguousarray would not)
    t = out if out is not None else tensor_pb2.Tensor()
    t.dtype = kd
    del t.dims[:]
    t.dims.extend(arr.shape)
    t.data = arr.tobytes()
    return t


def from_proto(t: tensor_pb2.Tensor) -> np.ndarray:
    """A kiln.v1.Tensor as a (writable) numpy array."""
    nd = numpy_dtype(t.dtype)
    arr = np.frombuffer(t.data, dtype=nd)
    shape = tuple(t.dims)
    # math.prod on the dims, not np.prod: numpy's reduction costs ~15 us a call,
    # a tenth of a tiny Run (bench/python_client_overhead.py).
    if arr.size != math.prod(shape):
        raise ValueError(f"tensor data holds {arr.size} elements, dims {list(shape)} need "
                         f"{math.prod(shape)}")
    return arr.reshape(shape).copy()


def view_bytes(buf, kd, dims, offset: int, nbytes: int) -> np.ndarray:
    """The `nbytes` at `offset` in `buf` as a read-only array of kiln dtype
    `kd` and shape `dims`, without a copy (the array keeps `buf` alive)."""
    nd = numpy_dtype(kd)
    shape = tuple(dims)
    count = math.prod(shape)
    if count < 0 or count * nd.itemsize != nbytes:
        raise ValueError(f"tensor data holds {nbytes} bytes, dims {list(shape)} of "
                         f"{dtype_name(kd)} need {max(count, 0) * nd.itemsize}")
    if count == 0:
        arr = np.empty(shape, dtype=nd)
        arr.flags.writeable = False
        return arr
    return np.frombuffer(buf, dtype=nd, count=count, offset=offset).reshape(shape)


def view_proto(t: tensor_pb2.Tensor) -> np.ndarray:
    """A kiln.v1.Tensor as a read-only array over its data (one copy: the
    bytes protobuf hands out)."""
    data = t.data
    return view_bytes(data, t.dtype, t.dims, 0, len(data))


def f32_to_bf16(x) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even."""
    b = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    nan = np.isnan(b.view(np.float32))
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return np.where(nan, (b >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_to_f32(x) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)

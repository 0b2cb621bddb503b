"""kiln.Graph: builds a kiln.v1.Graph op by op, and kiln.parse for `.kiln` text.

The builder follows clients/cpp/graph_builder.cc (the C++ kiln::GraphBuilder) so a
graph reads the same in both languages and yields the same proto: ir_version 1,
node ids in call order from 0, every op's attribute message set (with the
builder's explicit defaults, e.g. softmax axis -1, layer_norm epsilon 1e-5).
The builder records; kilnd verifies and names the offending node on failure.

Values support Python operators (+ - * / @, unary -) besides g.add(...);
a Python number or numpy array operand becomes a constant of the other
operand's dtype.
"""

import numbers
import re

import numpy as np

from . import _dtypes
from ._proto.kiln.v1 import graph_pb2, service_pb2, tensor_pb2

IR_VERSION = 1


def _enum(enum_type, prefix: str, value):
    """An enum value from a lower-case name without the prefix ("causal"), the
    full name ("MASK_CAUSAL"), or the number."""
    if isinstance(value, int):
        return value
    name = str(value).upper()
    for candidate in (name, prefix + name):
        if candidate in enum_type.keys():
            return enum_type.Value(candidate)
    names = sorted(k[len(prefix):].lower() for k in enum_type.keys() if k.startswith(prefix))
    raise ValueError(f"unknown {prefix.rstrip('_').lower()} kind {value!r}; one of {names}")


class Value:
    """One result of a node: (node id, output index), with its dtype when the
    builder can tell (for scalar constants)."""

    __slots__ = ("graph", "node", "output", "dtype")

    def __init__(self, graph, node: int, output: int = 0, dtype=None):
        self.graph, self.node, self.output, self.dtype = graph, node, output, dtype

    def __repr__(self):
        return f"Value(node={self.node}, output={self.output})"

    def __add__(self, o): return self.graph.add(self, o)
    def __radd__(self, o): return self.graph.add(o, self)
    def __sub__(self, o): return self.graph.sub(self, o)
    def __rsub__(self, o): return self.graph.sub(o, self)
    def __mul__(self, o): return self.graph.mul(self, o)
    def __rmul__(self, o): return self.graph.mul(o, self)
    def __truediv__(self, o): return self.graph.div(self, o)
    def __rtruediv__(self, o): return self.graph.div(o, self)
    def __matmul__(self, o): return self.graph.matmul(self, o)
    def __rmatmul__(self, o): return self.graph.matmul(o, self)
    def __neg__(self): return self.graph.neg(self)


_UNARY = ["identity", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log",
          "sqrt", "rsqrt", "neg", "abs", "sin", "cos", "erf", "floor", "ceil", "round", "sign",
          "reciprocal", "softplus"]


class Graph:
    """Builds a kiln.v1.Graph. Not thread-safe."""

    def __init__(self, name: str = "graph"):
        self._g = graph_pb2.Graph(name=name, ir_version=IR_VERSION)
        self._dtypes = {}  # node id -> kiln dtype, where known

    # -- plumbing ---------------------------------------------------------
    def _add(self, op: int, operands, dtype=None) -> graph_pb2.Node:
        values = [self._value(v) for v in operands]  # constants first: ids stay in call order
        n = self._g.nodes.add(id=len(self._g.nodes), op=op)
        for v in values:
            n.operands.add(node=v.node, output=v.output)
        if dtype is None:
            dtype = next((self._dtypes[v.node] for v in values if v.node in self._dtypes), None)
        if dtype is not None:
            self._dtypes[n.id] = dtype
        return n

    def _last(self) -> Value:
        nid = len(self._g.nodes) - 1
        return Value(self, nid, 0, self._dtypes.get(nid))

    def _value(self, v, like=None) -> Value:
        if isinstance(v, Value):
            if v.graph is not self:
                raise ValueError("a Value from another graph")
            return v
        dt = like.dtype if isinstance(like, Value) and like.dtype is not None else None
        if isinstance(v, numbers.Number):
            return self.scalar(v, dt if dt is not None else "f32")
        if isinstance(v, np.ndarray):
            return self.constant(v if dt is None else v.astype(_dtypes.numpy_dtype(dt)))
        raise TypeError(f"expected a kiln Value, a number or a numpy array, got {type(v).__name__}")

    def _pair(self, a, b):
        if not isinstance(a, Value):
            a = self._value(a, like=b)
        if not isinstance(b, Value):
            b = self._value(b, like=a)
        return a, b

    def named(self, name: str) -> "Graph":
        """Names the most recently added node (shown in reports)."""
        if self._g.nodes:
            self._g.nodes[-1].name = name
        return self

    def proto(self) -> graph_pb2.Graph:
        """A copy of the graph built so far."""
        g = graph_pb2.Graph()
        g.CopyFrom(self._g)
        return g

    @property
    def name(self) -> str:
        return self._g.name

    def __repr__(self):
        return f"kiln.Graph({self._g.name!r}, {len(self._g.nodes)} nodes, {len(self._g.outputs)} outputs)"

    # -- sources ----------------------------------------------------------
    def input(self, name: str, dtype, dims) -> Value:
        """An input; dims are ints or symbol strings ("batch", "?")."""
        kd = _dtypes.dtype(dtype)
        n = self._add(graph_pb2.OP_INPUT, [], kd)
        n.name = name
        n.attrs.input.SetInParent()
        t = n.outputs.add(dtype=kd)
        for d in dims:
            if isinstance(d, str):
                t.dims.add(symbol=d)
            else:
                t.dims.add(size=int(d))
        return self._last()

    def param(self, name: str, dtype, dims, frozen: bool = False) -> Value:
        kd = _dtypes.dtype(dtype)
        n = self._add(graph_pb2.OP_PARAM, [], kd)
        n.name = name
        n.attrs.param.frozen = frozen
        t = n.outputs.add(dtype=kd)
        for d in dims:
            t.dims.add(size=int(d))
        return self._last()

    def constant(self, value, name: str = "") -> Value:
        arr = np.asarray(value)
        n = self._add(graph_pb2.OP_CONSTANT, [], _dtypes.dtype(arr.dtype))
        n.name = name
        _dtypes.to_proto(arr, n.attrs.constant.value)
        return self._last()

    def scalar(self, value, dtype="f32") -> Value:
        return self.constant(np.array(value, dtype=_dtypes.numpy_dtype(dtype)))

    # -- elementwise ------------------------------------------------------
    def activation(self, kind, x) -> Value:
        kind = _enum(graph_pb2.UnaryKind, "UNARY_", kind)
        self._add(graph_pb2.OP_UNARY, [x]).attrs.unary.kind = kind
        return self._last()

    def binary(self, kind, a, b) -> Value:
        kind = _enum(graph_pb2.BinaryKind, "BINARY_", kind)
        a, b = self._pair(a, b)
        self._add(graph_pb2.OP_BINARY, [a, b]).attrs.binary.kind = kind
        return self._last()

    def add(self, a, b): return self.binary(graph_pb2.BINARY_ADD, a, b)
    def sub(self, a, b): return self.binary(graph_pb2.BINARY_SUB, a, b)
    def mul(self, a, b): return self.binary(graph_pb2.BINARY_MUL, a, b)
    def div(self, a, b): return self.binary(graph_pb2.BINARY_DIV, a, b)
    def maximum(self, a, b): return self.binary(graph_pb2.BINARY_MAX, a, b)
    def minimum(self, a, b): return self.binary(graph_pb2.BINARY_MIN, a, b)
    def pow(self, a, b): return self.binary(graph_pb2.BINARY_POW, a, b)

    def compare(self, kind, a, b) -> Value:
        kind = _enum(graph_pb2.CompareKind, "COMPARE_", kind)
        a, b = self._pair(a, b)
        self._add(graph_pb2.OP_COMPARE, [a, b], tensor_pb2.DTYPE_BOOL).attrs.compare.kind = kind
        return self._last()

    def where(self, cond, a, b) -> Value:
        a, b = self._pair(a, b)
        n = self._add(graph_pb2.OP_WHERE, [cond, a, b], a.dtype)
        n.attrs.where.SetInParent()
        return self._last()

    def cast(self, x, to) -> Value:
        kd = _dtypes.dtype(to)
        self._add(graph_pb2.OP_CAST, [x], kd).attrs.cast.to = kd
        return self._last()

    def clamp(self, x, min=None, max=None) -> Value:  # noqa: A002 (mirrors the C++ names)
        a = self._add(graph_pb2.OP_CLAMP, [x]).attrs.clamp
        a.SetInParent()
        if min is not None:
            a.min = float(min)
        if max is not None:
            a.max = float(max)
        return self._last()

    # -- linear algebra ---------------------------------------------------
    def matmul(self, a, b, transpose_a: bool = False, transpose_b: bool = False) -> Value:
        a, b = self._pair(a, b)
        m = self._add(graph_pb2.OP_MATMUL, [a, b]).attrs.matmul
        m.transpose_a, m.transpose_b = transpose_a, transpose_b
        m.SetInParent()
        return self._last()

    def dot_general(self, a, b, lhs_contracting, rhs_contracting, lhs_batch=(), rhs_batch=()):
        d = self._add(graph_pb2.OP_DOT_GENERAL, [a, b]).attrs.dot_general
        d.lhs_contracting.extend(lhs_contracting)
        d.rhs_contracting.extend(rhs_contracting)
        d.lhs_batch.extend(lhs_batch)
        d.rhs_batch.extend(rhs_batch)
        d.SetInParent()
        return self._last()

    # -- normalization and attention --------------------------------------
    def softmax(self, x, axis: int = -1) -> Value:
        self._add(graph_pb2.OP_SOFTMAX, [x]).attrs.softmax.axis = axis
        return self._last()

    def log_softmax(self, x, axis: int = -1) -> Value:
        self._add(graph_pb2.OP_LOG_SOFTMAX, [x]).attrs.log_softmax.axis = axis
        return self._last()

    def layer_norm(self, x, scale=None, bias=None, epsilon: float = 1e-5, axis: int = -1):
        ops = [x] + [v for v in (scale, bias) if v is not None]
        a = self._add(graph_pb2.OP_LAYER_NORM, ops).attrs.layer_norm
        a.epsilon, a.axis = epsilon, axis
        return self._last()

    def rms_norm(self, x, scale=None, epsilon: float = 1e-6, axis: int = -1) -> Value:
        ops = [x] + ([scale] if scale is not None else [])
        a = self._add(graph_pb2.OP_RMS_NORM, ops).attrs.rms_norm
        a.epsilon, a.axis = epsilon, axis
        return self._last()

    def rope(self, x, positions=None, theta=None, interleaved=False, rotary_dim=0,
             position_offset=0) -> Value:
        ops = [x] + ([positions] if positions is not None else [])
        a = self._add(graph_pb2.OP_ROPE, ops).attrs.rope
        a.SetInParent()
        if theta is not None:
            a.theta = theta
        a.interleaved, a.rotary_dim, a.position_offset = interleaved, rotary_dim, position_offset
        return self._last()

    def attention(self, q, k, v, mask="none", scale=None, softcap=0.0, prefix=0, window=0,
                  heads=0, kv_heads=0, mask_operand=None) -> Value:
        """q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D]. `mask`: none, causal, prefix,
        bidirectional, sliding_window, custom or bias (the last two read
        `mask_operand`)."""
        mask = _enum(graph_pb2.MaskKind, "MASK_", mask)
        ops = [q, k, v] + ([mask_operand] if mask_operand is not None else [])
        a = self._add(graph_pb2.OP_ATTENTION, ops).attrs.attention
        a.SetInParent()
        a.mask = mask
        if scale is not None:
            a.scale = scale
        a.softcap, a.prefix, a.window, a.heads, a.kv_heads = softcap, prefix, window, heads, kv_heads
        return self._last()

    # -- shape ------------------------------------------------------------
    def reshape(self, x, shape) -> Value:
        a = self._add(graph_pb2.OP_RESHAPE, [x]).attrs.reshape
        a.SetInParent()
        a.shape.extend(int(d) for d in shape)
        return self._last()

    def transpose(self, x, perm) -> Value:
        a = self._add(graph_pb2.OP_TRANSPOSE, [x]).attrs.transpose
        a.SetInParent()
        a.perm.extend(int(p) for p in perm)
        return self._last()

    def slice(self, x, start, stop, step=(), axes=()) -> Value:
        a = self._add(graph_pb2.OP_SLICE, [x]).attrs.slice
        a.SetInParent()
        a.start.extend(start)
        a.stop.extend(stop)
        a.step.extend(step)
        a.axes.extend(axes)
        return self._last()

    def concat(self, xs, axis: int) -> Value:
        self._add(graph_pb2.OP_CONCAT, list(xs)).attrs.concat.axis = axis
        self._g.nodes[-1].attrs.concat.SetInParent()
        return self._last()

    def expand(self, x, shape) -> Value:
        a = self._add(graph_pb2.OP_EXPAND, [x]).attrs.expand
        a.SetInParent()
        a.shape.extend(int(d) for d in shape)
        return self._last()

    def pad(self, x, low, high, value: float = 0.0, mode="constant") -> Value:
        mode = _enum(graph_pb2.PadMode, "PAD_", mode)
        a = self._add(graph_pb2.OP_PAD, [x]).attrs.pad
        a.low.extend(low)
        a.high.extend(high)
        a.value = value
        a.mode = mode
        a.SetInParent()
        return self._last()

    def gather(self, x, indices, axis: int = 0) -> Value:
        self._add(graph_pb2.OP_GATHER, [x, indices]).attrs.gather.axis = axis
        self._g.nodes[-1].attrs.gather.SetInParent()
        return self._last()

    def reduce(self, kind, x, axes=(), keepdims: bool = False) -> Value:
        """Reduces over `axes` (an int or a sequence; empty = all)."""
        if isinstance(axes, int):
            axes = (axes,)
        kind = _enum(graph_pb2.ReduceKind, "REDUCE_", kind)
        a = self._add(graph_pb2.OP_REDUCE, [x]).attrs.reduce
        a.kind = kind
        a.axes.extend(axes)
        a.keepdims = keepdims
        return self._last()

    def reduce_sum(self, x, axes=(), keepdims=False): return self.reduce("sum", x, axes, keepdims)
    def reduce_mean(self, x, axes=(), keepdims=False): return self.reduce("mean", x, axes, keepdims)
    def reduce_max(self, x, axes=(), keepdims=False): return self.reduce("max", x, axes, keepdims)
    def reduce_min(self, x, axes=(), keepdims=False): return self.reduce("min", x, axes, keepdims)
    def reduce_prod(self, x, axes=(), keepdims=False): return self.reduce("prod", x, axes, keepdims)

    def argmax(self, x, axis: int, keepdims: bool = False) -> Value:
        a = self._add(graph_pb2.OP_ARGMAX, [x], tensor_pb2.DTYPE_I64).attrs.argmax
        a.axis, a.keepdims = axis, keepdims
        a.SetInParent()
        return self._last()

    def dequant_matmul(self, x, w, transpose_b: bool = False) -> Value:
        """x [..., K] @ a block-quantized param w ([K, N], or [N, K] with
        transpose_b: a GGUF matrix as the repository reads it)."""
        a = self._add(graph_pb2.OP_DEQUANT_MATMUL, [x, w], self._value(x).dtype).attrs.dequant_matmul
        a.SetInParent()
        a.transpose_b = transpose_b
        return self._last()

    def cumsum(self, x, axis: int, exclusive: bool = False, reverse: bool = False) -> Value:
        a = self._add(graph_pb2.OP_CUMSUM, [x]).attrs.cumsum
        a.axis, a.exclusive, a.reverse = axis, exclusive, reverse
        a.SetInParent()
        return self._last()

    # -- vision -----------------------------------------------------------
    def conv(self, x, w, bias=None, stride=(), dilation=(), pad_low=(), pad_high=(), groups=0):
        ops = [x, w] + ([bias] if bias is not None else [])
        a = self._add(graph_pb2.OP_CONV, ops).attrs.conv
        a.SetInParent()
        a.stride.extend(stride)
        a.dilation.extend(dilation)
        a.pad_low.extend(pad_low)
        a.pad_high.extend(pad_high)
        a.groups = groups
        return self._last()

    def pool(self, x, kind, window, stride=(), pad_low=(), pad_high=(),
             count_include_pad=False) -> Value:
        kind = _enum(graph_pb2.PoolKind, "POOL_", kind)
        a = self._add(graph_pb2.OP_POOL, [x]).attrs.pool
        a.kind = kind
        a.window.extend(window)
        a.stride.extend(stride)
        a.pad_low.extend(pad_low)
        a.pad_high.extend(pad_high)
        a.count_include_pad = count_include_pad
        return self._last()

    # -- losses -----------------------------------------------------------
    def softmax_cross_entropy(self, logits, labels, reduction="mean") -> Value:
        reduction = _enum(graph_pb2.Reduction, "REDUCTION_", reduction)
        a = self._add(graph_pb2.OP_SOFTMAX_CROSS_ENTROPY, [logits, labels]).attrs
        a.softmax_cross_entropy.reduction = reduction
        a.softmax_cross_entropy.SetInParent()
        return self._last()

    def mean_squared_error(self, pred, target, reduction="mean") -> Value:
        reduction = _enum(graph_pb2.Reduction, "REDUCTION_", reduction)
        a = self._add(graph_pb2.OP_MEAN_SQUARED_ERROR, [pred, target]).attrs
        a.mean_squared_error.reduction = reduction
        a.mean_squared_error.SetInParent()
        return self._last()

    # -- any op -----------------------------------------------------------
    def node(self, op, operands, attrs: graph_pb2.Attrs = None, name: str = "") -> Value:
        """The escape hatch: any OpKind with its attribute message."""
        n = self._add(_enum(graph_pb2.OpKind, "OP_", op), list(operands))
        if attrs is not None:
            n.attrs.CopyFrom(attrs)
        n.name = name
        return self._last()

    def output(self, name: str, v: Value) -> None:
        v = self._value(v)
        self._g.outputs.add(name=name, value=graph_pb2.ValueRef(node=v.node, output=v.output))


def _unary_method(kind):
    def method(self, x):
        return self.activation(kind, x)
    method.__name__ = kind
    method.__doc__ = f"UNARY_{kind.upper()} of x."
    return method


for _kind in _UNARY:
    setattr(Graph, _kind, _unary_method(_kind))


class ParsedGraph:
    """A graph in the `.kiln` text form. Sent to kilnd as GraphSource.text;
    kilnd parses and verifies it (verify() asks it now)."""

    def __init__(self, text: str):
        self.text = text
        m = re.search(r'^\s*graph\s+"([^"]*)"', text, re.M)
        self.name = m.group(1) if m else ""

    def source(self) -> service_pb2.GraphSource:
        return service_pb2.GraphSource(text=self.text)

    def verify(self, client=None) -> service_pb2.Signature:
        """Has kilnd parse and verify the text; returns its signature or
        raises kiln.KilnError naming the line and problem."""
        from .client import default_client
        return (client or default_client()).compile(self).signature

    def __repr__(self):
        return f"kiln.ParsedGraph({self.name!r}, {len(self.text.splitlines())} lines)"


def parse(text: str) -> ParsedGraph:
    """A `.kiln` text graph, for Client.compile/create_session/run."""
    if not isinstance(text, str):
        raise TypeError(f"kiln.parse takes the graph text as str, got {type(text).__name__}")
    return ParsedGraph(text)


def model(name: str, version: int = 0) -> service_pb2.GraphSource:
    """A model of the server's repository (kilnd --model_repository), as a
    graph for create_session: its weights are the server's, shared by every
    session on it. `version` 0 is the newest ready one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a model name is a non-empty string, got {name!r}")
    if int(version) < 0:
        raise ValueError(f"a model version is >= 0 (0 = the newest), got {version}")
    return service_pb2.GraphSource(model=service_pb2.ModelRef(name=name, version=int(version)))


def graph_source(graph) -> service_pb2.GraphSource:
    """A GraphSource from a kiln.Graph, ParsedGraph, kiln.v1.Graph or GraphSource."""
    if isinstance(graph, Graph):
        return service_pb2.GraphSource(graph=graph._g)
    if isinstance(graph, ParsedGraph):
        return graph.source()
    if isinstance(graph, graph_pb2.Graph):
        return service_pb2.GraphSource(graph=graph)
    if isinstance(graph, service_pb2.GraphSource):
        return graph
    raise TypeError(f"expected a kiln.Graph, kiln.parse(...) result or kiln.v1.Graph, got "
                    f"{type(graph).__name__}")

"""The lazy NumPy-style Tensor DSL.

    a = kiln.tensor(np.ones((2, 3), np.float32))
    y = (a + b).relu() @ w          # records; nothing runs yet
    y.numpy()                       # builds the graph, compiles and runs it on kilnd

Operations record a node and check shapes and dtypes eagerly (so mistakes
surface at the line that makes them); `.numpy()` lowers everything the tensor
depends on into one kiln.v1.Graph and runs it once through kilnd (the default
client: kiln.connect(addr), else $KILN_ADDR). Captured arrays travel as the
run's one-shot params (named c0, c1, ...), Python scalars as constants, so the
same expression over new data hits kilnd's compile cache.

`kiln.input(name, dtype, shape)` is a placeholder fed at run time:
`y.numpy({"x": x_value})`.
"""

import numbers

import numpy as np

from . import _dtypes
from .graph import Graph

_F32 = _dtypes.dtype("f32")


def _broadcast(a, b):
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(reversed(out))


def _matmul_shape(a, b):
    if not a or not b:
        raise ValueError("matmul needs operands of rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: {list(a)} @ {list(b)}: inner dims {a2[-1]} and {b2[-2]} differ")
    out = _broadcast(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _axis(axis, rank):
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return a


class Tensor:
    """A lazily evaluated tensor: an op over other tensors. Immutable."""

    # `ndarray + Tensor`: numpy's operators step aside for Tensor.__radd__ & co.
    __array_ufunc__ = None

    def __init__(self, op, args=(), attrs=None, dtype=_F32, shape=(), value=None, name=None):
        self.op, self.args, self.attrs = op, tuple(args), dict(attrs or {})
        self.dtype, self.shape = dtype, tuple(shape)
        self.value, self.name = value, name
        self._result = None

    # -- properties -------------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def T(self):
        return self.transpose()

    def __repr__(self):
        return f"kiln.Tensor({self.op}, {_dtypes.dtype_name(self.dtype)}{list(self.shape)})"

    # -- operators --------------------------------------------------------
    def _binary(self, kind, other, reverse=False):
        other = _lift(other, like=self)
        a, b = (other, self) if reverse else (self, other)
        if a.dtype != b.dtype:
            raise TypeError(f"{kind}: dtypes {_dtypes.dtype_name(a.dtype)} and "
                            f"{_dtypes.dtype_name(b.dtype)} differ; convert one with .astype()")
        return Tensor("binary", (a, b), {"kind": kind}, a.dtype, _broadcast(a.shape, b.shape))

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)

    def maximum(self, o): return self._binary("max", o)
    def minimum(self, o): return self._binary("min", o)

    def __matmul__(self, o):
        o = _lift(o, like=self)
        return _matmul(self, o)

    def __rmatmul__(self, o):
        return _matmul(_lift(o, like=self), self)

    def __neg__(self):
        return self._unary("neg")

    def _unary(self, kind):
        return Tensor("unary", (self,), {"kind": kind}, self.dtype, self.shape)

    def relu(self): return self._unary("relu")
    def gelu(self): return self._unary("gelu")
    def silu(self): return self._unary("silu")
    def sigmoid(self): return self._unary("sigmoid")
    def tanh(self): return self._unary("tanh")
    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def sqrt(self): return self._unary("sqrt")
    def abs(self): return self._unary("abs")

    def softmax(self, axis=-1):
        _axis(axis, self.ndim)
        return Tensor("softmax", (self,), {"axis": axis}, self.dtype, self.shape)

    def astype(self, dtype):
        kd = _dtypes.dtype(dtype)
        return self if kd == self.dtype else Tensor("cast", (self,), {"to": kd}, kd, self.shape)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        n = int(np.prod(self.shape, dtype=np.int64))
        if shape.count(-1) > 1:
            raise ValueError("reshape: at most one -1")
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if -1 in shape:
            if known == 0 or n % known:
                raise ValueError(f"reshape: cannot reshape {list(self.shape)} into {list(shape)}")
            out = tuple(n // known if d == -1 else d for d in shape)
        else:
            out = shape
        if int(np.prod(out, dtype=np.int64)) != n:
            raise ValueError(f"reshape: cannot reshape {list(self.shape)} into {list(shape)}")
        return Tensor("reshape", (self,), {"shape": out}, self.dtype, out)

    def transpose(self, *perm):
        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
            perm = tuple(perm[0])
        perm = tuple(perm) or tuple(reversed(range(self.ndim)))
        if sorted(_axis(p, self.ndim) for p in perm) != list(range(self.ndim)):
            raise ValueError(f"transpose: {list(perm)} is not a permutation of {self.ndim} axes")
        perm = tuple(_axis(p, self.ndim) for p in perm)
        return Tensor("transpose", (self,), {"perm": perm}, self.dtype,
                      tuple(self.shape[p] for p in perm))

    def _reduce(self, kind, axis, keepdims):
        if axis is None:
            axes = tuple(range(self.ndim))
        else:
            axes = tuple(sorted({_axis(a, self.ndim) for a in
                                 ((axis,) if isinstance(axis, int) else axis)}))
        shape = tuple(1 if i in axes else d for i, d in enumerate(self.shape)
                      if keepdims or i not in axes)
        return Tensor("reduce", (self,), {"kind": kind, "axes": axes, "keepdims": keepdims},
                      self.dtype, shape)

    def sum(self, axis=None, keepdims=False): return self._reduce("sum", axis, keepdims)
    def mean(self, axis=None, keepdims=False): return self._reduce("mean", axis, keepdims)
    def max(self, axis=None, keepdims=False): return self._reduce("max", axis, keepdims)
    def min(self, axis=None, keepdims=False): return self._reduce("min", axis, keepdims)

    # -- evaluation -------------------------------------------------------
    def graph(self, name="tensor"):
        """(kiln.Graph, {param name: array}) computing this tensor as output "out"."""
        g, params = _lower({"out": self}, name)
        return g, params

    def numpy(self, inputs=None, client=None):
        """Compiles and runs everything this tensor depends on through kilnd;
        `inputs` feeds kiln.input placeholders by name."""
        if inputs or client or self._result is None:
            (result,) = evaluate(self, inputs=inputs, client=client)
            if inputs or client:
                return result
            self._result = result
        return self._result

    def __array__(self, dtype=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)


def _matmul(a, b):
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: dtypes {_dtypes.dtype_name(a.dtype)} and "
                        f"{_dtypes.dtype_name(b.dtype)} differ; convert one with .astype()")
    return Tensor("matmul", (a, b), {}, a.dtype, _matmul_shape(a.shape, b.shape))


def _lift(x, like=None):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, numbers.Number) and not isinstance(x, bool):
        dt = like.dtype if like is not None else _F32
        return Tensor("scalar", (), {}, dt, (), value=x)
    return tensor(x)


def tensor(value, dtype=None) -> Tensor:
    """A tensor holding a copy of `value` (array-like); sent as a param."""
    arr = np.array(value, dtype=None if dtype is None else _dtypes.numpy_dtype(dtype), copy=True)
    if arr.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
        arr = arr.astype(np.float32)  # Python lists default to f32, as in most ML frameworks
    return Tensor("array", (), {}, _dtypes.dtype(arr.dtype), arr.shape, value=arr)


def input(name: str, dtype="f32", shape=()) -> Tensor:  # noqa: A001 (kiln.input mirrors g.input)
    """A placeholder fed at run time by name (concrete shape)."""
    return Tensor("input", (), {}, _dtypes.dtype(dtype), tuple(int(d) for d in shape), name=name)


def _lower(outputs, name):
    g = Graph(name)
    params, memo = {}, {}

    def visit(t):
        key = id(t)
        if key in memo:
            return memo[key]
        args = [visit(a) for a in t.args]
        if t.op == "array":
            pname = f"c{len(params)}"
            params[pname] = t.value
            v = g.param(pname, t.dtype, t.shape)
        elif t.op == "scalar":
            v = g.scalar(t.value, t.dtype)
        elif t.op == "input":
            v = g.input(t.name, t.dtype, t.shape)
        elif t.op == "binary":
            v = g.binary(t.attrs["kind"], *args)
        elif t.op == "unary":
            v = g.activation(t.attrs["kind"], args[0])
        elif t.op == "matmul":
            v = g.matmul(*args)
        elif t.op == "softmax":
            v = g.softmax(args[0], t.attrs["axis"])
        elif t.op == "cast":
            v = g.cast(args[0], t.attrs["to"])
        elif t.op == "reshape":
            v = g.reshape(args[0], t.attrs["shape"])
        elif t.op == "transpose":
            v = g.transpose(args[0], t.attrs["perm"])
        elif t.op == "reduce":
            v = g.reduce(t.attrs["kind"], args[0], t.attrs["axes"], t.attrs["keepdims"])
        else:
            raise AssertionError(f"unknown tensor op {t.op}")
        memo[key] = v
        return v

    for out_name, t in outputs.items():
        g.output(out_name, visit(t))
    return g, params


def evaluate(*tensors, inputs=None, client=None):
    """Runs several tensors in one graph (shared subexpressions once);
    returns their values as a list of numpy arrays."""
    from .client import default_client
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"evaluate takes kiln Tensors, got {type(t).__name__}")
    g, params = _lower({f"out{i}": t for i, t in enumerate(tensors)}, "tensor")
    out = (client or default_client()).run(g, inputs or {}, params=params)
    return [out[f"out{i}"] for i in range(len(tensors))]

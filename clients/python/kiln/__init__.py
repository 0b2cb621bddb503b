"""kiln: the Python client of kilnd.

    import kiln, numpy as np
    c = kiln.Client("127.0.0.1:7450")
    g = kiln.Graph("mlp")
    x = g.input("x", "f32", ["batch", 784])
    ...
    out, report = c.run(g, {"x": np.ones((1, 784), np.float32)}, params=..., report=True)

    a = kiln.tensor(np.ones((2, 3), np.float32))
    ((a + 1).relu() @ w).numpy()     # the lazy Tensor DSL, run through kilnd

    s = c.train_session(g, loss="loss", params=init, optimizer=kiln.AdamW(lr=1e-3))
    loss = s.step({"x": xb, "y": yb})       # training through kilnd (docs/training.md)
    s.save("ckpt.safetensors")              # c.train_session(..., resume="ckpt.safetensors")

See docs/clients.md.
"""

from ._dtypes import bf16_to_f32, dtype, dtype_name, f32_to_bf16, numpy_dtype
from ._proto.kiln.v1 import graph_pb2, report_pb2, service_pb2, tensor_pb2
from . import shm
from .checkpoint import CheckpointError
from .client import (Client, KilnError, Session, TrainSession, connect, default_client,
                     trim_stacked_outputs)
from .graph import IR_VERSION, Graph, ParsedGraph, Value, graph_source, model, parse
from .report import chrome_trace, format_report, write_chrome_trace
from .tensor import Tensor, evaluate, input, tensor  # noqa: A004 (kiln.input is the DSL's)
from .train import (SGD, Adam, AdamW, Amp, Lion, Muon, Optimizer, Qat, Transformed, constant,
                    cosine, grad, hvp, jvp, linear_warmup, vjp, vmap)
from ._proto.kiln.v1 import train_pb2

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "Client", "KilnError", "Session", "TrainSession", "connect", "default_client",
    "trim_stacked_outputs",
    "SGD", "Adam", "AdamW", "Lion", "Muon", "Optimizer", "Transformed", "Amp", "Qat",
    "constant", "linear_warmup", "cosine", "grad", "vjp", "jvp", "hvp", "vmap", "train_pb2",
    "Graph", "ParsedGraph", "Value", "parse", "graph_source", "model", "IR_VERSION",
    "Tensor", "tensor", "input", "evaluate",
    "format_report", "chrome_trace", "write_chrome_trace",
    "dtype", "dtype_name", "numpy_dtype", "f32_to_bf16", "bf16_to_f32",
    "graph_pb2", "report_pb2", "service_pb2", "tensor_pb2",
]

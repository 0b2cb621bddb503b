#!/usr/bin/python3
"""Exports the PyTorch models kiln_onnx_test imports (an MLP, a CNN with
BatchNorm, a CNN whose flatten is a Shape -> Gather -> Concat -> Reshape
subgraph, an LSTM and a GRU (one direction and bidirectional), and scripted control flow: a while loop with a data-dependent trip
count (ONNX Loop with an If in its body) and an if (ONNX If); an nn.TransformerEncoderLayer
traced at opsets 13 and 17, and looped by a script 3 times or n times, n an input) with
torch.onnx.export, plus an input and PyTorch's output for each (and n's value, <name>.n.pb),
as ONNX TensorProto files: <out>/<name>.onnx, <name>.input.pb, <name>.output.pb.

`--models loop_scan` writes only the model kilnd's repository test serves
(save_loop_scan): a Loop whose trip count n is a graph input and whose scan
output stacks every step, so its shapes depend on n's value.

`--models while_scan` writes only the scripted while loop that appends to a
list (save_while_scan; also part of `all`): an ONNX Loop whose cond the body
computes and whose scan output stacks every iteration, so the length of that
output is known only at run time.

Run by the test with Debian's /usr/bin/python3 (python3-torch 1.13, python3-onnx).
"""
import argparse
import os
from typing import List

import numpy as np
import onnx
from onnx import numpy_helper
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 32)
        self.fc3 = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.nn.functional.gelu(self.fc2(x))
        return torch.softmax(self.fc3(x), dim=-1)


class Cnn(nn.Module):
    def __init__(self, view_flatten):
        super().__init__()
        self.view_flatten = view_flatten
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        if self.view_flatten:
            x = x.view(x.size(0), -1)  # Shape -> Gather -> Unsqueeze -> Concat -> Reshape
        else:
            x = torch.flatten(x, 1)
        return self.fc(x)


class WhileLoop(nn.Module):
    """Grows x until its absolute sum reaches 100: the trip count depends on x."""

    def forward(self, x):
        i = 0
        while bool(x.abs().sum() < 100.0) and i < 50:
            x = x * 1.5 + 0.25
            i += 1
        return x


class Recurrent(nn.Module):
    """An LSTM or GRU layer (ONNX LSTM / GRU) and a linear head on its last step."""

    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class BiRecurrent(nn.Module):
    """A bidirectional LSTM or GRU (ONNX direction="bidirectional"): the head reads
    Y's first and last steps (both directions) and every final state."""

    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(8, 16, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(32, 4)
        self.fc_s = nn.Linear(32, 4)

    def forward(self, x):
        y, s = self.rnn(x)
        out = self.fc(y[:, -1]) + self.fc(y[:, 0])
        for st in (s if isinstance(s, tuple) else (s,)):  # each [2, batch, 16]
            out = out + self.fc_s(torch.cat([st[0], st[1]], 1))
        return out


class IfBranch(nn.Module):
    def forward(self, x):
        if bool(x.sum() > 0):
            y = torch.tanh(x) * 2.0
        else:
            y = x - 1.0
        return y


def encoder_layer():
    """nn.TransformerEncoderLayer as a BERT-style block (post-norm, GELU), small."""
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu",
                                      batch_first=True).eval()


class EncoderLoop(nn.Module):
    """The same encoder layer applied `depth` times by a scripted for loop (ONNX
    Loop with a constant trip count), or n times with n an input (a Loop whose
    trip count is a graph input)."""

    def __init__(self, layer, depth: int):
        super().__init__()
        self.layer = layer
        self.depth = depth

    def forward(self, x):
        for _ in range(self.depth):
            x = self.layer(x)
        return x


class EncoderLoopN(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, n: torch.Tensor):
        for _ in range(int(n)):
            x = self.layer(x)
        return x


def save_encoder(out, name, x, opset):
    """Exported with autograd on: under no_grad an eval TransformerEncoderLayer
    takes its fused fast path (aten::_transformer_encoder_layer_fwd), which has
    no ONNX export. PyTorch's reference output takes that path."""
    model = encoder_layer()
    path = os.path.join(out, name + ".onnx")
    torch.onnx.export(model, x, path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=opset)
    with torch.no_grad():
        y = model(x)
    onnx.checker.check_model(onnx.load(path))
    for suffix, t in (("input", x), ("output", y)):
        with open(os.path.join(out, f"{name}.{suffix}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy().astype(np.float32), suffix).SerializeToString())


def save_encoder_loops(out, gen):
    """Scripting nn.TransformerEncoderLayer itself fails (its fast path calls
    aten::is_autocast_enabled, which has no ONNX export), so the layer is traced
    and the loop around it scripted: the usual mix of the two."""
    layer = encoder_layer()
    x = torch.randn(2, 16, 64, generator=gen)
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    save_scripted(out, "encoder_loop", EncoderLoop(traced, 3), x, 13)
    n = torch.tensor(2, dtype=torch.int64)
    path = os.path.join(out, "encoder_loop_n.onnx")
    with torch.no_grad():
        torch.onnx.export(torch.jit.script(EncoderLoopN(traced)), (x, n), path,
                          input_names=["x", "n"], output_names=["y"], opset_version=13)
        y = layer(layer(x))
    onnx.checker.check_model(onnx.load(path))
    for suffix, t in (("input", x), ("output", y)):
        with open(os.path.join(out, f"encoder_loop_n.{suffix}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy().astype(np.float32), suffix).SerializeToString())
    with open(os.path.join(out, "encoder_loop_n.n.pb"), "wb") as f:
        f.write(numpy_helper.from_array(n.numpy(), "n").SerializeToString())


def save_scripted(out, name, model, x, opset):
    path = os.path.join(out, name + ".onnx")
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.onnx.export(scripted, (x,), path, input_names=["x"], output_names=["y"],
                          opset_version=opset)
        y = model(x)
    onnx.checker.check_model(onnx.load(path))
    for suffix, t in (("input", x), ("output", y)):
        with open(os.path.join(out, f"{name}.{suffix}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy().astype(np.float32), suffix).SerializeToString())


def randomize_bn(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def save(out, name, model, x, opset):
    model.eval()
    path = os.path.join(out, name + ".onnx")
    with torch.no_grad():
        torch.onnx.export(model, x, path, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                          opset_version=opset, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE)  # keeps BatchNormalization
        y = model(x)
    onnx.checker.check_model(onnx.load(path))
    for suffix, t in (("input", x), ("output", y)):
        with open(os.path.join(out, f"{name}.{suffix}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy().astype(np.float32), suffix).SerializeToString())


class RecurrentStep(nn.Module):
    """One step of a small recurrence: h' = tanh(W h + b) + 0.5 h."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, h):
        return torch.tanh(self.lin(h)) + 0.5 * h


def save_loop_scan(out, gen, trip_counts=(3, 5)):
    """A Loop over a traced RecurrentStep whose trip count n is a graph input
    and whose scan output `ys` stacks every step's h ([n, 2, 8]): the shape
    of ys depends on n's value. torch.onnx.export of a scripted loop that
    stacks a list emits ONNX sequence ops (SequenceInsert in the body,
    ConcatFromSequence after it) rather than a scan output, so the step is
    exported by torch and the Loop around it written here with onnx.helper:
    the body is the exported step graph, its initializers (lin.weight,
    lin.bias) in the outer graph, read by the body from the outer scope.
    PyTorch runs the same step n times for the reference outputs, written as
    .npy (kilnd's test reads them with engine/io/npy.h): loop_scan.x.npy, and
    per n: loop_scan.n<n>.npy (n), loop_scan.last<n>.npy and loop_scan.ys<n>.npy."""
    from onnx import helper, TensorProto
    step = RecurrentStep().eval()
    with torch.no_grad():
        step.lin.weight.copy_(torch.randn(8, 8, generator=gen) * 0.5)
        step.lin.bias.copy_(torch.randn(8, generator=gen) * 0.1)
    h0 = torch.randn(2, 8, generator=gen)
    step_path = os.path.join(out, "loop_scan_step.onnx")
    with torch.no_grad():
        torch.onnx.export(step, (h0,), step_path, input_names=["h"], output_names=["h_next"],
                          opset_version=13, do_constant_folding=False)
    sg = onnx.load(step_path).graph
    os.remove(step_path)
    rename = {"h": "h_in", "h_next": "h_out"}
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    for n in sg.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for i, name in enumerate(m.input):
            m.input[i] = rename.get(name, name)
        for i, name in enumerate(m.output):
            m.output[i] = rename.get(name, name)
        body_nodes.append(m)
    body_nodes.append(helper.make_node("Identity", ["h_out"], ["scan_out"]))
    body = helper.make_graph(
        body_nodes, "step",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [2, 8])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["last", "ys"], name="recurrence", body=body)
    graph = helper.make_graph(
        [loop], "loop_scan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("last", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, ["steps", 2, 8])],
        initializer=list(sg.initializer))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="export_torch_models.py")
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "loop_scan.onnx"))

    def write(name, t):
        np.save(os.path.join(out, f"loop_scan.{name}.npy"), t)

    write("x", h0.numpy().astype(np.float32))
    for trips in trip_counts:
        h, ys = h0, []
        with torch.no_grad():
            for _ in range(trips):
                h = step(h)
                ys.append(h)
        write(f"n{trips}", np.array(trips, dtype=np.int64))
        write(f"last{trips}", h.numpy().astype(np.float32))
        write(f"ys{trips}", torch.stack(ys).numpy().astype(np.float32))


class WhileAppend(nn.Module):
    """Grows x until its absolute sum reaches 100, keeping every step: a
    scripted while loop appending to a list, stacked. At opset 11 torch 1.13
    exports the list as the Loop's scan output (SequenceInsert and
    ConcatFromSequence at later opsets); M is INT64_MAX, cond is computed by
    the body, so the trip count (the length of ys) is known only at run time."""

    def forward(self, x):
        ys: List[torch.Tensor] = []
        while bool(x.abs().sum() < 100.0):
            x = x * 1.1 + 0.25
            ys.append(x)
        return x, torch.stack(ys)


def save_while_scan(out):
    """while_scan.onnx and, per input (few: a handful of iterations, many: a
    few dozen), while_scan.<case>.x / .y / .ys as TensorProto (.pb) and .npy."""
    path = os.path.join(out, "while_scan.onnx")
    # A generator of its own: the same inputs (and iteration counts) whether
    # run alone (--models while_scan) or after the other models (`all`).
    gen = torch.Generator().manual_seed(10)
    scripted = torch.jit.script(WhileAppend())
    cases = {"few": torch.randn(2, 3, generator=gen) * 10.0,
             "many": torch.randn(2, 3, generator=gen) * 1e-3}
    with torch.no_grad():
        torch.onnx.export(scripted, (cases["few"],), path, input_names=["x"],
                          output_names=["y", "ys"], opset_version=11)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    assert len(loops) == 1 and len(loops[0].output) == 2, "expected a Loop with a scan output"
    for case, x in cases.items():
        with torch.no_grad():
            y, ys = WhileAppend()(x)
        for name, t in (("x", x), ("y", y), ("ys", ys)):
            a = t.numpy().astype(np.float32)
            np.save(os.path.join(out, f"while_scan.{case}.{name}.npy"), a)
            with open(os.path.join(out, f"while_scan.{case}.{name}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a, name).SerializeToString())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="all", choices=["all", "loop_scan", "while_scan"])
    args = p.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if args.models == "loop_scan":
        save_loop_scan(out, gen)
        return
    if args.models == "while_scan":
        save_while_scan(out)
        return
    save(out, "mlp", Mlp(), torch.randn(5, 64, generator=gen), 13)
    for name, view, opset in (("cnn", False, 13), ("cnn_view", True, 11)):
        m = Cnn(view)
        randomize_bn(m, gen)
        save(out, name, m, torch.randn(3, 3, 16, 16, generator=gen), opset)
    save(out, "lstm", Recurrent(nn.LSTM), torch.randn(3, 5, 8, generator=gen), 14)
    save(out, "gru", Recurrent(nn.GRU), torch.randn(3, 5, 8, generator=gen), 14)
    save(out, "bilstm", BiRecurrent(nn.LSTM), torch.randn(3, 5, 8, generator=gen), 14)
    save(out, "bigru", BiRecurrent(nn.GRU), torch.randn(3, 5, 8, generator=gen), 14)
    save_scripted(out, "while_small", WhileLoop(), torch.randn(2, 3, generator=gen) * 0.1, 13)
    save_scripted(out, "while_large", WhileLoop(), torch.randn(2, 3, generator=gen) * 100.0, 13)
    save_scripted(out, "if_pos", IfBranch(), torch.rand(2, 3, generator=gen) + 0.1, 13)
    save_scripted(out, "if_neg", IfBranch(), -torch.rand(2, 3, generator=gen) - 0.1, 13)
    # The encoder layer traced (Loop-free): opset 13 decomposes LayerNorm
    # (ReduceMean, Sub, Pow, Sqrt, Div), opset 17 keeps LayerNormalization.
    x = torch.randn(2, 16, 64, generator=gen)
    save_encoder(out, "encoder", x, 13)
    save_encoder(out, "encoder17", x, 17)
    save_encoder_loops(out, gen)
    save_while_scan(out)


if __name__ == "__main__":
    main()

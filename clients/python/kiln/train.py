"""Training and autodiff through kilnd (docs/training.md).

    s = client.train_session(g, loss="loss", params=init,
                             optimizer=kiln.AdamW(lr=1e-3, weight_decay=0.01))
    for xb, yb in batches:
        loss = s.step({"x": xb, "y": yb})
    weights = s.get_params()          # trained params and optimizer state ("opt/...")

    gw = client.run(kiln.grad(g, wrt=["w1"], output="loss"), inputs, params=init)
    per_example = client.run(kiln.vmap(kiln.grad(g, wrt=["w"]), axis=0), batch, params=p)

Optimizers take PyTorch's defaults for what they leave unset (Muon: the
published ones); the server checks every hyper-parameter.
"""

from ._proto.kiln.v1 import service_pb2, train_pb2
from .graph import graph_source


class Optimizer:
    """An optimizer spec (kiln.v1.OptimizerSpec). Subclasses set `kind`."""

    kind = train_pb2.OPTIMIZER_UNSPECIFIED
    _fields = ()

    def __init__(self, lr, weight_decay=None, no_weight_decay=(), max_grad_norm=0.0,
                 schedule=None, **hyper):
        unknown = set(hyper) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no {', '.join(sorted(unknown))}")
        self.lr, self.weight_decay = lr, weight_decay
        self.no_weight_decay, self.max_grad_norm = list(no_weight_decay), max_grad_norm
        self.schedule, self.hyper = schedule, hyper

    def to_proto(self) -> train_pb2.OptimizerSpec:
        spec = train_pb2.OptimizerSpec(kind=self.kind, lr=float(self.lr),
                                       max_grad_norm=float(self.max_grad_norm),
                                       no_weight_decay=self.no_weight_decay)
        if self.weight_decay is not None:
            spec.weight_decay = float(self.weight_decay)
        for name, value in self.hyper.items():
            if value is None:
                continue
            if name == "betas":
                spec.beta1, spec.beta2 = (float(b) for b in value)
            elif name in ("nesterov", "muon_nesterov"):
                setattr(spec, name, bool(value))
            elif name == "ns_steps":
                spec.ns_steps = int(value)
            else:
                setattr(spec, name, float(value))
        if self.schedule is not None:
            spec.schedule.CopyFrom(self.schedule)
        return spec

    def __repr__(self):
        return f"kiln.{type(self).__name__}(lr={self.lr!r})"


class Amp:
    """Mixed precision for a training session (kiln.v1.AmpSpec): matmul,
    attention and conv compute in `compute` ("bf16" or "f16") from f32 master
    weights; norms, softmax and losses stay f32. `loss_scale`: "dynamic" (the
    f16 default: GradScaler's rule, its state in opt/loss_scale,
    opt/loss_scale_good_steps and opt/skipped_steps), "static" or "none" (the
    bf16 default)."""

    _modes = {None: train_pb2.LOSS_SCALE_DEFAULT, "none": train_pb2.LOSS_SCALE_NONE,
              "static": train_pb2.LOSS_SCALE_STATIC, "dynamic": train_pb2.LOSS_SCALE_DYNAMIC}

    def __init__(self, compute="bf16", loss_scale=None, init_scale=None, growth_factor=None,
                 backoff_factor=None, growth_interval=None):
        if compute not in ("bf16", "f16"):
            raise ValueError(f"Amp compute {compute!r}: use 'bf16' or 'f16'")
        if loss_scale not in self._modes:
            raise ValueError(f"Amp loss_scale {loss_scale!r}: use 'dynamic', 'static' or 'none'")
        self.compute, self.loss_scale = compute, loss_scale
        self.init_scale, self.growth_factor = init_scale, growth_factor
        self.backoff_factor, self.growth_interval = backoff_factor, growth_interval

    def to_proto(self) -> train_pb2.AmpSpec:
        from ._proto.kiln.v1 import tensor_pb2
        spec = train_pb2.AmpSpec(
            compute=tensor_pb2.DTYPE_BF16 if self.compute == "bf16" else tensor_pb2.DTYPE_F16,
            loss_scale=self._modes[self.loss_scale])
        for name in ("init_scale", "growth_factor", "backoff_factor"):
            if getattr(self, name) is not None:
                setattr(spec, name, float(getattr(self, name)))
        if self.growth_interval is not None:
            spec.growth_interval = int(self.growth_interval)
        return spec

    def __repr__(self):
        return f"kiln.Amp({self.compute!r}, loss_scale={self.loss_scale!r})"


class Qat:
    """Quantization-aware training (kiln.v1.QatSpec): fake quantization on the
    weights and activations of every matmul and conv; `lsq` learns the weight
    scales ("<weight>/lsq_scale" params)."""

    def __init__(self, bits=8, per_channel=False, weight_asymmetric=False,
                 activation_asymmetric=False, weights_only=False, lsq=False):
        if bits not in (4, 8):
            raise ValueError(f"Qat bits {bits!r}: use 8 or 4")
        self.bits, self.per_channel, self.lsq = bits, per_channel, lsq
        self.weight_asymmetric, self.activation_asymmetric = weight_asymmetric, activation_asymmetric
        self.weights_only = weights_only

    def to_proto(self) -> train_pb2.QatSpec:
        return train_pb2.QatSpec(bits=self.bits, weight_per_channel=self.per_channel,
                                 weight_asymmetric=self.weight_asymmetric,
                                 activation_asymmetric=self.activation_asymmetric,
                                 weights_only=self.weights_only, lsq=self.lsq)

    def __repr__(self):
        return f"kiln.Qat(bits={self.bits}, per_channel={self.per_channel}, lsq={self.lsq})"


class SGD(Optimizer):
    kind = train_pb2.OPTIMIZER_SGD
    _fields = ("momentum", "dampening", "nesterov")


class Adam(Optimizer):
    kind = train_pb2.OPTIMIZER_ADAM
    _fields = ("betas", "epsilon")


class AdamW(Optimizer):
    kind = train_pb2.OPTIMIZER_ADAMW
    _fields = ("betas", "epsilon")


class Lion(Optimizer):
    kind = train_pb2.OPTIMIZER_LION
    _fields = ("betas",)


class Muon(Optimizer):
    """Muon for the 2-D params (momentum, Newton-Schulz), AdamW for the rest."""

    kind = train_pb2.OPTIMIZER_MUON
    _fields = ("momentum", "muon_nesterov", "ns_steps", "muon_lr", "betas", "epsilon")


def constant():
    return train_pb2.LrSchedule(kind=train_pb2.SCHEDULE_CONSTANT)


def linear_warmup(warmup_steps):
    return train_pb2.LrSchedule(kind=train_pb2.SCHEDULE_LINEAR_WARMUP, warmup_steps=int(warmup_steps))


def cosine(total_steps, warmup_steps=0, min_lr=0.0):
    return train_pb2.LrSchedule(kind=train_pb2.SCHEDULE_COSINE, total_steps=int(total_steps),
                                warmup_steps=int(warmup_steps), min_lr=float(min_lr))


class Transformed:
    """A graph with an autodiff transform and/or vmap, for Client.run and
    Client.compile."""

    def __init__(self, graph, mode=train_pb2.AUTODIFF_NONE, output="", wrt=()):
        if isinstance(wrt, str):
            wrt = [wrt]
        self.source = graph_source(graph)
        self.spec = train_pb2.AutodiffSpec(mode=mode, output=output, wrt=list(wrt))
        self.vmap = None  # a train_pb2.VmapSpec once kiln.vmap wraps it

    def apply(self, options: service_pb2.CompileOptions) -> None:
        options.transforms.autodiff.CopyFrom(self.spec)
        if self.vmap is not None:
            options.transforms.vmap.CopyFrom(self.vmap)


def grad(graph, wrt, output="loss", with_loss=False) -> Transformed:
    """Outputs grad/<x> for each x of `wrt` (and `output` first when with_loss)."""
    mode = train_pb2.AUTODIFF_GRAD_WITH_LOSS if with_loss else train_pb2.AUTODIFF_GRAD
    return Transformed(graph, mode, output, wrt)


def vjp(graph, wrt, output) -> Transformed:
    """Takes an input cotangent/<output>; outputs the graph's outputs and grad/<x>."""
    return Transformed(graph, train_pb2.AUTODIFF_VJP, output, wrt)


def jvp(graph, wrt, output) -> Transformed:
    """Takes inputs tangent/<x>; outputs the graph's outputs and tangent/<output>."""
    return Transformed(graph, train_pb2.AUTODIFF_JVP, output, wrt)


def hvp(graph, wrt, output="loss") -> Transformed:
    """Takes inputs tangent/<x> (the v); outputs `output`, grad/<x> and hvp/<x>."""
    return Transformed(graph, train_pb2.AUTODIFF_HVP, output, wrt)


def vmap(graph, axis=0, inputs=None, size=0) -> Transformed:
    """`graph` (or a kiln.grad / vjp / jvp / hvp of one: vmap applies after
    the autodiff transform, so vmap(grad(g)) gives per-example gradients)
    mapped over a new batch axis: each batched input (`inputs`, default
    every input) takes the axis at `axis`, every output has it there too;
    params are not batched. `size` 0 takes the batch from the run's inputs.
    The ops it batches and the errors are in docs/training.md."""
    if isinstance(graph, Transformed):
        if graph.vmap is not None:
            raise ValueError("vmap of a vmapped graph is not supported (one batch axis)")
        t = Transformed.__new__(Transformed)
        t.source, t.spec = graph.source, graph.spec
    else:
        t = Transformed(graph)
    t.vmap = train_pb2.VmapSpec(size=int(size), axis=int(axis), inputs=list(inputs or []))
    return t

"""kiln.Client: the Python client of kilnd (proto/kiln/v1/service.proto).

Every failed call raises kiln.KilnError carrying the server's gRPC status code
and message. Tensors go in and come out as numpy arrays. A Client is safe to
share between threads (the gRPC channel multiplexes calls).
"""

import collections
import itertools
import os
import select
import threading

import grpc
import numpy as np

from . import _dtypes, _wire, checkpoint, shm
from .graph import graph_source
from .train import Transformed
from ._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
from ._proto.kiln.v1 import report_pb2, service_pb2, service_pb2_grpc, shm_pb2

DEFAULT_ADDR = "127.0.0.1:7450"


class KilnError(Exception):
    """A failed call: `code` (grpc.StatusCode) and the server's `message`."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = ""):
        super().__init__(f"{method + ': ' if method else ''}{code.name}: {message}")
        self.code = code
        self.message = message
        self.method = method


# gRPC status codes by number (a shared-memory socket's answer carries the number).
_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Session:
    """A server-side session: a compiled graph plus bound params. Use as a
    context manager to close it on exit."""

    def __init__(self, client: "Client", session_id: str, signature):
        self.client, self.id, self.signature = client, session_id, signature

    def set_params(self, params, progress=None):
        return self.client.set_params(self, params, progress)

    def get_params(self, names=None):
        return self.client.get_params(self, names)

    def run(self, inputs, report=False, priority=0):
        return self.client.run(self, inputs, report=report, priority=priority)

    def close(self):
        self.client.close_session(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"kiln.Session({self.id!r})"


class TrainSession(Session):
    """A training session (Client.train_session): step() trains on one batch
    on the server; get_params() returns the trained params and the
    optimizer state ("opt/<param>/m", ..., "opt/step"); save() and load()
    write and restore checkpoints."""

    last = None  # the last step's kiln.v1.TrainStepResponse
    spec = None  # the kiln.v1.TrainingSpec it was created with
    graph_sha256 = ""  # the graph's identity (kiln.checkpoint.graph_identity)

    def step(self, batch) -> float:
        """One step on `batch` ({input name: array}); returns the batch's loss
        (before the step's update)."""
        self.last = self.client.train_step(self, batch)
        return self.last.loss

    def steps(self, batches):
        """Trains on every batch of the iterable `batches`, each step sent
        as soon as the one before it answered (over kilnd's shared-memory
        socket when it is local, else one TrainSteps stream); yields each
        batch's loss."""
        for resp in self.client.train_steps(self, batches):
            self.last = resp
            yield resp.loss

    def save(self, path, extra=None) -> int:
        """Writes a checkpoint (kiln.checkpoint): every param, the optimizer
        state, the step, the training spec and the graph's identity, plus the
        str -> str `extra` metadata. Atomic. Returns the step saved."""
        return checkpoint.save(self, path, extra)

    def load(self, path) -> dict:
        """Restores a checkpoint written by save() (or kilnctl / the C++
        client) into this session: the next step continues the saved run bit
        for bit. Refuses (kiln.CheckpointError, nothing sent) a file of another
        spec, graph or params, or a damaged one. Returns its metadata."""
        tensors, meta = checkpoint.check(path, self.spec, self.graph_sha256, self.signature)
        self.set_params(tensors)
        return meta

    def __repr__(self):
        return f"kiln.TrainSession({self.id!r})"


_END = object()


class _ShmStreamFailed(Exception):
    """A TrainSteps stream with batches in shared memory ended because kilnd
    refused them or lost their regions; `unanswered` (the batches it did not
    run, in order) go again as bytes."""

    def __init__(self, unanswered):
        super().__init__("batches in shared memory refused")
        self.unanswered = unanswered


class _StepStream:
    """One TrainSteps call of Client.train_steps: the request generator (on
    grpcio's thread) puts each batch in a region of the client's pool, at most
    Client._STEPS_SHM_RING at once, and the response loop (the caller's
    thread) hands a region back when its step is answered. A batch whose
    region cannot be had goes as bytes."""

    def __init__(self, client, sid, resend, source, use_shm):
        self._client = client
        self._sid = sid
        self._pool = client._shm if use_shm else None
        self._slots = threading.Semaphore(client._STEPS_SHM_RING)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._batches = itertools.chain(resend, source)
        # (batch, conn, region) of each step sent and not answered, in order;
        # conn and region None for a batch sent as bytes.
        self._sent = collections.deque()

    def _requests(self):
        first = True
        while True:
            if self._pool is not None:
                while not self._slots.acquire(timeout=0.5):
                    if self._done.is_set():
                        return
            # Under the lock the response loop takes to end the stream: once
            # it has, no batch is taken from the caller's iterable here.
            with self._lock:
                if self._done.is_set():
                    return
                batch = next(self._batches, _END)
                if batch is _END:
                    return
                req = service_pb2.TrainStepRequest(session_id=self._sid if first else "")
                first = False
                conn = region = None
                if self._pool is not None:
                    arrays = {name: np.asarray(v) for name, v in batch.items()}
                    got = self._pool.acquire(sum(shm._align64(a.nbytes) for a in arrays.values()))
                    if got is None:
                        self._slots.release()
                        self._client.last_train_steps_shared_memory = False
                    else:
                        conn, region = got
                        shm.fill_inputs(req, region, arrays)
                if region is None:
                    _named(batch, req.inputs)
                self._sent.append((batch, conn, region))
            yield req

    def _answered(self):
        _, conn, region = self._sent.popleft()
        if region is not None:
            self._pool.release(conn, region)
            self._slots.release()

    def _drop_regions(self):
        """Regions of unanswered steps: kilnd may still read them, so they
        are unregistered and unmapped, never reused."""
        for _, _, region in self._sent:
            if region is not None:
                region.close()

    def responses(self):
        c = self._client
        call = c._stub.TrainSteps(self._requests(), metadata=c._metadata, timeout=c._timeout)
        try:
            for resp in call:
                self._answered()
                yield resp
        except grpc.RpcError as e:
            with self._lock:
                self._done.set()
            code, details = e.code(), e.details() or ""
            regions = [(conn, r) for _, conn, r in self._sent if r is not None]
            if regions and code == grpc.StatusCode.INVALID_ARGUMENT and \
                    "names shared memory" in details:
                # A kilnd from before TrainSteps took shared memory: the
                # refused step and those after it did not run.
                c._train_step_shm_refused = True
            elif regions and code == grpc.StatusCode.NOT_FOUND and \
                    "shared-memory region" in details:
                c._shm.reset(regions[0][0])  # kilnd lost them: a new connection next time
            else:
                self._drop_regions()
                raise KilnError(code, details, "TrainSteps") from None
            unanswered = [batch for batch, _, _ in self._sent]
            self._drop_regions()
            raise _ShmStreamFailed(unanswered) from None
        finally:
            with self._lock:
                self._done.set()
            if self._sent:  # the caller stopped early, or an error above
                call.cancel()
                self._drop_regions()
                self._sent.clear()


class _SocketSteps:
    """One Client.train_steps stream over kilnd's shared-memory socket
    (docs/training.md "Steps over the socket"): each step is the train_step
    message train_step() sends, on the pool's connection, held for the whole
    stream. While a step runs, the next batch goes into a second region and
    its message is built, so that once the step's answer is yielded the next
    step costs the device only a send. A step is sent only after the one
    before it answered OK and its loss was taken: a failed step ends the
    stream and nothing after it runs, as with TrainSteps, and a caller that
    stops early ran no step it did not see. The connection is held only while
    a step is in flight, so the caller's loop may use the client meanwhile.

    After responses() ends without an error, `fallback` is None when every
    batch ran here, else (batches not run, shared memory still usable): the
    socket could not take them (another thread holds the connection, kilnd
    takes no steps there, or it lost the connection before they were sent),
    and the caller sends them through TrainSteps."""

    def __init__(self, client, sid, source):
        self._client = client
        self._sid = sid
        self._source = source
        self.fallback = None

    def _message(self, batch, region):
        req = service_pb2.TrainStepRequest(session_id=self._sid)
        shm.fill_inputs(req, region, batch)
        msg = shm_pb2.ShmClientMessage(train_step=req.SerializeToString())
        if self._client._timeout is not None:
            msg.run_timeout_ms = max(1, int(self._client._timeout * 1000 + 0.999))
        return msg.SerializeToString()

    @staticmethod
    def _bytes(arrays):
        return sum(shm._align64(a.nbytes) for a in arrays.values())

    def _receive(self, conn):
        timeout = self._client._timeout
        if timeout is not None:
            # kilnd answers by the step's deadline; a second past it, it is not answering.
            ready, _, _ = select.select([conn._sock], [], [], timeout + 1.0)
            if not ready:
                raise OSError("kilnd did not answer the step by its deadline")
        answer = conn._sock.recv(conn.max_run_message_bytes + 1)
        if not answer:
            raise OSError("kilnd closed the shared-memory socket during a step")
        return shm_pb2.ShmServerMessage.FromString(answer)

    def responses(self):
        c = self._client
        pool = c._shm
        first = next(self._source, _END)
        if first is _END:
            return
        first = {name: np.asarray(v) for name, v in first.items()}
        # Both regions before the connection is held: a new region is
        # registered over the same socket.
        got = pool.acquire(self._bytes(first))
        if got is None:
            self.fallback = ([first], True)
            return
        conn, region = got
        got = pool.acquire(self._bytes(first))
        spare = got[1] if got is not None and got[0] is conn else None
        if got is not None and spare is None:
            pool.release(*got)
        if spare is None or not conn.takes_train_steps() or \
                not conn._lock.acquire(blocking=False):
            for r in (region, spare):
                if r is not None:
                    pool.release(conn, r)
            self.fallback = ([first], True)
            return
        in_flight = False  # a step sent whose answer is not read yet
        lost = False       # the connection broke: its regions are kilnd's no more
        locked = True      # conn._lock held
        try:
            data = self._message(first, region)
            if len(data) > conn.max_run_message_bytes:
                self.fallback = ([first], True)
                return
            try:
                conn._sock.send(data)
            except OSError:
                # Not sent, so not run: through TrainSteps, as bytes (the
                # connection's regions went with it).
                lost = True
                self.fallback = ([first], False)
                return
            in_flight, current = True, first
            while True:
                # While the step runs: the next batch into the other region.
                nxt = next(self._source, _END)
                nxt_data = None
                if nxt is not _END:
                    nxt = {name: np.asarray(v) for name, v in nxt.items()}
                    if self._bytes(nxt) <= spare.size:  # else through TrainSteps
                        nxt_data = self._message(nxt, spare)
                        if len(nxt_data) > conn.max_run_message_bytes:
                            nxt_data = None
                try:
                    reply = self._receive(conn)
                except OSError as e:
                    # The step's fate is unknown, as a gRPC call cut mid-way.
                    lost = True
                    in_flight = False
                    raise KilnError(grpc.StatusCode.UNAVAILABLE, str(e), "TrainSteps") from None
                in_flight = False
                unsent = [current] + ([nxt] if nxt is not _END else [])
                if not reply.request_id:
                    # A kilnd that takes no runs on its socket (nothing ran).
                    conn._runs_refused = True
                    self.fallback = (unsent, True)
                    return
                if reply.code == 12 and "no training steps" in reply.message:
                    conn._train_steps_refused = True  # UNIMPLEMENTED: nothing ran
                    self.fallback = (unsent, True)
                    return
                if reply.code != 0:
                    if reply.code == 5 and "shared-memory region" in reply.message:
                        # NOT_FOUND: kilnd lost the regions; nothing ran.
                        lost = True
                        self.fallback = (unsent, False)
                        return
                    raise KilnError(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN),
                                    reply.message, "TrainSteps")
                c.last_train_step_over_shm_socket = True
                resp = service_pb2.TrainStepResponse.FromString(reply.train_step_response)
                # Nothing is in flight while the caller has the step: the
                # connection serves its other calls meanwhile (a run in the
                # loop's body), and a caller that stops here ran no more.
                conn._lock.release()
                locked = False
                yield resp
                if nxt is _END:
                    return
                if nxt_data is None:
                    # Larger than the stream's regions, or a message too
                    # large: this batch and the rest through TrainSteps.
                    self.fallback = ([nxt], True)
                    return
                conn._lock.acquire()
                locked = True
                try:
                    conn._sock.send(nxt_data)
                except OSError:
                    lost = True  # not sent, so not run
                    self.fallback = ([nxt], False)
                    return
                in_flight, current = True, nxt
                region, spare = spare, region
        finally:
            if in_flight:
                # An error above: the step sent runs; its answer is read
                # before the connection serves again.
                try:
                    self._receive(conn)
                except OSError:
                    lost = True
            if locked:
                conn._lock.release()
            for r in (region, spare):
                if lost:
                    r.close(unregister=False)
                else:
                    pool.release(conn, r)
            if lost:
                pool.reset(conn)


def _named(tensors, field) -> None:
    for name, value in (tensors or {}).items():
        _dtypes.to_proto(value, field.add(name=name).tensor)


_CUDA_GRAPHS = {"auto": 0, "on": 1, "off": 2}  # graph_pb2.CudaGraphs


def _cuda_graphs(mode) -> int:
    """CompileOptions.cuda_graphs from "auto" / "on" / "off" (or a bool)."""
    if mode is True or mode is False:
        mode = "on" if mode else "off"
    value = _CUDA_GRAPHS.get(str(mode).lower())
    if value is None:
        raise ValueError(f"cuda_graphs must be 'auto', 'on' or 'off', not {mode!r}")
    return value


def _session_id(session) -> str:
    return session.id if isinstance(session, Session) else str(session)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {path!r}: {e.strerror}") from None


class Client:
    """Connects to kilnd at `addr` (default $KILN_ADDR, else 127.0.0.1:7450).
    `api_key` (default $KILN_API_KEY) is sent as `authorization: Bearer <key>`;
    `timeout` is a per-call deadline in seconds; SetParams streams
    `chunk_bytes` per message.

    TLS: `tls=True` (default $KILN_TLS) or any of `ca`, `cert`, `key` (PEM file
    paths; defaults $KILN_CA, $KILN_CERT, $KILN_KEY) makes the channel speak
    TLS: the server's certificate must chain to `ca` (default: the system's
    roots); `cert` and `key` present a client certificate (mTLS), which may
    identify the tenant instead of an API key. `tls_server_name` (default
    $KILN_TLS_SERVER_NAME) is the name checked against the server's
    certificate when it is not the address's host.

    `shared_memory` (default True; $KILN_SHM=0 turns it off): run() passes
    tensors through shared memory when kilnd is on this host (a loopback or
    unix: address whose shared-memory socket is reachable; kiln.shm), and as
    bytes otherwise. With shared memory, `shm_runs` (default True;
    $KILN_SHM_RUN=0 turns it off) sends run() itself over kilnd's
    shared-memory socket instead of gRPC (one Unix-socket round trip;
    docs/clients.md "Runs over the socket"); gRPC when kilnd takes no runs
    there (an older kilnd) or another thread's run is on the socket.
    `shm_train_steps` (default True; $KILN_SHM_TRAIN_STEP=0 turns it off)
    does the same for train_step() (docs/training.md "Steps over the
    socket"); gRPC when kilnd takes none there."""

    def __init__(self, addr: str = None, api_key: str = None, timeout: float = None,
                 chunk_bytes: int = 1 << 20, tls: bool = None, ca: str = None,
                 cert: str = None, key: str = None, tls_server_name: str = None,
                 shared_memory: bool = True, shm_runs: bool = True,
                 shm_train_steps: bool = True):
        self.addr = addr or os.environ.get("KILN_ADDR") or DEFAULT_ADDR
        api_key = api_key if api_key is not None else os.environ.get("KILN_API_KEY", "")
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._timeout = timeout
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._chunk_bytes = chunk_bytes
        tls = _env_true("KILN_TLS") if tls is None else tls
        ca = ca if ca is not None else os.environ.get("KILN_CA", "")
        cert = cert if cert is not None else os.environ.get("KILN_CERT", "")
        key = key if key is not None else os.environ.get("KILN_KEY", "")
        if tls_server_name is None:
            tls_server_name = os.environ.get("KILN_TLS_SERVER_NAME", "")
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs its key: give both cert and key "
                             "(KILN_CERT and KILN_KEY) or neither")
        options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ]
        self.tls = bool(tls or ca or cert or key)
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(ca, "CA") if ca else None,
                private_key=_read_pem(key, "client key") if key else None,
                certificate_chain=_read_pem(cert, "client certificate") if cert else None)
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(self.addr, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(self.addr, options=options)
        self._stub = service_pb2_grpc.KilnStub(self._channel)
        # Run with bytes in and out: the client encodes and decodes it itself.
        self._run_raw = self._channel.unary_unary("/kiln.v1.Kiln/Run")
        self._health = health_pb2_grpc.HealthStub(self._channel)
        env_off = os.environ.get("KILN_SHM", "").strip().lower() in ("0", "false", "no", "off")
        self._shm = None
        if shared_memory and not env_off and shm.is_local_target(self.addr):
            self._shm = shm.ShmPool(lambda: self._call(
                "ConnectSharedMemory", shm_pb2.ConnectSharedMemoryRequest()))
        # Whether the last run() / train_step() went through shared memory.
        self.last_run_shared_memory = False
        self.last_train_step_shared_memory = False
        # Whether every batch of the last train_steps() stream did.
        self.last_train_steps_shared_memory = False
        self._train_step_shm_refused = False  # kilnd refused a batch in shared memory
        run_env_off = os.environ.get("KILN_SHM_RUN", "").strip().lower() in ("0", "false", "no",
                                                                             "off")
        self._shm_runs = shm_runs and not run_env_off
        # Whether the last run() went over the shared-memory socket (not gRPC).
        self.last_run_over_shm_socket = False
        step_env_off = os.environ.get("KILN_SHM_TRAIN_STEP", "").strip().lower() in (
            "0", "false", "no", "off")
        self._shm_train_steps = shm_train_steps and not step_env_off
        # Whether the last train_step() went over the shared-memory socket,
        # and whether every step of the last train_steps() stream did.
        self.last_train_step_over_shm_socket = False
        self.last_train_steps_over_shm_socket = False

    def close(self):
        if self._shm is not None:
            self._shm.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"kiln.Client({self.addr!r})"

    def _call(self, method: str, request, stub=None):
        try:
            return getattr(stub or self._stub, method)(
                request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise KilnError(e.code(), e.details() or "", method) from None

    # -- graphs and sessions ----------------------------------------------
    def compile(self, graph, input_shapes=None, device="auto", prefer_common_ir=False,
                disable_fusion=False, allow_tf32=False,
                cuda_graphs="auto",
                allow_int8_activations=False) -> service_pb2.CompileResponse:
        """Verifies `graph`; compiles it when `input_shapes` ({name: dims})
        fixes its symbolic dims. Returns the signature, executable key and
        compile report. `allow_tf32` lets f32 matmuls use TF32 tensor cores
        (CUDA devices; ~1e-3 relative error; part of the executable key).
        `cuda_graphs` ("auto", "on" or "off"): whether runs on a CUDA device
        replay a captured CUDA graph (auto: when the launches it saves are
        at least 1% of the estimated run).
        `allow_int8_activations` lets DequantMatMul round its activations to
        int8 per 32 values and multiply in integers (the CPU; ~0.5% relative
        error; part of the executable key; docs/quantization.md)."""
        req = service_pb2.CompileRequest(
            graph=graph.source if isinstance(graph, Transformed) else graph_source(graph),
            options=service_pb2.CompileOptions(device=device, prefer_common_ir=prefer_common_ir,
                                               disable_fusion=disable_fusion,
                                               allow_tf32=allow_tf32,
                                               cuda_graphs=_cuda_graphs(cuda_graphs),
                                               allow_int8_activations=allow_int8_activations))
        if isinstance(graph, Transformed):
            graph.apply(req.options)
        for name, dims in (input_shapes or {}).items():
            req.input_shapes.add(name=name, dims=[int(d) for d in dims])
        return self._call("Compile", req)

    def create_session(self, graph, params=None, device="auto", allow_tf32=False,
                       cuda_graphs="auto", state=None,
                       allow_int8_activations=False) -> Session:
        """A session for `graph` (or a repository model: kiln.model("name"));
        small `params` go inline, large ones with set_params. `allow_tf32`,
        `cuda_graphs` and `allow_int8_activations` as in compile(). `state` ({"output": "param"}, e.g.
        {"cache_out": "cache"}) makes a stateful session: after each
        successful run the output's value becomes the param's, in place in
        kilnd, and the output is not returned; set_params resets it."""
        req = service_pb2.CreateSessionRequest(
            graph=graph_source(graph),
            options=service_pb2.CompileOptions(device=device, allow_tf32=allow_tf32,
                                               cuda_graphs=_cuda_graphs(cuda_graphs),
                                               allow_int8_activations=allow_int8_activations))
        _named(params, req.params)
        for output, param in (state or {}).items():
            req.state.add(output=output, param=param)
        resp = self._call("CreateSession", req)
        return Session(self, resp.session_id, resp.signature)

    def train_session(self, graph, loss, params=None, optimizer=None, trainable=None,
                      device="auto", resume=None, amp=None, qat=None) -> "TrainSession":
        """A training session: `graph` with scalar output `loss`, initial
        `params` ({name: array}, every param of the graph), an optimizer
        (kiln.SGD, Adam, AdamW, Lion, Muon) and the params to train
        (`trainable`, default every param not frozen). `resume`: a checkpoint
        (TrainSession.save) to continue instead of `params`. `amp`: kiln.Amp
        (mixed precision); `qat`: kiln.Qat (quantization-aware training)."""
        if optimizer is None:
            raise TypeError("train_session needs an optimizer (kiln.SGD, Adam, AdamW, Lion, Muon)")
        if resume is not None and params:
            raise TypeError("train_session takes params or resume=, not both: the checkpoint "
                            "holds the params")
        opts = service_pb2.CompileOptions(device=device)
        spec = opts.transforms.training
        spec.loss = loss
        spec.params.extend(trainable or [])
        spec.optimizer.CopyFrom(optimizer.to_proto())
        if amp is not None:
            opts.transforms.amp.CopyFrom(amp.to_proto())
        if qat is not None:
            opts.transforms.qat.CopyFrom(qat.to_proto())
        source = graph_source(graph)
        req = service_pb2.CreateSessionRequest(graph=source, options=opts)
        big = {n: v for n, v in (params or {}).items() if np.asarray(v).nbytes > self._chunk_bytes}
        _named({n: v for n, v in (params or {}).items() if n not in big}, req.params)
        resp = self._call("CreateSession", req)
        session = TrainSession(self, resp.session_id, resp.signature)
        session.spec, session.graph_sha256 = spec, checkpoint.graph_identity(source)
        try:
            if big:
                self.set_params(session, big)
            if resume is not None:
                session.load(resume)
        except BaseException:
            session.close()
            raise
        return session

    # Batches of one train_steps() stream in shared memory at once: kilnd
    # reads a batch in place until its step is answered (and reads the next
    # message while a step runs), so a region goes back to the pool only then.
    _STEPS_SHM_RING = 3

    def train_steps(self, session, batches):
        """Steps of a training session over the iterable `batches`; yields
        each step's TrainStepResponse in order. Over kilnd's shared-memory
        socket when train_step() would go there (_SocketSteps: the next
        batch placed while a step runs, its message sent once the step's
        response is taken; last_train_steps_over_shm_socket tells), else (or
        for the batches the socket could not take) in one TrainSteps stream.

        The batches go through shared memory when train_step() would use it
        (a local kilnd), each in a region of a small ring that is reused only
        once its step is answered; last_train_steps_shared_memory tells
        whether every batch of the last stream did. Against a kilnd that
        refuses them (or lost the regions) the steps it did not run are sent
        again as bytes, in a new stream."""
        sid = _session_id(session)
        source = iter(batches)
        resend = []  # batches sent but not run, for the next stream
        use_shm = self._shm is not None and not self._train_step_shm_refused
        self.last_train_steps_shared_memory = use_shm
        self.last_train_steps_over_shm_socket = False
        if use_shm and self._shm_train_steps:
            over_socket = _SocketSteps(self, sid, source)
            self.last_train_steps_over_shm_socket = True
            yield from over_socket.responses()
            if over_socket.fallback is None:
                return
            resend, use_shm = over_socket.fallback
            self.last_train_steps_over_shm_socket = False
            self.last_train_steps_shared_memory = use_shm
        while True:
            stream = _StepStream(self, sid, resend, source, use_shm)
            try:
                for resp in stream.responses():
                    yield resp
                return
            except _ShmStreamFailed as failed:
                resend = failed.unanswered
                use_shm = False
                self.last_train_steps_shared_memory = False

    def train_step(self, session, batch) -> service_pb2.TrainStepResponse:
        """One training step of a training session: loss, step and lr. The
        batch goes through shared memory when run() would use it (a local
        kilnd; last_train_step_shared_memory tells), else as bytes."""
        sid = _session_id(session)
        self.last_train_step_over_shm_socket = False
        use_shm = self._shm is not None and not self._train_step_shm_refused
        # The shared-memory request is filled in place (no copy of a template:
        # a step is the client's hot path); bytes get a request of their own.
        resp = (self._train_step_shm(service_pb2.TrainStepRequest(session_id=sid), batch)
                if use_shm else None)
        self.last_train_step_shared_memory = resp is not None
        if resp is not None:
            return resp
        req = service_pb2.TrainStepRequest(session_id=sid)
        _named(batch, req.inputs)
        return self._call("TrainStep", req)

    def _train_step_shm(self, req, batch):
        """The step's response with the batch in shared memory, or None when
        that is not possible this time (the caller sends bytes)."""
        def refused(e):
            if e.code == grpc.StatusCode.INVALID_ARGUMENT and "names shared memory" in e.message:
                # A kilnd from before TrainStep took shared memory: nothing
                # ran; bytes from now on.
                self._train_step_shm_refused = True
                return True
            return False
        sent = self._shm_call("TrainStep", req, batch, shm.fill_inputs, refused, copy=False)
        if sent is None:
            return None
        resp, conn, region = sent
        self._shm.release(conn, region)
        return resp

    def _shm_call(self, method, req, tensors, fill, refused=None, copy=True):
        """Calls `method` with a copy of `req` (`req` itself when not `copy`:
        the caller then sends another request if this returns None) whose
        `tensors` ({name: array}) `fill` placed in a shared-memory region:
        (response, conn, region), the region still held by the caller, or None
        when shared memory is not possible this time (nothing ran; the caller
        sends bytes). `refused(e)` says whether an error means this kilnd does
        not take shared memory for `method`."""
        arrays = {name: np.asarray(v) for name, v in tensors.items()}
        got = self._shm.acquire(sum(shm._align64(a.nbytes) for a in arrays.values()))
        if got is None:
            return None
        conn, region = got
        if copy:
            shm_req = type(req)()
            shm_req.CopyFrom(req)
        else:
            shm_req = req
        try:
            fill(shm_req, region, arrays)
            if method == "Run":
                resp = self._socket_run(conn, shm_req)
            elif method == "TrainStep":
                resp = self._socket_train_step(conn, shm_req)
            else:
                resp = None
            if resp is None:
                resp = self._call(method, shm_req)
            return resp, conn, region
        except KilnError as e:
            if e.code == grpc.StatusCode.NOT_FOUND and "shared-memory region" in e.message:
                # kilnd lost the region (restarted, connection dropped):
                # nothing ran; bytes this time, a new connection next time.
                region.close(unregister=False)
                self._shm.reset(conn)
                return None
            self._shm.release(conn, region)
            if refused is not None and refused(e):
                return None
            raise
        except BaseException:
            self._shm.release(conn, region)
            raise

    def set_params(self, session, params, progress=None) -> service_pb2.SetParamsResponse:
        """Streams `params` ({name: array}) in chunks; applied atomically at
        the end. `progress(done_bytes, total_bytes)` is called per chunk."""
        sid = _session_id(session)
        arrays = {name: np.asarray(v) for name, v in params.items()}
        total = sum(a.nbytes for a in arrays.values())
        step = self._chunk_bytes

        def chunks():
            done, first = 0, True
            for name, arr in arrays.items():
                t = _dtypes.to_proto(arr)  # wire dtype and little-endian bytes
                data = memoryview(t.data)
                offset = 0
                while True:
                    n = min(step, len(data) - offset)
                    c = service_pb2.SetParamsChunk(offset=offset, data=bytes(data[offset:offset + n]))
                    if first:
                        c.session_id, first = sid, False
                    if offset == 0:
                        c.name, c.dtype = name, t.dtype
                        c.dims.extend(t.dims)
                    yield c
                    offset += n
                    done += n
                    if progress:
                        progress(done, total)
                    if offset >= len(data):
                        break
            if first:
                yield service_pb2.SetParamsChunk(session_id=sid)

        return self._call("SetParams", chunks())

    def get_params(self, session, names=None) -> dict:
        """The session's params as {name: array} (names None = all)."""
        req = service_pb2.GetParamsRequest(session_id=_session_id(session), names=names or [])
        out, bufs, current = {}, {}, None
        try:
            for c in self._stub.GetParams(req, metadata=self._metadata, timeout=self._timeout):
                if c.name and (c.name != current or c.offset == 0):
                    current = c.name
                    dt = _dtypes.numpy_dtype(c.dtype)
                    out[current] = (dt, tuple(c.dims))
                    bufs[current] = bytearray(int(np.prod(c.dims, dtype=np.int64)) * dt.itemsize)
                if current is None:
                    raise KilnError(grpc.StatusCode.DATA_LOSS, "a chunk before any param name",
                                    "GetParams")
                buf = bufs[current]
                if c.offset < 0 or c.offset + len(c.data) > len(buf):
                    raise KilnError(grpc.StatusCode.DATA_LOSS,
                                    f"chunk [{c.offset}, {c.offset + len(c.data)}) outside param "
                                    f"{current!r} of {len(buf)} bytes", "GetParams")
                buf[c.offset:c.offset + len(c.data)] = c.data
        except grpc.RpcError as e:
            raise KilnError(e.code(), e.details() or "", "GetParams") from None
        return {name: np.frombuffer(bufs[name], dtype=dt).reshape(shape)
                for name, (dt, shape) in out.items()}

    def close_session(self, session) -> None:
        self._call("CloseSession", service_pb2.CloseSessionRequest(session_id=_session_id(session)))

    # -- running ----------------------------------------------------------
    def run(self, graph, inputs=None, params=None, report=False, device="auto", priority=0):
        """Runs a session (a Session or session id) or, one-shot, a graph
        (kiln.Graph, kiln.parse(...), kiln.v1.Graph) with `params` inline.
        Returns {output name: array} in the graph's output order, or
        (outputs, DispatchReport) when `report`. The arrays are read-only
        views of the response's bytes (no copy); `.copy()` one to write it."""
        req = service_pb2.RunRequest(report=report, priority=priority)
        if isinstance(graph, (Session, str)):
            if params:
                raise ValueError("a session's params are set with set_params, not run(params=)")
            req.session_id = _session_id(graph)
        elif isinstance(graph, Transformed):
            req.graph.CopyFrom(graph.source)
            graph.apply(req.options)
            req.options.device = device
        else:
            req.graph.CopyFrom(graph_source(graph))
            req.options.device = device
        resp, outputs = None, None
        self.last_run_over_shm_socket = False
        if self._shm is not None:
            # Inputs through shared memory (params stay in the message;
            # _run_shm sends a copy, so req is left as it was but for them).
            _named(params, req.params)
            resp, outputs = self._run_shm(req, inputs or {})
            if resp is None:
                del req.params[:]  # the bytes path below writes them itself
        self.last_run_shared_memory = resp is not None
        if resp is None:
            # Tensors straight from the arrays into the request bytes, and outputs
            # as read-only views of the response bytes (kiln/_wire.py).
            raw = _wire.run_request(req, inputs, params)
            try:
                buf = self._run_raw(raw, metadata=self._metadata, timeout=self._timeout)
            except grpc.RpcError as e:
                raise KilnError(e.code(), e.details() or "", "Run") from None
            try:
                outputs, resp = _wire.run_response(buf)
            except ValueError as e:
                raise KilnError(grpc.StatusCode.DATA_LOSS, f"the response is malformed: {e}",
                                "Run") from None
        if report:
            r = report_pb2.DispatchReport()
            r.CopyFrom(resp.report)
            if not r.request_id:
                r.request_id = resp.request_id
            return outputs, r
        return outputs

    def _socket_run(self, conn, req):
        """The RunResponse of `req` sent over the shared-memory socket, or None
        when it was not sent (gRPC then). KilnError as gRPC's would be."""
        if not self._shm_runs:
            return None
        try:
            reply = conn.try_run(req.SerializeToString(), self._timeout)
        except OSError as e:
            # The socket broke (kilnd went away or restarted): a new
            # connection next time; the run's fate is unknown, as a gRPC
            # call cut mid-way.
            self._shm.reset(conn)
            raise KilnError(grpc.StatusCode.UNAVAILABLE, str(e), "Run") from None
        if reply is None:
            return None
        if reply.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and \
                reply.message.startswith("nothing ran: "):
            # Outputs as bytes would not fit a datagram (the region's output
            # area is too small): gRPC this time, which sizes the next region.
            return None
        self.last_run_over_shm_socket = True
        if reply.code != 0:
            raise KilnError(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message,
                            "Run")
        return service_pb2.RunResponse.FromString(reply.run_response)

    def _socket_train_step(self, conn, req):
        """The TrainStepResponse of `req` sent over the shared-memory socket,
        or None when it was not sent (gRPC then). KilnError as gRPC's would be."""
        if not self._shm_train_steps:
            return None
        try:
            reply = conn.try_train_step(req.SerializeToString(), self._timeout)
        except OSError as e:
            # The socket broke: a new connection next time; the step's fate
            # is unknown, as a gRPC call cut mid-way.
            self._shm.reset(conn)
            raise KilnError(grpc.StatusCode.UNAVAILABLE, str(e), "TrainStep") from None
        if reply is None:
            return None
        self.last_train_step_over_shm_socket = True
        if reply.code != 0:
            raise KilnError(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message,
                            "TrainStep")
        return service_pb2.TrainStepResponse.FromString(reply.train_step_response)

    def _run_shm(self, req, inputs):
        """(response, outputs) through shared memory, or (None, None) when it
        is not possible this time (the caller sends bytes)."""
        sent = self._shm_call("Run", req, inputs, shm.fill_request)
        if sent is None:
            return None, None
        resp, conn, region = sent
        try:
            outputs, missed = shm.read_outputs(resp, region)
        finally:
            self._shm.release(conn, region, 0)
        if missed:
            self._shm.release_hint(missed)
        return resp, outputs

    # -- the model repository ---------------------------------------------
    def models(self, name: str = "") -> list:
        """Every model version of the server's repository (ModelVersionInfo:
        name, version, state, error, param_bytes, sessions, signature)."""
        return list(self._call("ListModels", service_pb2.ListModelsRequest(name=name)).models)

    def load_model(self, name: str, version: int = 0) -> service_pb2.ModelVersionInfo:
        """Loads a model version (0 = the newest on disk); admin tenants only."""
        return self._call("LoadModel", service_pb2.LoadModelRequest(name=name, version=version)).model

    def unload_model(self, name: str, version: int = 0) -> list:
        """Unloads a model's versions (0 = every loaded one); admin tenants only.
        Sessions open on it keep it until they close."""
        return list(self._call("UnloadModel",
                               service_pb2.UnloadModelRequest(name=name, version=version)).unloaded)

    # -- server -----------------------------------------------------------
    def devices(self):
        """The server's devices (kiln.v1.DeviceInfo), CPU first."""
        return list(self._call("ListDevices", service_pb2.ListDevicesRequest()).devices)

    def report(self, last: int = 1, request_id: str = None):
        """The caller's last `last` dispatch reports (0 = all kept), oldest
        first; or the one report of `request_id`."""
        if request_id:
            reports = self._call("GetReport", service_pb2.GetReportRequest(request_id=request_id))
            if not reports.reports:
                raise KilnError(grpc.StatusCode.NOT_FOUND, f"no report for request {request_id}",
                                "GetReport")
            return reports.reports[0]
        return list(self._call("GetReport", service_pb2.GetReportRequest(last=last)).reports)

    def server_info(self) -> service_pb2.ServerInfoResponse:
        return self._call("ServerInfo", service_pb2.ServerInfoRequest())

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ..."""
        resp = self._call("Check", health_pb2.HealthCheckRequest(service=service), self._health)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


STACKED_LENGTH_PREFIX = "kiln.length."


def trim_stacked_outputs(outputs: dict) -> dict:
    """An ONNX model's outputs from a run's: the stacked (scan) output `y` of a
    while loop (an ONNX Loop whose body computes cond; docs/onnx.md, "While
    loops with scan outputs") comes back as a buffer of the importer's bound
    rows beside the i64 scalar output "kiln.length.y", the rows the loop
    wrote. Returns the outputs with each such `y` cut to its length (a view)
    and the length outputs dropped; other outputs are kept as they are.
    Raises KilnError(RESOURCE_EXHAUSTED) when a loop wanted more rows than
    its buffer has, as kilnctl and io::TrimStackedOutputs do."""
    out = {}
    for name, a in outputs.items():
        if name.startswith(STACKED_LENGTH_PREFIX):
            continue
        length = outputs.get(STACKED_LENGTH_PREFIX + name)
        if length is None:
            out[name] = a
            continue
        length = np.asarray(length)
        if length.dtype != np.int64 or length.size != 1 or np.ndim(a) == 0:
            raise ValueError(f"output {STACKED_LENGTH_PREFIX + name!r} is not the i64 length of a "
                             "stacked output")
        n = int(length.reshape(()))
        if n < 0:
            raise ValueError(f"output {STACKED_LENGTH_PREFIX + name!r} is negative")
        if n > a.shape[0]:
            raise KilnError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"the while loop stacking output {name!r} ran more iterations than "
                            f"its {a.shape[0]} rows (OnnxImportOptions::max_while_scan_length)")
        out[name] = a[:n]
    return out


_default = None
_default_lock = threading.Lock()


def connect(addr: str = None, api_key: str = None, **kwargs) -> Client:
    """Makes (and returns) the default client that the Tensor DSL uses."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = Client(addr, api_key, **kwargs)
        return _default


def default_client() -> Client:
    """The client of the last connect(), else one for $KILN_ADDR."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default

"""Shared memory with a kilnd on this host (kiln/v1/shm.proto, docs/clients.md
"Shared memory").

`kiln.Client(shared_memory=True)` (the default) uses it by itself when the
address is loopback or a Unix socket: inputs are copied once into a memfd
region registered with kilnd, outputs are written there by kilnd and copied
out once, and no tensor bytes cross gRPC. `ShmConnection` and `ShmRegion` are
public for callers that lay out tensors in shared memory themselves.
"""

import fcntl
import mmap
import os
import select
import socket
import threading

import numpy as np

from . import _dtypes
from ._proto.kiln.v1 import shm_pb2

_ANSWER_TIMEOUT_S = 10.0


class ShmError(Exception):
    """kilnd refused a shared-memory message; `code` is the gRPC status code
    (an int), `message` why."""

    def __init__(self, code: int, message: str):
        super().__init__(f"shared memory: {message} (code {code})")
        self.code = code
        self.message = message


def is_local_target(target: str) -> bool:
    """Whether a gRPC target names this host: unix:..., localhost, 127.0.0.0/8
    or ::1 (with or without a dns:///, ipv4: or ipv6: scheme)."""
    t = target.lower()
    if t.startswith("unix:") or t.startswith("unix-abstract:"):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if t.startswith(scheme):
            t = t[len(scheme):]
            break
    if t.startswith("["):
        host = t[1:t.find("]")] if "]" in t else t[1:]
    elif t.count(":") == 1:
        host = t.rsplit(":", 1)[0]
    else:
        host = t
    return host == "localhost" or host.startswith("127.") or host == "::1"


class ShmRegion:
    """A memfd sealed against shrinking, mapped here and registered with kilnd
    as `id`. `buffer` is its memoryview. close() unregisters it."""

    def __init__(self, connection: "ShmConnection", region_id: str, fd: int, size: int):
        self.connection = connection
        self.id = region_id
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.buffer = memoryview(self._map)

    def write(self, offset: int, array: np.ndarray) -> int:
        """Copies `array` (C order) to `offset`; returns its byte count."""
        n = array.nbytes
        dst = np.frombuffer(self.buffer, dtype=np.uint8, count=n, offset=offset)
        dst[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return n

    def read(self, offset: int, dtype, dims) -> np.ndarray:
        """A copy of the tensor at `offset` (kiln dtype, dims)."""
        nd = _dtypes.numpy_dtype(dtype)
        count = 1
        for d in dims:
            count *= d
        if offset < 0 or offset + count * nd.itemsize > self.size:
            raise ValueError(f"bytes at {offset} are not inside region {self.id!r}")
        return np.frombuffer(self.buffer, dtype=nd, count=count, offset=offset).reshape(
            tuple(dims)).copy()

    def close(self, unregister: bool = True):
        if self.fd < 0:
            return
        if unregister:
            try:
                self.connection.unregister(self.id)
            except (OSError, ShmError):
                pass  # kilnd drops it with the connection anyway
        self.buffer.release()
        self._map.close()
        os.close(self.fd)
        self.fd = -1


class ShmConnection:
    """A connection to kilnd's shared-memory socket. `ticket` is a
    ConnectSharedMemoryResponse (from Kiln.ConnectSharedMemory). Closing it
    unregisters every region it registered."""

    def __init__(self, ticket):
        name = ticket.socket
        address = "\0" + name[1:] if name.startswith("@") else name
        self.socket_name = name
        self.max_regions = ticket.max_regions
        self.max_bytes = ticket.max_bytes
        # Runs over the socket (docs/clients.md "Runs over the socket"): the
        # largest message kilnd takes; 0 when it takes none (an older kilnd).
        self.max_run_message_bytes = ticket.max_run_message_bytes
        # Training steps over the socket (docs/training.md "Steps over the
        # socket"): False from a kilnd that takes none there.
        self.train_steps = bool(ticket.train_steps)
        self._runs_refused = False
        self._train_steps_refused = False
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(address)
            self._call(shm_pb2.ShmClientMessage(ticket=ticket.ticket))
        except Exception:
            self._sock.close()
            raise

    def _call(self, message, fd: int = -1):
        data = message.SerializeToString()
        with self._lock:
            if fd >= 0:
                socket.send_fds(self._sock, [data], [fd])
            else:
                self._sock.send(data)
            ready, _, _ = select.select([self._sock], [], [], _ANSWER_TIMEOUT_S)
            if not ready:
                raise OSError("kilnd's shared-memory socket did not answer")
            answer = self._sock.recv(4096)
        if not answer:
            raise OSError("kilnd closed the shared-memory socket")
        reply = shm_pb2.ShmServerMessage.FromString(answer)
        if reply.code != 0:
            raise ShmError(reply.code, reply.message)
        return reply

    def takes_runs(self) -> bool:
        return self.max_run_message_bytes > 0 and not self._runs_refused

    def takes_train_steps(self) -> bool:
        return self.takes_runs() and self.train_steps and not self._train_steps_refused

    def try_train_step(self, request: bytes, timeout: float = None):
        """try_run for a serialized kiln.v1.TrainStepRequest: kilnd's
        ShmServerMessage (train_step_response the serialized
        TrainStepResponse when its code is 0), or None when it was not sent
        (gRPC then)."""
        if not self.takes_train_steps():
            return None
        reply = self.try_run(request, timeout, kind="train_step")
        if reply is not None and reply.code == 12 and "no training steps" in reply.message:
            # UNIMPLEMENTED: this kilnd takes none here after all (nothing ran).
            self._train_steps_refused = True
            return None
        return reply

    def try_run(self, request: bytes, timeout: float = None, kind: str = "run"):
        """Sends a serialized kiln.v1.RunRequest as a run message and returns
        kilnd's ShmServerMessage (its code the run's status, run_response the
        serialized RunResponse when 0), or None when it was not sent and the
        run should go over gRPC: kilnd takes no runs here, the request does
        not fit max_run_message_bytes, or another thread's message is on the
        socket now. `timeout` (seconds) is the run's deadline. OSError when
        the socket broke."""
        if not self.takes_runs():
            return None
        msg = shm_pb2.ShmClientMessage(**{kind: request})
        if timeout is not None:
            msg.run_timeout_ms = max(1, int(timeout * 1000 + 0.999))
        data = msg.SerializeToString()
        if len(data) > self.max_run_message_bytes:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._sock.send(data)
            if timeout is not None:
                # kilnd answers by the deadline; a second past it, it is not answering.
                ready, _, _ = select.select([self._sock], [], [], timeout + 1.0)
                if not ready:
                    raise OSError("kilnd did not answer the run by its deadline")
            answer = self._sock.recv(self.max_run_message_bytes + 1)
        finally:
            self._lock.release()
        if not answer:
            raise OSError("kilnd closed the shared-memory socket during a run")
        reply = shm_pb2.ShmServerMessage.FromString(answer)
        if not reply.request_id:
            # A kilnd that takes no runs on its socket answered as to an
            # unknown message (nothing ran): gRPC from now on.
            self._runs_refused = True
            return None
        return reply

    def register_fd(self, region_id: str, fd: int) -> int:
        """Registers a file the caller made (sealed with F_SEAL_SHRINK);
        returns its size as kilnd mapped it."""
        msg = shm_pb2.ShmClientMessage()
        msg.register_region.region_id = region_id
        return self._call(msg, fd).bytes

    def unregister(self, region_id: str) -> None:
        self._call(shm_pb2.ShmClientMessage(unregister_region=region_id))

    def create_region(self, region_id: str, size: int) -> ShmRegion:
        """A new memfd of `size` bytes, sealed, mapped and registered."""
        fd = os.memfd_create(f"kiln-{region_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            region = ShmRegion(self, region_id, fd, size)
        except BaseException:
            os.close(fd)
            raise
        try:
            self.register_fd(region_id, fd)
        except BaseException:
            region.close(unregister=False)
            raise
        return region

    def close(self):
        self._sock.close()


def _align64(n: int) -> int:
    return (n + 63) // 64 * 64


class ShmPool:
    """What kiln.Client keeps: one connection and idle regions, each serving
    one call at a time (inputs from its start, the output area after them)."""

    MIN_REGION = 1 << 20
    MAX_IDLE = 4

    def __init__(self, connect):
        self._connect = connect  # () -> ConnectSharedMemoryResponse
        self._lock = threading.Lock()
        self._connection = None
        self._idle = []
        self._retry_after = 0.0
        self._output_hint = 0
        self._next = 0

    def acquire(self, input_bytes: int):
        """(connection, region) for one call, or None (use bytes)."""
        import time
        with self._lock:
            want = input_bytes + max(self._output_hint, input_bytes)
            if self._connection is None:
                if time.monotonic() < self._retry_after:
                    return None
                try:
                    self._connection = ShmConnection(self._connect())
                except Exception:  # no shared memory there, or out of reach
                    self._retry_after = time.monotonic() + 30
                    return None
            conn = self._connection
            for i, r in enumerate(self._idle):
                if r.size >= want:
                    return conn, self._idle.pop(i)
            self._next += 1
            region_id = f"py-{os.getpid()}-{id(self) % 100000}-{self._next}"
        size = max(self.MIN_REGION, (want + want // 4 + 4095) // 4096 * 4096)
        try:
            return conn, conn.create_region(region_id, size)
        except (ShmError, OSError):
            return None

    def release(self, conn, region, output_bytes_missed: int = 0):
        with self._lock:
            if output_bytes_missed:
                self._output_hint = max(self._output_hint, output_bytes_missed)
            if conn is self._connection:
                self._idle.append(region)
                if len(self._idle) > self.MAX_IDLE:
                    self._idle.pop(0).close()
                return
        region.close()

    def release_hint(self, output_bytes: int) -> None:
        """Outputs of `output_bytes` did not all fit: size later regions for them."""
        with self._lock:
            self._output_hint = max(self._output_hint, output_bytes)

    def reset(self, conn):
        """kilnd lost the connection's regions: start over next time."""
        with self._lock:
            if conn is not self._connection:
                return
            self._connection = None
            idle, self._idle = self._idle, []
        for r in idle:
            r.close(unregister=False)
        conn.close()

    def close(self):
        with self._lock:
            conn, self._connection = self._connection, None
            idle, self._idle = self._idle, []
        for r in idle:
            r.close(unregister=False)
        if conn is not None:
            conn.close()


def fill_request(req, region, inputs) -> int:
    """Puts `inputs` ({name: array}) into `region` and names them in `req`,
    with the rest of the region as the output area. Returns the input bytes."""
    offset = fill_inputs(req, region, inputs)
    req.shm_output_area.region_id = region.id
    req.shm_output_area.offset = offset
    req.shm_output_area.bytes = region.size - offset
    return offset


def fill_inputs(req, region, inputs) -> int:
    """Puts `inputs` ({name: array}) into `region` and names them in
    `req.inputs` (a RunRequest's or a TrainStepRequest's), each 64-byte
    aligned. Returns the bytes used."""
    offset = 0
    for name, value in inputs.items():
        arr = np.asarray(value)
        kd = _dtypes.dtype(arr.dtype)
        arr = np.asarray(arr, dtype=_dtypes.numpy_dtype(kd), order="C")
        nt = req.inputs.add(name=name)
        nt.tensor.dtype = kd
        nt.tensor.dims.extend(arr.shape)
        n = region.write(offset, arr)
        nt.shm.region_id = region.id
        nt.shm.offset = offset
        nt.shm.bytes = n
        offset += _align64(n)
    return offset


def read_outputs(resp, region):
    """{name: array} from a RunResponse whose outputs may be in `region`, and
    when some were not (the area was too small), all outputs' bytes (to size
    the next region; else 0)."""
    outputs = {}
    total = 0
    all_in_shm = True
    for o in resp.outputs:
        if o.HasField("shm"):
            if o.shm.region_id != region.id:
                raise ValueError(f"output {o.name!r} names a region this call did not give")
            arr = region.read(o.shm.offset, o.tensor.dtype, list(o.tensor.dims))
        else:
            arr = _dtypes.from_proto(o.tensor)
            all_in_shm = False
        total += _align64(arr.nbytes)
        # Read-only as the bytes path's views are (docs/clients.md): code
        # behaves the same whichever transport carried the call.
        arr.flags.writeable = False
        outputs[o.name] = arr
    return outputs, 0 if all_in_shm else total

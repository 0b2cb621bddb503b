"""A llama-architecture decoder from a GGUF file, served by kilnd with its KV
cache kept in the session (CreateSessionRequest.state).

Nothing downloads here, so `write_random_model` makes the GGUF file: random but
deterministic weights, the matmuls as q4_k and q8_0 blocks encoded below from
the GGUF spec (ggml-common.h / ggml-quants.c), the norms in f32, llama.cpp's
tensor names (token_embd.weight, blk.N.attn_q.weight, ..., output.weight) and
metadata keys (llama.embedding_length, llama.attention.head_count_kv, ...).
`build_graph` reads only those keys and tensor infos, so a real llama GGUF of
this shape family (q8_0 / q4_0 / q4_k / q5_k / q6_k / f32 / f16 tensors) builds
the same graph.

The graph, per run (prefill: S = prompt length; decode: S = 1):
  inputs   tokens i32[1, S], positions i32[S] (the tokens' positions)
  params   the GGUF tensors, and cache f32[L, 2, Hkv, T, hd] (T = context length)
  outputs  next_token i32[1, 1] (greedy: ArgMax in the graph), cache_out (= the
           new cache; the session binds it to `cache`, so it never leaves kilnd)
The cache is written at `positions` without a scatter op: onehot[T, S] =
(iota_T == positions) picks each new row by a [T, S] @ [S, hd] matmul (exact:
one 1 per written row, the rest 0), and where(row written, new, cache) keeps the
others. For decode that is T*hd multiply-adds per head, far below the q4_k
matmuls; it needs no new IR op and works for any S, so prefill and decode are one
graph with a symbolic S. Attention takes a custom mask [1, S, T]: key j is seen
by query i when j <= positions[i] (rows past the end of the sequence are never
read). RoPE is llama.cpp's (rope type NORM: adjacent pairs, `interleaved`), at
the given positions.

Also here: a numpy reference of the same model (f64, weights dequantized from
the same bytes) and the GGUF reader used to build the graph.
"""

import struct

import numpy as np

# ggml type ids (ggml.h) and their blocks: (elements, bytes).
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 0, 1, 2, 8, 12, 13, 14
BLOCKS = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34),
          GGML_Q4_K: (256, 144), GGML_Q5_K: (256, 176), GGML_Q6_K: (256, 210)}
KILN_DTYPE = {GGML_F32: "f32", GGML_F16: "f16", GGML_Q4_0: "q4_0", GGML_Q8_0: "q8_0",
              GGML_Q4_K: "q4_k", GGML_Q5_K: "q5_k", GGML_Q6_K: "q6_k"}

# GGUF metadata value types.
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f",
           _BOOL: "<?", _U64: "<Q", _I64: "<q", _F64: "<d"}


# -- block encoders and decoders (numpy) -------------------------------------

def quantize_q8_0(x: np.ndarray) -> bytes:
    """Rows of x (the last dim a multiple of 32) as q8_0 blocks: d:f16, qs:i8[32];
    x = d * q (quantize_row_q8_0_ref)."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / 127).astype(np.float16)
    inv = np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0)
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.zeros((b.shape[0], 34), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_k(x: np.ndarray) -> bytes:
    """Rows of x (the last dim a multiple of 256) as q4_k super-blocks: d:f16,
    dmin:f16, scales:u8[12] (6-bit scale and min of 8 sub-blocks of 32), qs:u8[128];
    sub-block j is x = d*sc[j]*q - dmin*m[j], q in 0..15. Scales and mins are
    fitted per sub-block by min/max (simpler than ggml's search; any choice is a
    valid block, and the tests decode what was written)."""
    b = np.asarray(x, np.float32).reshape(-1, 8, 32).astype(np.float64)
    lo = np.minimum(b.min(axis=2), 0)                 # [n, 8], <= 0
    scale = (b.max(axis=2) - lo) / 15                 # [n, 8]
    mins = -lo
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = (mins.max(axis=1) / 63).astype(np.float16)
    dd, dm = d.astype(np.float64)[:, None], dmin.astype(np.float64)[:, None]
    sc = np.clip(np.rint(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(mins, dm, out=np.zeros_like(mins), where=dm > 0)), 0, 63)
    step = dd * sc
    q = np.rint(np.divide(b + (dm * m)[:, :, None], step[:, :, None],
                          out=np.zeros_like(b), where=step[:, :, None] > 0))
    q = np.clip(q, 0, 15).astype(np.uint8)            # [n, 8, 32]
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    scales = np.zeros((b.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)  # sub-blocks 2p low, 2p+1 high
    out = np.zeros((b.shape[0], 144), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = scales
    out[:, 16:] = qs
    return out.tobytes()


def dequantize(ggml_type: int, data: bytes, shape) -> np.ndarray:
    """The f64 values of a tensor's bytes (exact: every block value is an f16 times
    small integers). `shape` in Kiln's order (GGUF's ne reversed)."""
    raw = np.frombuffer(data, np.uint8)
    if ggml_type == GGML_F32:
        return raw.view("<f4").astype(np.float64).reshape(shape)
    if ggml_type == GGML_F16:
        return raw.view("<f2").astype(np.float64).reshape(shape)
    if ggml_type == GGML_Q8_0:
        blk = raw.reshape(-1, 34)
        d = blk[:, 0:2].copy().view("<f2").astype(np.float64)
        return (d * blk[:, 2:].view(np.int8)).reshape(shape)
    if ggml_type == GGML_Q4_K:
        blk = raw.reshape(-1, 144)
        d = blk[:, 0:2].copy().view("<f2").astype(np.float64)
        dmin = blk[:, 2:4].copy().view("<f2").astype(np.float64)
        s = blk[:, 4:16].astype(np.int64)
        sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
        m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
        qs = blk[:, 16:].reshape(-1, 4, 32).astype(np.int64)
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)
        return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * m[:, :, None]).reshape(shape)
    raise NotImplementedError(f"ggml type {ggml_type}: the reference decodes f32, f16, q8_0, q4_k")


# -- GGUF v3 writer and reader ------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(v):
    if isinstance(v, bool):
        return struct.pack("<I?", _BOOL, v)
    if isinstance(v, int):
        return struct.pack("<Ii", _I32, v) if -2**31 <= v < 2**31 else struct.pack("<Iq", _I64, v)
    if isinstance(v, float):
        return struct.pack("<If", _F32, v)
    if isinstance(v, str):
        return struct.pack("<I", _STR) + _str(v)
    if isinstance(v, (list, tuple)):
        if all(isinstance(e, str) for e in v):
            return struct.pack("<IIQ", _ARR, _STR, len(v)) + b"".join(_str(e) for e in v)
        return struct.pack("<IIQ", _ARR, _I32, len(v)) + struct.pack(f"<{len(v)}i", *v)
    raise TypeError(f"no GGUF metadata type for {type(v).__name__}")


def write_gguf(path, metadata: dict, tensors: list, alignment: int = 32):
    """`tensors`: (name, ggml_type, shape in Kiln's order, bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        head += _str(k) + _value(v)
    offset, infos, blobs = 0, b"", []
    for name, gtype, shape, data in tensors:
        ne = list(reversed(shape))
        infos += _str(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, gtype, offset)
        pad = (-len(data)) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    head += infos
    head += b"\0" * ((-len(head)) % alignment)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)


class GgufInfo:
    """Metadata, tensor infos and tensor bytes of a GGUF v2/v3 file (trusted:
    one this module wrote, or a model the caller chose; kilnd's own reader,
    engine/io/gguf.cc, is the one that treats files as hostile)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self.buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        self.pos = 4
        version, n_tensors, n_kv = self._take("<IQQ")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}")
        self.metadata = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._take("<I")
            self.metadata[key] = self._read(vtype)
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._string()
            (nd,) = self._take("<I")
            ne = self._take(f"<{nd}Q")
            gtype, off = self._take("<IQ")
            self.tensors[name] = (gtype, tuple(reversed(ne)), off)
        align = int(self.metadata.get("general.alignment", 32))
        self.data_start = self.pos + (-self.pos) % align

    def _take(self, fmt):
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return vals

    def _string(self):
        (n,) = self._take("<Q")
        s = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def _read(self, vtype):
        if vtype == _STR:
            return self._string()
        if vtype == _ARR:
            etype, n = self._take("<IQ")
            return [self._read(etype) for _ in range(n)]
        return self._take(_SCALAR[vtype])[0]

    def bytes(self, name) -> bytes:
        gtype, shape, off = self.tensors[name]
        elems, nbytes = BLOCKS[gtype]
        size = int(np.prod(shape)) // elems * nbytes
        return self.buf[self.data_start + off:self.data_start + off + size]

    def values(self, name) -> np.ndarray:
        gtype, shape, _ = self.tensors[name]
        return dequantize(gtype, self.bytes(name), shape)


# -- a random llama model -------------------------------------------------------

TINY = dict(layers=2, d_model=256, heads=4, kv_heads=2, ffn=512, vocab=512, context=128,
            rope_theta=10000.0, rms_eps=1e-5)


def write_random_model(path, config=None, seed=0):
    """A llama GGUF with random weights: attention and gate/up as q4_k, ffn_down
    and output as q8_0, token_embd and the norms f32. Returns the config."""
    c = dict(TINY, **(config or {}))
    rng = np.random.default_rng(seed)
    d, hd = c["d_model"], c["d_model"] // c["heads"]

    def mat(n, k, gtype):
        w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
        data = quantize_q4_k(w) if gtype == GGML_Q4_K else quantize_q8_0(w)
        return gtype, (n, k), data

    def f32(shape, scale=1.0, center=0.0):
        v = (center + scale * rng.standard_normal(shape)).astype(np.float32)
        return GGML_F32, tuple(shape), v.tobytes()

    tensors = [("token_embd.weight",) + f32((c["vocab"], d))]
    for i in range(c["layers"]):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight",) + f32((d,), 0.1, 1.0),
            (p + "attn_q.weight",) + mat(c["heads"] * hd, d, GGML_Q4_K),
            (p + "attn_k.weight",) + mat(c["kv_heads"] * hd, d, GGML_Q4_K),
            (p + "attn_v.weight",) + mat(c["kv_heads"] * hd, d, GGML_Q4_K),
            (p + "attn_output.weight",) + mat(d, c["heads"] * hd, GGML_Q4_K),
            (p + "ffn_norm.weight",) + f32((d,), 0.1, 1.0),
            (p + "ffn_gate.weight",) + mat(c["ffn"], d, GGML_Q4_K),
            (p + "ffn_up.weight",) + mat(c["ffn"], d, GGML_Q4_K),
            (p + "ffn_down.weight",) + mat(d, c["ffn"], GGML_Q8_0),
        ]
    tensors += [("output_norm.weight",) + f32((d,), 0.1, 1.0),
                ("output.weight",) + mat(c["vocab"], d, GGML_Q8_0)]
    metadata = {
        "general.architecture": "llama",
        "general.name": "kiln-tiny-llama (random weights)",
        "general.alignment": 32,
        "llama.vocab_size": c["vocab"],
        "llama.context_length": c["context"],
        "llama.embedding_length": d,
        "llama.block_count": c["layers"],
        "llama.feed_forward_length": c["ffn"],
        "llama.attention.head_count": c["heads"],
        "llama.attention.head_count_kv": c["kv_heads"],
        "llama.rope.dimension_count": hd,
        "llama.rope.freq_base": float(c["rope_theta"]),
        "llama.attention.layer_norm_rms_epsilon": float(c["rms_eps"]),
    }
    write_gguf(path, metadata, tensors)
    return c


# -- the model as read from a GGUF file ----------------------------------------

def config_of(info: GgufInfo) -> dict:
    m = info.metadata
    arch = m.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture is {arch!r}; this builder reads llama models")
    c = dict(layers=m["llama.block_count"], d_model=m["llama.embedding_length"],
             heads=m["llama.attention.head_count"],
             kv_heads=m.get("llama.attention.head_count_kv", m["llama.attention.head_count"]),
             ffn=m["llama.feed_forward_length"], context=m["llama.context_length"],
             rope_theta=float(m.get("llama.rope.freq_base", 10000.0)),
             rms_eps=float(m["llama.attention.layer_norm_rms_epsilon"]))
    c["vocab"] = info.tensors["token_embd.weight"][1][0]
    c["head_dim"] = c["d_model"] // c["heads"]
    c["rope_dim"] = m.get("llama.rope.dimension_count", c["head_dim"])
    return c


def cache_shape(c, context=None):
    return (c["layers"], 2, c["kv_heads"], context or c["context"], c["head_dim"])


def build_graph(info: GgufInfo, context=None):
    """The decoder as a kiln.Graph (see the module docstring). `context` caps the
    cache length T (default llama.context_length)."""
    import kiln  # the client package: only the graph needs it
    c = config_of(info)
    T, hd, hq, hkv = context or c["context"], c["head_dim"], c["heads"], c["kv_heads"]
    g = kiln.Graph("gguf_llama_decoder")
    tokens = g.input("tokens", "i32", [1, "seq"])
    positions = g.input("positions", "i32", ["seq"])
    params = {}
    for name, (gtype, shape, _) in info.tensors.items():
        if gtype not in KILN_DTYPE:
            raise ValueError(f"{name}: ggml type {gtype} is not one Kiln reads")
        params[name] = g.param(name, KILN_DTYPE[gtype], shape)
    cache = g.param("cache", "f32", cache_shape(c, T))

    def linear(x, name):
        return g.dequant_matmul(x, params[name], transpose_b=True)

    emb = params["token_embd.weight"]
    etype = info.tensors["token_embd.weight"][0]
    if etype in (GGML_F32,):
        x = g.gather(emb, tokens, axis=0)
    elif etype == GGML_F16:
        x = g.cast(g.gather(emb, tokens, axis=0), "f32")
    else:  # a quantized table: decoded whole, then gathered
        from kiln._proto.kiln.v1 import graph_pb2
        attrs = graph_pb2.Attrs()
        attrs.dequantize.SetInParent()
        deq = g.node("dequantize", [emb], attrs)
        x = g.gather(deq, tokens, axis=0)                            # [1, S, D]

    iota = g.constant(np.arange(T, dtype=np.int32))
    seen = g.compare("le", g.reshape(iota, [1, T]), g.reshape(positions, [-1, 1]))  # [S, T]
    mask = g.reshape(seen, [1, -1, T])                                # [1, S, T]
    onehot_b = g.compare("eq", g.reshape(iota, [T, 1]), g.reshape(positions, [1, -1]))  # [T, S]
    onehot = g.cast(onehot_b, "f32")
    written = g.compare("gt", g.reduce_sum(onehot, axes=[1], keepdims=True), 0.0)  # [T, 1]

    def heads(y, n):  # [1, S, n*hd] -> [1, n, S, hd]
        return g.transpose(g.reshape(y, [1, -1, n, hd]), [0, 2, 1, 3])

    def rope(y):
        return g.rope(y, positions, theta=c["rope_theta"], interleaved=True,
                      rotary_dim=0 if c["rope_dim"] == hd else c["rope_dim"])

    layers_out = []
    for i in range(c["layers"]):
        p = f"blk.{i}."
        h = g.rms_norm(x, params[p + "attn_norm.weight"], epsilon=c["rms_eps"])
        q = rope(heads(linear(h, p + "attn_q.weight"), hq))
        k = rope(heads(linear(h, p + "attn_k.weight"), hkv))
        v = heads(linear(h, p + "attn_v.weight"), hkv)
        kv = []
        for j, new in enumerate((k, v)):
            old = g.reshape(g.slice(cache, [i, j], [i + 1, j + 1], axes=[0, 1]), [1, hkv, T, hd])
            placed = g.matmul(onehot, new)                            # [1, Hkv, T, hd]
            kv.append(g.where(written, placed, old))
        a = g.attention(q, kv[0], kv[1], mask="custom", mask_operand=mask)  # [1, Hq, S, hd]
        a = g.reshape(g.transpose(a, [0, 2, 1, 3]), [1, -1, hq * hd])
        x = x + linear(a, p + "attn_output.weight")
        h = g.rms_norm(x, params[p + "ffn_norm.weight"], epsilon=c["rms_eps"])
        gate = g.activation("silu", linear(h, p + "ffn_gate.weight"))
        x = x + linear(gate * linear(h, p + "ffn_up.weight"), p + "ffn_down.weight")
        layers_out.append(g.reshape(g.concat(kv, axis=0), [1, 2, hkv, T, hd]))
    g.output("cache_out", g.concat(layers_out, axis=0))
    last = g.slice(x, [-1], [2**62], axes=[1])                      # [1, 1, D]
    h = g.rms_norm(last, params["output_norm.weight"], epsilon=c["rms_eps"])
    head = "output.weight" if "output.weight" in info.tensors else "token_embd.weight"  # tied
    if info.tensors[head][0] in (GGML_F32, GGML_F16):
        logits = g.matmul(h, g.cast(params[head], "f32"), transpose_b=True)
    else:
        logits = linear(h, head)                                     # [1, 1, V]
    nxt = g.argmax(logits, axis=-1)                                  # [1, 1]
    g.output("next_token", g.cast(nxt, "i32"))
    return g


# -- the numpy reference ---------------------------------------------------------

class Reference:
    """The same model in numpy f64 (weights dequantized from the file's bytes),
    with a KV cache, for the tests and the benchmark's correctness check."""

    def __init__(self, info: GgufInfo, context=None):
        self.c = c = config_of(info)
        self.T = context or c["context"]
        self.w = {name: info.values(name) for name in info.tensors}
        self.cache = np.zeros(cache_shape(c, self.T))
        hd, rd = c["head_dim"], c["rope_dim"]
        self.inv_freq = c["rope_theta"] ** (-np.arange(0, rd, 2) / rd)

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.c["rms_eps"]) * w

    def _rope(self, y, pos):  # y [H, S, hd], pairs (2i, 2i+1)
        rd = self.c["rope_dim"]
        ang = pos[:, None] * self.inv_freq[None, :]                 # [S, rd/2]
        cos, sin = np.cos(ang), np.sin(ang)
        out = y.copy()
        a, b = y[..., 0:rd:2], y[..., 1:rd:2]
        out[..., 0:rd:2] = a * cos - b * sin
        out[..., 1:rd:2] = a * sin + b * cos
        return out

    def step(self, tokens, pos0):
        """Runs tokens at positions pos0.. ; returns (next token, top-2 margin)."""
        c, w = self.c, self.w
        hd, hq, hkv = c["head_dim"], c["heads"], c["kv_heads"]
        pos = np.arange(pos0, pos0 + len(tokens))
        x = w["token_embd.weight"][np.asarray(tokens)]               # [S, D]
        for i in range(c["layers"]):
            p = f"blk.{i}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope((h @ w[p + "attn_q.weight"].T).reshape(-1, hq, hd).transpose(1, 0, 2), pos)
            k = self._rope((h @ w[p + "attn_k.weight"].T).reshape(-1, hkv, hd).transpose(1, 0, 2), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(-1, hkv, hd).transpose(1, 0, 2)
            self.cache[i, 0][:, pos] = k
            self.cache[i, 1][:, pos] = v
            n = pos[-1] + 1
            ks = np.repeat(self.cache[i, 0][:, :n], hq // hkv, axis=0)  # [Hq, n, hd]
            vs = np.repeat(self.cache[i, 1][:, :n], hq // hkv, axis=0)
            s = q @ ks.transpose(0, 2, 1) / np.sqrt(hd)               # [Hq, S, n]
            s = np.where(np.arange(n)[None, None, :] <= pos[None, :, None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ vs                   # [Hq, S, hd]
            x = x + a.transpose(1, 0, 2).reshape(len(pos), hq * hd) @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        h = self._rms(x[-1], w["output_norm.weight"])
        logits = h @ w.get("output.weight", w["token_embd.weight"]).T
        top = np.sort(logits)[-2:]
        return int(np.argmax(logits)), float(top[1] - top[0])

    def generate(self, prompt, n):
        """Greedy: the prompt then n tokens; returns (tokens, smallest margin)."""
        tok, margin = self.step(prompt, 0)
        out, pos = [tok], len(prompt)
        for _ in range(n - 1):
            tok, m = self.step([tok], pos)
            out.append(tok)
            margin = min(margin, m)
            pos += 1
        return out, margin


# -- a model repository version directory ---------------------------------------

def write_model_dir(version_dir, seed=0, config=None, context=None):
    """DIR/<model>/<version>/: model.gguf (the weights), model.pb (the graph as a
    binary kiln.v1.Graph) and state.npz (the zero KV cache `cache`, so the
    repository finds every param). Returns (config, GgufInfo)."""
    import os
    os.makedirs(version_dir, exist_ok=True)
    gguf = os.path.join(version_dir, "model.gguf")
    write_random_model(gguf, config, seed)
    info = GgufInfo(gguf)
    g = build_graph(info, context)
    with open(os.path.join(version_dir, "model.pb"), "wb") as f:
        f.write(g.proto().SerializeToString())
    np.savez(os.path.join(version_dir, "state.npz"),
             cache=np.zeros(cache_shape(config_of(info), context), np.float32))
    return config_of(info), info

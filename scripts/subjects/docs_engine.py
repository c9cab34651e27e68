"""A bit-identical engine written from the documents alone (numpy + the standard library).

docs/DESIGN.md §3.4 ("Every operation") and docs/subject-protocol.md are the only sources: this
file imports nothing of the project, and every f32 operation below is the one those documents
name, in their order (the step numbers in comments are that list's). CI gates it as a
BIT-IDENTICAL subject (scripts/subjects/docs_engine.toml) on `tiny`, on `edge`, on a battery
long enough for two attention partitions and on the odd shapes of scripts/subjects/odd_model.py
(scripts/subjects/check-docs-engine.sh) — the proof that the documents are a complete
specification of the canonical program — and in passes of several rows or columns
(docs/DESIGN.md §3.6; tests/cli/subject_rows.rs).

f32 arithmetic: numpy float32 arrays, every operation one IEEE single operation (numpy does not
contract a·b + c into an FMA, and keeps subnormals); every constant an explicit np.float32 built
from its bit pattern, never a Python float mixed into f32 arithmetic.
"""

import json
import os
import struct
import sys

import numpy as np

NAME = "docs-engine"
VERSION = "0.1.0"
PROTOCOL = 2  # speaks 1 and 2 (docs/subject-protocol.md, section 9): version 2 adds rows and columns
BATCH = (1, 2, 4, 8)  # sessions per pass it runs (its manifest's `batch`)
COLUMNS = (1, 2, 4, 8)  # consecutive tokens of one session per pass (its manifest's `columns`)
# Negative controls of tests/cli/subject_rows.rs, off unless this variable names one:
#   verify_partitions — a pass of T > 1 columns cuts attention into partitions of 32 >> T positions
#                       (a verify walk whose partition count depends on T);
#   causality — a column also attends to the key of the column after it (a mask off by one).
PLANT = os.environ.get("DOCS_ENGINE_PLANT", "")
LAYER_SEAMS = ["attn_norm", "qkv", "rope", "attn", "o_proj", "o_join", "ffn_norm", "router",
               "experts", "moe_join", "residual"]
HEAD_SEAMS = ["final_norm", "logits"]
F32 = np.float32
U64 = np.uint64


def fbits(b):
    """The f32 whose bit pattern is `b`."""
    return np.array([b], dtype=np.uint32).view(np.float32)[0]


ZERO = F32(0.0)
ONE = fbits(0x3F800000)
LOG2E = fbits(0x3FB8AA3B)
LN2_HI = fbits(0x3F317200)
LN2_LO = fbits(0x35BFBE8E)
MAGIC = fbits(0x4B400000)
EXP_OVER = fbits(0x42B17217)
EXP_UNDER = fbits(0xC2D00000)
EXP_P = [fbits(b) for b in (0x39506967, 0x3AB743CE, 0x3C088908, 0x3D2AA9C1, 0x3E2AAAAA, 0x3F000000)]
ATTN_SCALE = fbits(0x3DB504F3)
PARTITION = 32
HEAD_DIM = 128


# ---- the canonical operations (docs/DESIGN.md §3.4, "Every operation") ------------------------

def butterfly32(v):
    """Step 1's butterfly over the last axis (32 lanes): v[l] = v[l] + v[l + o], o = 16 … 1."""
    o = 16
    while o > 0:
        v = v[..., :o] + v[..., o:2 * o]
        o //= 2
    return v[..., 0]


def lanes(products, width):
    """Step 1's lane accumulation over the last axis (`width` elements, a multiple of 32): lane l
    adds its elements l, l+32, … in order from +0.0; returns the 32 lanes."""
    p = products.reshape(products.shape[:-1] + (width // 32, 32))
    acc = np.zeros(products.shape[:-1] + (32,), dtype=F32)
    for j in range(width // 32):
        acc = acc + p[..., j, :]
    return acc


def dot32(w, x):
    """Step 1 over the last axis of w · x (broadcast)."""
    return dot_products((w * x).astype(F32, copy=False))


def dot_products(prod):
    """Step 1 over the last axis of already rounded products (any length)."""
    n = prod.shape[-1]
    if n % 32:
        # Padding lanes with +0.0 changes nothing: a lane that started at +0.0 is never −0.0.
        pad = np.zeros(prod.shape[:-1] + (32 - n % 32,), dtype=F32)
        prod = np.concatenate([prod, pad], axis=-1)
        n = prod.shape[-1]
    return butterfly32(lanes(prod, n))


def sum_squares256(x):
    """Step 2 over a row."""
    n = x.shape[0]
    sq = x * x
    if n % 256:
        sq = np.concatenate([sq, np.zeros(256 - n % 256, dtype=F32)])
    acc = np.zeros(256, dtype=F32)
    for row in sq.reshape(-1, 256):
        acc = acc + row
    s = butterfly32(acc.reshape(8, 32))
    s = s[:4] + s[4:8]
    s = s[:2] + s[2:4]
    return s[0] + s[1]


def rmsnorm_row(x, w, eps):
    """Step 3, a model row."""
    ss = sum_squares256(x)
    d = ss / F32(x.shape[0])
    d = d + eps
    inv = ONE / np.sqrt(d)
    return (x * inv) * w


def rmsnorm_heads(x, w, eps):
    """Step 3, each head (rows of 128) with dot32."""
    ss = dot32(x, x)
    d = ss / F32(HEAD_DIM)
    d = d + eps
    inv = ONE / np.sqrt(d)
    return (x * inv[:, None]) * w


def exp_c(x):
    """Step 4, elementwise over an f32 array."""
    x = np.asarray(x, dtype=F32)
    nan, over, under = np.isnan(x), x > EXP_OVER, x < EXP_UNDER
    xs = np.where(nan | over | under, ZERO, x).astype(F32)
    t = xs * LOG2E
    nf = (t + MAGIC) - MAGIC
    n = nf.astype(np.int32)
    r = (xs - nf * LN2_HI) - nf * LN2_LO
    z = r * r
    p = np.full_like(r, EXP_P[0])
    for c in EXP_P[1:]:
        p = p * r + c
    y = ((p * z) + r) + ONE
    n1 = np.where(n < 0, -((-n) // 2), n // 2).astype(np.int32)
    n2 = n - n1
    res = (y * pow2(n1)) * pow2(n2)
    res = np.where(under, ZERO, res)
    res = np.where(over, F32(np.inf), res)
    return np.where(nan, x, res).astype(F32)


def pow2(k):
    """2^k as the exact f32 with exponent field k + 127."""
    return ((k.astype(np.int64) + 127) << 23).astype(np.uint32).view(F32)


def sigmoid_c(x):
    """Step 5."""
    return ONE / (ONE + exp_c(-x))


def silu_c(x):
    """Step 5 (silu_c(−inf) = −0.0)."""
    y = x / (ONE + exp_c(-x))
    return np.where(x == F32(-np.inf), F32(-0.0), y).astype(F32)


def swiglu(g, u, limit):
    """Step 6."""
    s = silu_c(g)
    if limit is None:
        return s * u
    s = np.where(s > limit, limit, s).astype(F32)
    u = np.where(u > limit, limit, np.where(u < -limit, -limit, u)).astype(F32)
    return s * u


def fold(parts):
    """Fold from +0.0 along the first axis."""
    acc = np.zeros(parts.shape[1:], dtype=F32)
    for p in parts:
        acc = acc + p
    return acc


class Matrix:
    """A weight matrix [out][in] with its canonical K-blocks (step 7)."""

    def __init__(self, values, scales=None):
        self.w = values  # f32 values (BF16 widened, or E4M3 decoded without the block scale)
        self.scales = scales  # E4M3: [ceil(out/128)][in/128]
        self.out, self.inn = values.shape
        if scales is None:
            if self.inn % 8:
                raise ValueError("BF16 in_features %d is not divisible into 8 K-blocks" % self.inn)
            self.g = 8
        else:
            if self.inn % 128:
                raise ValueError("E4M3 in_features %d is not whole 128-column blocks" % self.inn)
            nb = self.inn // 128
            self.g = next(g for g in (8, 4, 2, 1) if nb % g == 0)
            rows = np.arange(self.out) // 128
            self.row_scales = scales[rows]  # [out][in/128]

    def partials(self, x):
        """[G][out] for an input x [in]; [G][B][out] for the B rows of a pass, x [B][in] (one
        product matrix [B][out][in]: every row's operations are a single row's, elementwise)."""
        lead = x.shape[:-1]
        prod = self.w * x[..., None, :]  # [..][out][in]
        if self.scales is None:
            kw = self.inn // self.g
            return np.moveaxis(dot_products(prod.reshape(lead + (self.out, self.g, kw))), -1, 0).copy()
        nb = self.inn // 128
        blocks = butterfly32(lanes(prod.reshape(lead + (self.out, nb, 128)), 128))  # [..][out][nb]
        sp = self.row_scales * blocks
        per = nb // self.g
        sp = sp.reshape(lead + (self.out, self.g, per))
        acc = np.zeros(lead + (self.out, self.g), dtype=F32)
        for j in range(per):
            acc = acc + sp[..., j]
        return np.moveaxis(acc, -1, 0).copy()

    def rows(self, x):
        """Every row: the fold from +0.0 of its G partials ([out], or [B][out] for x [B][in])."""
        return fold(self.partials(x))


# ---- the model file (docs/subject-protocol.md, section 4.1) -------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
                  for k, v in header.items()}


def e4m3_table():
    """The f32 value of every E4M3 code (subnormal m/8·2^−6, normal (1 + m/8)·2^(e−7))."""
    vals = []
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
        if e == 0xF and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        vals.append(-v if s else v)
    return np.array(vals, dtype=F32)


class Model:
    def __init__(self, path):
        meta, t = read_safetensors(path)
        if meta.get("memra.format") != "memra-model" or meta.get("memra.format_version") != "1":
            raise ValueError("%s is not a memra-model version 1 file" % path)
        self.c = c = json.loads(meta["memra.config"])
        self.t = t
        self.lut = e4m3_table()
        self.eps = F32(c["eps"])
        self.limit = None if c["swiglu_limit"] is None else F32(c["swiglu_limit"])
        # Layers listed in `unclamped_layers` (absent: none) have no SwiGLU clamp.
        self.unclamped = set(c.get("unclamped_layers", []))
        self.route_scale = F32(c["route_scale"])
        self.embed = self.bf16("embed.weight")
        self.lm_head = Matrix(self.bf16("lm_head.weight"))
        self.final_norm = self.f32("final_norm.weight")
        self.layers = []
        for i in range(c["layers"]):
            p = "layers.%d." % i
            L = {
                "attn_norm": self.f32(p + "attn_norm.weight"), "ffn_norm": self.f32(p + "ffn_norm.weight"),
                "q": Matrix(self.bf16(p + "attn.q.weight")), "k": Matrix(self.bf16(p + "attn.k.weight")),
                "v": Matrix(self.bf16(p + "attn.v.weight")), "gate": Matrix(self.bf16(p + "attn.gate.weight")),
                "o": Matrix(self.bf16(p + "attn.o.weight")),
                "q_norm": self.f32(p + "attn.q_norm.weight"), "k_norm": self.f32(p + "attn.k_norm.weight"),
                "router": Matrix(self.bf16(p + "router.weight")), "bias": self.f32(p + "router.bias"),
                "experts": [self.expert(p + "experts.%d." % e) for e in range(c["experts"])],
                "shared": self.expert(p + "shared."),
            }
            self.layers.append(L)

    def raw(self, name, dtype):
        dt, shape, data = self.t[name]
        if dt != dtype:
            raise ValueError("tensor %s is %s, expected %s" % (name, dt, dtype))
        return shape, data

    def f32(self, name):
        shape, data = self.raw(name, "F32")
        return np.frombuffer(data, dtype="<f4").astype(F32).reshape(shape)

    def bf16(self, name):
        shape, data = self.raw(name, "BF16")
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(F32).reshape(shape)

    def e4m3(self, name):
        shape, data = self.raw(name, "F8_E4M3")
        codes = np.frombuffer(data, dtype=np.uint8).reshape(shape)
        return Matrix(self.lut[codes], self.f32(name + "_scale"))

    def expert(self, p):
        return {w: self.e4m3(p + w + ".weight") for w in ("gate", "up", "down")}

    def rope_row(self, pos):
        """Step 10's table row: f64 angle, glibc cos/sin (Python's math), each rounded to f32."""
        import math
        theta = float(F32(self.c["rope_theta"]))
        ang = [float(pos) * math.pow(theta, -(2.0 * i) / 128.0) for i in range(64)]
        return (np.array([math.cos(a) for a in ang], dtype=F32), np.array([math.sin(a) for a in ang], dtype=F32))


# ---- the seam digest (docs/subject-protocol.md, section 4.4) ------------------------------------------

def splitmix64(z):
    z = z + U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def digest(bits, base=0):
    """Wrapping sum of splitmix64((index << 32) | bits), global index from `base`."""
    bits = np.asarray(bits, dtype=np.uint32).astype(U64)
    idx = np.arange(base, base + bits.shape[0], dtype=U64)
    with np.errstate(over="ignore"):
        return int(np.sum(splitmix64((idx << U64(32)) | bits), dtype=U64))


def f32_bits(x):
    return np.ascontiguousarray(x, dtype=F32).view(np.uint32)


# ---- the decode step (docs/DESIGN.md §3.2, §3.4 steps 8–17) ----------------------------------

class Session:
    """One prompt's decode (docs/subject-protocol.md, section 4.2): its KV cache (per layer, entry j the
    key and value of position j), the step it computes next, and what the tape gets for it — per
    step the seam digests and the (pass, lane) that computed it, the generated tokens and their
    top-two logits."""

    def __init__(self, p, prompt, gen, n_layers, n_cols):
        self.p, self.prompt = p, prompt
        self.steps = len(prompt) + gen - 1
        self.step = 0
        self.kc = [[] for _ in range(n_layers)]
        self.vc = [[] for _ in range(n_layers)]
        self.digests = np.zeros((self.steps, n_cols), dtype="<u8")
        self.lanes = np.zeros((self.steps, 2), dtype="<u4")
        self.generated, self.top2 = [], []

    def token(self, forced, step=None):
        """The token fed at `step` (default: this step): the prompt's, then the forced tape's or
        its own."""
        step = self.step if step is None else step
        n = len(self.prompt)
        if step < n:
            return self.prompt[step]
        j = step - n
        return forced[self.p][j] if forced is not None else self.generated[j]


class Engine:
    def __init__(self, model, battery):
        self.m = model
        self.c = model.c
        self.capture_set = {(k["prompt"], k["step"], k["layer"], k["seam"]) for k in battery["capture"]}
        self.captures = {}
        self.rope = {}

    def seam(self, lane, layer, name, bits, base_blocks=None):
        """Digest (and capture when asked) one seam of a lane — (session, step) — the logical
        tensor given as 32-bit patterns; `base_blocks` = [(global offset, bits)] for a tensor with
        elements outside every part. A rejected column's seams are written too, and written again
        when the next pass computes its step as column 0."""
        s, step = lane
        col = self.columns.index("L%d.%s" % (layer, name))
        if base_blocks is None:
            d = digest(bits)
        else:
            d = 0
            for base, b in base_blocks:
                d = (d + digest(b, base)) % (1 << 64)
        s.digests[step, col] = d
        if (s.p, step, layer, name) in self.capture_set:
            self.captures["capture.p%d.s%d.L%d.%s" % (s.p, step, layer, name)] = \
                np.ascontiguousarray(bits, dtype=np.uint32).astype("<u4").tobytes()

    def rope_table(self, pos):
        if pos not in self.rope:
            self.rope[pos] = self.m.rope_row(pos)
        return self.rope[pos]

    def layer(self, i, X, lanes):
        """One layer for the lanes of a pass: X [n][hidden], lane r = (session, step) its input at
        that step (position). Rows are n sessions at their own steps; columns are n consecutive
        steps of one session. The dense projections take all lanes at once (one product matrix
        per weight); attention and the routed experts are each lane's own."""
        c, m, L = self.c, self.m, self.m.layers[i]
        eps = m.eps
        qh, kvh, hidden = c["q_heads"], c["kv_heads"], c["hidden"]
        # attn_norm (step 3)
        A = np.stack([rmsnorm_row(x, L["attn_norm"], eps) for x in X])
        for r, ln in enumerate(lanes):
            self.seam(ln, i, "attn_norm", f32_bits(A[r]))
        # qkv (step 9)
        Q, K, V, G = L["q"].rows(A), L["k"].rows(A), L["v"].rows(A), L["gate"].rows(A)
        qrs = []
        for r, (s, step) in enumerate(lanes):
            q, k, v, g = Q[r], K[r], V[r], G[r]
            self.seam((s, step), i, "qkv", f32_bits(np.concatenate([q, k, v, g])))
            # rope (step 10)
            cos, sin = self.rope_table(step)
            qr = self.rope_heads(q.reshape(qh, HEAD_DIM), L["q_norm"], cos, sin)
            kr = self.rope_heads(k.reshape(kvh, HEAD_DIM), L["k_norm"], cos, sin)
            self.seam((s, step), i, "rope", f32_bits(np.concatenate([qr.ravel(), kr.ravel()])))
            # The pass writes every lane's KV entry at its position before any lane attends.
            if len(s.kc[i]) != step:
                raise RuntimeError("p%d s%d: the cache holds %d positions of layer %d, the entry goes at %d"
                                   % (s.p, step, len(s.kc[i]), i, step))
            s.kc[i].append(kr)
            s.vc[i].append(v.reshape(kvh, HEAD_DIM))
            qrs.append(qr)
        # attn (step 11): each lane over its session's positions 0..step — causal in a pass of
        # columns — with the single-token step's partitions at that length.
        att = np.zeros((len(lanes), qh * HEAD_DIM), dtype=F32)
        for r, (s, step) in enumerate(lanes):
            n = step + 1
            if PLANT == "causality" and n < len(s.kc[i]):
                n += 1  # the planted defect: the next column's key leaks into this one
            att[r] = self.attention(qrs[r], np.stack(s.kc[i][:n], axis=1), np.stack(s.vc[i][:n], axis=1), G[r])
            self.seam((s, step), i, "attn", f32_bits(att[r]))
        # o_proj, o_join (step 12)
        op = L["o"].partials(att)  # [G_o][B][hidden]
        for r, ln in enumerate(lanes):
            self.seam(ln, i, "o_proj", f32_bits(op[:, r].ravel()))
        oj = fold(op)  # [B][hidden]
        for r, ln in enumerate(lanes):
            self.seam(ln, i, "o_join", f32_bits(oj[r]))
        # ffn_norm (step 13)
        H = X + oj
        XN = np.stack([rmsnorm_row(h, L["ffn_norm"], eps) for h in H])
        for r, ln in enumerate(lanes):
            self.seam(ln, i, "ffn_norm", f32_bits(np.concatenate([H[r], XN[r]])))
        # router (step 14): the router projection over all lanes, the selection per lane
        R = L["router"].rows(XN)
        out = np.zeros_like(X)
        for r, ln in enumerate(lanes):
            out[r] = self.moe(i, ln, H[r], XN[r], R[r])
        return out

    def moe(self, i, s, h, xn, logits):
        """Steps 14–16 for one lane `s` = (session, step): the routed experts are the lane's own."""
        m, L, hidden = self.m, self.m.layers[i], self.c["hidden"]
        ids, w = self.route(L, logits)
        self.seam(s, i, "router", np.concatenate([np.array(ids, dtype=np.uint32), f32_bits(w)]))
        # experts (step 15)
        slots = [L["experts"][e] for e in ids] + [L["shared"]]
        gmax = max(L["experts"][0]["down"].g, L["shared"]["down"].g)
        stride = gmax * hidden
        parts, blocks = [], []
        full = np.zeros(len(slots) * stride, dtype=np.uint32)
        for k, ex in enumerate(slots):
            act = swiglu(ex["gate"].rows(xn), ex["up"].rows(xn), None if i in m.unclamped else m.limit)
            p = ex["down"].partials(act)  # [G][hidden]
            parts.append(p)
            b = f32_bits(p.ravel())
            blocks.append((k * stride, b))
            full[k * stride:k * stride + b.shape[0]] = b
        self.seam(s, i, "experts", full, blocks)
        # moe_join (step 16)
        ys = [fold(p) for p in parts]
        routed = np.zeros(hidden, dtype=F32)
        for k in range(len(ids)):
            routed = routed + w[k] * ys[k]
        shared = ys[-1]
        self.seam(s, i, "moe_join", f32_bits(np.concatenate([routed, shared])))
        # residual (step 16)
        out = h + (routed + shared)
        self.seam(s, i, "residual", f32_bits(out))
        return out

    def rope_heads(self, x, w, cos, sin):
        n = rmsnorm_heads(x, w, self.m.eps)
        a, b = n[:, :64], n[:, 64:]
        return np.concatenate([(a * cos) - (b * sin), (b * cos) + (a * sin)], axis=1)

    def attention(self, q, K, V, gate):
        """Step 11. q [qh][128]; K, V [kvh][len][128]; gate [qh]."""
        part = PARTITION >> self.columns_per_pass if PLANT == "verify_partitions" and self.columns_per_pass > 1 \
            else PARTITION
        qh, kvh = q.shape[0], K.shape[0]
        group = qh // kvh
        Kq = K[np.arange(qh) // group]  # [qh][len][128]
        Vq = V[np.arange(qh) // group]
        s = dot32(Kq, q[:, None, :]) * ATTN_SCALE  # [qh][len]
        length = s.shape[1]
        ms, ls, os_ = [], [], []
        for start in range(0, length, part):
            sp = s[:, start:start + part]
            mj = max_in_order(sp)
            e = exp_c(sp - mj[:, None])
            lj = np.zeros(qh, dtype=F32)
            oj = np.zeros((qh, HEAD_DIM), dtype=F32)
            for t in range(sp.shape[1]):
                lj = lj + e[:, t]
                oj = oj + e[:, t:t + 1] * Vq[:, start + t, :]
            ms.append(mj)
            ls.append(lj)
            os_.append(oj)
        M = max_in_order(np.stack(ms, axis=1))
        Lsum = np.zeros(qh, dtype=F32)
        O = np.zeros((qh, HEAD_DIM), dtype=F32)
        for mj, lj, oj in zip(ms, ls, os_):
            cj = exp_c(mj - M)
            Lsum = Lsum + lj * cj
            O = O + oj * cj[:, None]
        out = O / Lsum[:, None]
        out = out * sigmoid_c(gate)[:, None]
        return out.ravel()

    def route(self, L, logits):
        """Step 14, from the router projection's row of logits."""
        c = self.c
        scores = sigmoid_c(logits)
        keys = scores + L["bias"]
        taken = [False] * len(keys)
        ids = []
        for _ in range(c["top_k"]):
            best = None
            for e in range(len(keys)):
                if taken[e]:
                    continue
                if best is None or beats(keys[e], keys[best]):
                    best = e
            taken[best] = True
            ids.append(best)
        w = np.array([scores[e] for e in ids], dtype=F32)
        if c["route_norm"]:
            total = ZERO
            for v in w:
                total = F32(total + v)
            w = w / total
        return ids, (w * self.m.route_scale).astype(F32)

    def head(self, X, lanes):
        """Step 17 for the lanes of a pass: per lane its token and (top-1, top-2) logits."""
        n = self.c["layers"]
        FN = np.stack([rmsnorm_row(x, self.m.final_norm, self.m.eps) for x in X])
        LOG = self.m.lm_head.rows(FN)  # [B][vocab]
        out = []
        for r, ln in enumerate(lanes):
            self.seam(ln, n, "final_norm", f32_bits(FN[r]))
            logits = LOG[r]
            self.seam(ln, n, "logits", f32_bits(logits))
            best, a, b = None, float("-inf"), float("-inf")
            for i, v in enumerate(logits.tolist()):
                if v != v:
                    continue
                if best is None or v > logits[best]:
                    best = i
                if v > a:
                    a, b = v, a
                elif v > b:
                    b = v
            out.append(((0 if best is None else best), (a, b)))
        return out


def beats(cand, best):
    """Step 14's comparison: NaN never replaces a number, a number always replaces NaN."""
    if np.isnan(cand):
        return False
    if np.isnan(best):
        return True
    return bool(cand > best)


def max_in_order(s):
    """Per row of s [rows][n]: m = s[0]; if s[t] > m { m = s[t] }."""
    m = s[:, 0].copy()
    for t in range(1, s.shape[1]):
        m = np.where(s[:, t] > m, s[:, t], m).astype(F32)
    return m


# ---- the protocol (docs/subject-protocol.md, sections 3, 4.2 and 5) -------------------------------------

def need(name):
    v = os.environ.get(name, "")
    if v == "":
        raise SystemExit("%s is not set: this program is started by memra-gates (run --subject)" % name)
    return v


def write_tape(path, tensors, meta):
    """safetensors: {name: (dtype, shape, bytes)} in name order, header padded to 8 bytes."""
    header = {"__metadata__": {"memra.format": "memra-tape", "memra.format_version": "1",
                               "memra.tape": json.dumps(meta)}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2])
    os.replace(tmp, path)


def row_passes(prompts, gen, b):
    """Rows (docs/DESIGN.md §3.6, docs/subject-protocol.md, section 4.2): b lanes, each holding one
    session at a time and advancing it one token per pass; lane j takes its first session at pass
    j (ragged starts), a lane whose session ends takes the next prompt. Yields (pass, [(lane,
    prompt)]) for the live lanes of each pass. b = 1 is single-token decode, prompt by prompt."""
    queue = list(range(len(prompts)))
    slots = [None] * b  # [prompt, steps left]
    pss = 0
    while True:
        for j in range(b):
            if slots[j] is None and pss >= j and queue:
                p = queue.pop(0)
                slots[j] = [p, len(prompts[p]) + gen - 1]
        live = [(j, sl[0]) for j, sl in enumerate(slots) if sl is not None]
        if not live:
            return
        yield pss, live
        for j, _ in live:
            slots[j][1] -= 1
            if slots[j][1] == 0:
                slots[j] = None
        pss += 1


def pass_shape(battery):
    """The battery file's pass shape (version 2), or single-token (version 1)."""
    version = battery.get("version")
    if version == 1 and "pass" not in battery:
        return 1, 1
    if version != 2 or not isinstance(battery.get("pass"), dict):
        raise SystemExit("the battery file is not memra-battery version 1, or version 2 with a pass")
    b, t = battery["pass"].get("batch"), battery["pass"].get("columns")
    if b not in BATCH or t not in COLUMNS or (b > 1 and t > 1):
        raise SystemExit("docs-engine runs rows %s or columns %s, never both (asked: batch %r, columns %r)"
                         % (BATCH, COLUMNS, b, t))
    return b, t


def draft(context):
    """The drafter of a verify pass without a forced tape (the runtime's): the token that followed
    the last earlier occurrence of the context's last token (prompt lookup), else that token
    again. It decides only how many columns are accepted, never what a column computes."""
    last = context[-1]
    for i in range(len(context) - 2, -1, -1):
        if context[i] == last:
            return context[i + 1]
    return last


def column_passes(session, forced, t):
    """Columns (docs/DESIGN.md §3.6, docs/subject-protocol.md, section 9) of one session: yields the
    steps of each pass — the prompt prefilled t tokens per pass (a prefill pass holds prompt
    tokens only), then the last accepted token and up to t − 1 drafts (the forced tokens under
    teacher forcing) — with the tokens fed; the caller accepts columns and advances
    `session.step` before asking for the next pass."""
    n = len(session.prompt)
    while session.step < session.steps:
        base = session.step
        tokens = [session.token(forced)]
        context = (list(session.prompt) + list(session.generated))[:base + 1]
        while len(tokens) < t and base + len(tokens) < session.steps:
            step = base + len(tokens)
            if base < n:
                if step >= n:
                    break
                tokens.append(session.prompt[step])
            elif forced is not None:
                tokens.append(session.token(forced, step))
            else:
                d = draft(context)
                context.append(d)
                tokens.append(d)
        yield list(range(base, base + len(tokens))), tokens


def run_pass(model, eng, lanes, tokens):
    """One pass: every layer and the head for the lanes [(session, step)] fed `tokens`."""
    X = np.stack([model.embed[tok].astype(F32) for tok in tokens])  # step 8
    for i in range(model.c["layers"]):
        X = eng.layer(i, X, lanes)
    return eng.head(X, lanes)


def accept(s, step, pss, lane, tok, t2):
    """Lane `lane` of pass `pss` computed step `step` of session `s`: the tape gets it."""
    s.lanes[step] = (pss, lane)
    if step + 1 >= len(s.prompt):
        s.generated.append(tok)
        s.top2.append(t2)
    s.step = step + 1


def decode_rows(model, eng, sessions, forced, gen, b):
    """The battery in passes of b rows (b = 1: single-token decode); returns (steps, passes)."""
    steps = passes = 0
    prompts = [s.prompt for s in sessions]
    for pss, live in row_passes(prompts, gen, b):
        lanes = [(sessions[p], sessions[p].step) for _, p in live]
        out = run_pass(model, eng, lanes, [s.token(forced) for s, _ in lanes])
        for (lane, _), (s, step), (tok, t2) in zip(live, lanes, out):
            accept(s, step, pss, lane, tok, t2)
            steps += 1
        passes += 1
    return steps, passes


def decode_columns(model, eng, sessions, forced, t):
    """The battery in passes of up to t columns, one session at a time: column i is accepted
    while every draft before it equals the token the column before produced; a rejected column
    is thrown away (its KV entries are cut, its seams written again by the next pass, which
    computes its step as column 0). Returns (steps, passes, rejected columns)."""
    steps = passes = rejected = 0
    for s in sessions:
        for pass_steps, tokens in column_passes(s, forced, t):
            lanes = [(s, step) for step in pass_steps]
            out = run_pass(model, eng, lanes, tokens)
            for i, (step, (tok, t2)) in enumerate(zip(pass_steps, out)):
                if i > 0 and s.token(forced, step) != tokens[i]:
                    rejected += len(pass_steps) - i
                    for layer in range(len(s.kc)):
                        del s.kc[layer][step:]
                        del s.vc[layer][step:]
                    break
                accept(s, step, passes, i, tok, t2)
                steps += 1
            passes += 1
    return steps, passes, rejected


def main():
    protocol = need("MEMRA_SUBJECT_PROTOCOL")
    if protocol not in ("1", "2"):
        raise SystemExit("MEMRA_SUBJECT_PROTOCOL=%s: this subject speaks protocols 1 and 2" % protocol)
    tape_path = need("MEMRA_SUBJECT_TAPE")
    backend, tp, transport = need("MEMRA_SUBJECT_BACKEND"), need("MEMRA_SUBJECT_TP"), need("MEMRA_SUBJECT_TRANSPORT")
    if (backend, tp, transport) != ("host", "1", "host-bounce"):
        raise SystemExit("docs-engine runs host, TP1, host-bounce only (asked: %s, TP%s, %s)"
                         % (backend, tp, transport))
    with open(need("MEMRA_SUBJECT_BATTERY")) as f:
        battery = json.load(f)
    if battery.get("format") != "memra-battery":
        raise SystemExit("the battery file is not memra-battery")
    b, t = pass_shape(battery)
    model = Model(need("MEMRA_SUBJECT_MODEL"))
    c = model.c
    n_layers = c["layers"]
    columns = ["L%d.%s" % (l, s) for l in range(n_layers) for s in LAYER_SEAMS]
    columns += ["L%d.%s" % (n_layers, s) for s in HEAD_SEAMS]
    eng = Engine(model, battery)
    eng.columns = columns
    eng.columns_per_pass = t
    gen, forced, prompts = battery["gen_tokens"], battery["forced_tokens"], battery["prompts"]
    sessions = [Session(p, prompt, gen, n_layers, len(columns)) for p, prompt in enumerate(prompts)]
    census = {}
    if t > 1:
        steps_total, passes, rejected = decode_columns(model, eng, sessions, forced, t)
        census["docs_engine.rejected_columns"] = rejected
    else:
        steps_total, passes = decode_rows(model, eng, sessions, forced, gen, b)
    census.update({"docs_engine.steps": steps_total, "docs_engine.passes": passes})
    tensors = {}
    for s in sessions:
        p = s.p
        tensors["p%d.digests" % p] = ("U64", [s.steps, len(columns)], s.digests.tobytes())
        tensors["p%d.tokens" % p] = ("U32", [len(s.generated)], np.array(s.generated, dtype="<u4").tobytes())
        tensors["p%d.top2" % p] = ("F32", [len(s.top2), 2],
                                   np.array(s.top2, dtype="<f4").reshape(-1, 2).tobytes())
        if b > 1 or t > 1:
            tensors["p%d.lanes" % p] = ("U32", [s.steps, 2], s.lanes.tobytes())
    for name, raw in eng.captures.items():
        tensors[name] = ("F32", [len(raw) // 4], raw)
    meta = {"subject": NAME, "subject_version": VERSION, "layers": n_layers, "seams": columns,
            "engaged_doors": [], "census": census,
            "backend": "numpy %s (f32, no FMA) on the host" % np.__version__, "build_options": [],
            "capture_owners": {}, "error": None}
    write_tape(tape_path, tensors, meta)


if __name__ == "__main__":
    main()

"""A foreign engine for memra-gates: the decode step of docs/DESIGN.md §3.2 written in PyTorch,
reading the same memra-model safetensors file, speaking the subject protocol
(docs/subject-protocol.md; the manifest is scripts/subjects/torch.toml).

It is a different engine on purpose: plain f32 torch arithmetic (cuBLAS or CPU matmuls, torch's
own exp, its own summation orders), E4M3 experts dequantized to f32 weights once at load
(decode(code) × block scale, docs/DESIGN.md §3.3). So it is NUMERIC-class against the canonical
program — close, not bitwise — and gated as such: argmax tape under teacher forcing, error budget
at every seam, its own TP1 run as class baseline.

Its one door, MEMRA_TORCH_BF16_MATMUL=1, runs every projection as a bf16 matmul (weights and
activations rounded to bf16, the result widened back to f32); it counts each such matmul in
the census as torch_bf16_matmul.bf16_matmuls.

Run by memra-gates, never by hand:
    memra-gates run --subject scripts/subjects/torch.toml --backend cuda --tp 1 --transport host-bounce
"""

import json
import math
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memra_subject as ms  # noqa: E402

NAME = "torch-reference"
VERSION = "0.1.0"
BF16_DOOR = "MEMRA_TORCH_BF16_MATMUL"
BF16_COUNTER = "torch_bf16_matmul.bf16_matmuls"
HEAD_DIM = 128


def main():
    try:
        run = ms.Run.from_env()
        battery = run.battery()
        bf16 = run.door(BF16_DOOR)
    except (ms.ProtocolError, OSError, ValueError) as e:
        print("torch_subject: %s" % e, file=sys.stderr)
        sys.exit(2)
    if run.tp != 1 or run.transport != "host-bounce":
        print("torch_subject: TP%d over %s: this subject runs TP1 host-bounce only (its manifest says so)"
              % (run.tp, run.transport), file=sys.stderr)
        sys.exit(2)
    try:
        import torch
    except ImportError as e:
        ms.Tape.write_error(run, NAME, VERSION, "PyTorch is not installed here: %s" % e)
        return
    try:
        engine = Engine(torch, run, bf16)
        tape = engine.decode(battery)
        tape.write()
    except Exception as e:  # a run that cannot complete is reported in the tape (ERROR)
        ms.Tape.write_error(run, NAME, VERSION, "%s: %s" % (type(e).__name__, e))


def e4m3_table():
    """decode(code) for all 256 E4M3FN codes (docs/DESIGN.md §3.3): bias 7, 3 mantissa bits,
    subnormals below exponent 1, no infinities; NaN (S.1111.111) reads as NaN."""
    out = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 7
        if e == 0xF and m == 7:
            out.append(float("nan"))
        elif e == 0:
            out.append(sign * m / 8.0 * 2.0 ** -6)
        else:
            out.append(sign * (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return out


def kblocks(width, block):
    """The canonical K-block count (docs/DESIGN.md §3.4): the largest of 8, 4, 2, 1 that cuts
    `width` into groups of whole `block`-column blocks."""
    for g in (8, 4, 2, 1):
        if width % g == 0 and (width // g) % block == 0:
            return g
    raise ValueError("width %d has no canonical K-block count" % width)


class Engine:
    def __init__(self, torch, run, bf16):
        self.torch, self.run, self.bf16 = torch, run, bf16
        if run.backend == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("MEMRA_SUBJECT_BACKEND=cuda but torch sees no CUDA device")
            self.device = torch.device("cuda", 0)
            torch.backends.cuda.matmul.allow_tf32 = False
            self.where = "cuda:0 (%s)" % torch.cuda.get_device_name(0)
        else:
            self.device = torch.device("cpu")
            self.where = "cpu"
        torch.set_float32_matmul_precision("highest")
        self.matmuls = 0
        self.bf16_matmuls = 0
        self.load(run.model)
        self.check_digest()

    # ---- the model -------------------------------------------------------------------------

    def load(self, path):
        torch = self.torch
        meta, tensors = ms.read_safetensors(path)
        if meta.get("memra.format") != "memra-model" or meta.get("memra.format_version") != "1":
            raise ValueError("%s is not a memra-model version 1 file" % path)
        c = json.loads(meta["memra.config"])
        self.c = c
        lut = torch.tensor(e4m3_table(), dtype=torch.float32)

        def raw(name, dtype):
            d, shape, data = tensors[name]
            if d != dtype:
                raise ValueError("%s is %s, expected %s" % (name, d, dtype))
            return shape, bytearray(data)

        def f32(name):
            shape, data = raw(name, "F32")
            return torch.frombuffer(data, dtype=torch.float32).reshape(shape).to(self.device)

        def bf16(name):
            shape, data = raw(name, "BF16")
            return torch.frombuffer(data, dtype=torch.bfloat16).reshape(shape).float().to(self.device)

        def e4m3(name):
            shape, data = raw(name, "F8_E4M3")
            codes = torch.frombuffer(data, dtype=torch.uint8).reshape(shape).long()
            scale = f32(name + "_scale").cpu()
            rows, cols = shape
            s = scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
            return (lut[codes] * s).to(self.device)  # one f32 rounding per weight

        self.embed = bf16("embed.weight")
        self.final_norm = f32("final_norm.weight")
        self.lm_head = bf16("lm_head.weight")
        self.layers = []
        for i in range(c["layers"]):
            p = "layers.%d." % i
            expert = lambda q: {k: e4m3("%s.%s.weight" % (q, k)) for k in ("gate", "up", "down")}  # noqa: E731
            self.layers.append({
                "attn_norm": f32(p + "attn_norm.weight"), "ffn_norm": f32(p + "ffn_norm.weight"),
                "q": bf16(p + "attn.q.weight"), "k": bf16(p + "attn.k.weight"), "v": bf16(p + "attn.v.weight"),
                "gate": bf16(p + "attn.gate.weight"), "o": bf16(p + "attn.o.weight"),
                "q_norm": f32(p + "attn.q_norm.weight"), "k_norm": f32(p + "attn.k_norm.weight"),
                "router": bf16(p + "router.weight"), "router_bias": f32(p + "router.bias"),
                "experts": [expert(p + "experts.%d" % e) for e in range(c["experts"])],
                "shared": expert(p + "shared"),
            })
        if (c["q_heads"] * HEAD_DIM) % 8 != 0:
            raise ValueError("o_proj in_features %d: a BF16 width must divide by 8" % (c["q_heads"] * HEAD_DIM))
        self.g_o = 8  # a BF16 width that divides by 8 has G = 8 (docs/DESIGN.md §3.4)
        self.g_down = kblocks(c["expert_width"], 128)
        self.g_shared = kblocks(c["shared_width"], 128)
        self.gmax = max(self.g_down, self.g_shared)
        half = HEAD_DIM // 2
        theta = float(c["rope_theta"])
        # cos/sin in f64, rounded once to f32 (docs/DESIGN.md §3.2).
        self.inv = [theta ** (-(2.0 * i) / HEAD_DIM) for i in range(half)]

    # ---- arithmetic --------------------------------------------------------------------------

    def mv(self, w, x):
        """w @ x in f32, or in bf16 under the door."""
        self.matmuls += 1
        if self.bf16:
            self.bf16_matmuls += 1
            return (w.to(self.torch.bfloat16) @ x.to(self.torch.bfloat16)).float()
        return w @ x

    def rmsnorm(self, x, w):
        eps = float(self.c["eps"])
        return x / self.torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def rope(self, x, pos):
        torch = self.torch
        ang = [pos * f for f in self.inv]
        cos = torch.tensor([math.cos(a) for a in ang], dtype=torch.float32, device=self.device)
        sin = torch.tensor([math.sin(a) for a in ang], dtype=torch.float32, device=self.device)
        a, b = x[..., :HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    # ---- the seam digest ---------------------------------------------------------------------

    def bits(self, t):
        """32-bit patterns of an f32 tensor, as int64 in [0, 2^32)."""
        return t.contiguous().float().view(self.torch.int32).long() & 0xFFFFFFFF

    def digest_bits(self, bits, base=0):
        """docs/DESIGN.md §5 in int64 torch arithmetic (wrapping; logical shifts masked)."""
        torch = self.torch
        idx = torch.arange(base, base + bits.numel(), dtype=torch.int64, device=bits.device)
        z = (idx << 32) | bits.reshape(-1)

        def s(v):  # an unsigned 64-bit constant as the int64 with the same bits
            return v - (1 << 64) if v >= 1 << 63 else v

        z = z + s(0x9E3779B97F4A7C15)
        z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * s(0xBF58476D1CE4E5B9)
        z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * s(0x94D049BB133111EB)
        z = z ^ ((z >> 31) & ((1 << 33) - 1))
        return int(z.sum().item()) & ms.MASK64

    def check_digest(self):
        """This torch's int64 arithmetic must wrap like the protocol's u64: checked against the
        plain-Python digest before anything is written."""
        torch = self.torch
        g = torch.Generator().manual_seed(7)
        vals = torch.randn(4099, generator=g).to(self.device)
        got = self.digest_bits(self.bits(vals), 12345)
        want = ms.digest_bits([int(b) for b in self.bits(vals).cpu().tolist()], 12345)
        if got != want:
            raise RuntimeError("torch int64 digest %016x differs from the reference %016x" % (got, want))

    # ---- one decode step -----------------------------------------------------------------------

    def seam(self, layer, seam, t, t0, parts=None):
        """Close a seam: its time since t0, its digest (over `parts`: (tensor, base) when the
        logical tensor has gaps), and its capture when requested."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
        ns = time.perf_counter_ns() - t0
        parts = parts or [(t, 0)]
        d = 0
        for piece, base in parts:
            d = (d + self.digest_bits(self.bits(piece), base)) & ms.MASK64
        self.tape.digest(self.prompt, self.step, layer, seam, d, ns)
        if (self.prompt, self.step, layer, seam) in self.capture:
            flat = t.contiguous().float().cpu().view(self.torch.uint8).reshape(-1).tolist()
            self.tape.capture(self.prompt, self.step, layer, seam, bytes(flat))
        return time.perf_counter_ns()

    def layer(self, i, x, pos):
        torch, c, w = self.torch, self.c, self.layers[i]
        hq, hkv, hidden = c["q_heads"], c["kv_heads"], c["hidden"]
        t0 = time.perf_counter_ns()
        normed = self.rmsnorm(x, w["attn_norm"])
        t0 = self.seam(i, "attn_norm", normed, t0)
        q, k, v, g = (self.mv(w[n], normed) for n in ("q", "k", "v", "gate"))
        t0 = self.seam(i, "qkv", torch.cat([q, k, v, g]), t0)
        qh = self.rope(self.rmsnorm(q.view(hq, HEAD_DIM), w["q_norm"]), pos)
        kh = self.rope(self.rmsnorm(k.view(hkv, HEAD_DIM), w["k_norm"]), pos)
        self.kc[i].append(kh)
        self.vc[i].append(v.view(hkv, HEAD_DIM))
        t0 = self.seam(i, "rope", torch.cat([qh.reshape(-1), kh.reshape(-1)]), t0)
        K = torch.stack(self.kc[i])  # [pos+1, hkv, 128]
        V = torch.stack(self.vc[i])
        group = hq // hkv
        Kq = K.repeat_interleave(group, 1)  # query head h reads kv head h // group
        Vq = V.repeat_interleave(group, 1)
        scores = torch.einsum("hd,thd->ht", qh, Kq) * (1.0 / math.sqrt(HEAD_DIM))
        p = torch.softmax(scores, -1)
        attn = (torch.einsum("ht,thd->hd", p, Vq) * torch.sigmoid(g).unsqueeze(1)).reshape(-1)
        t0 = self.seam(i, "attn", attn, t0)
        width = hq * HEAD_DIM // self.g_o
        parts = [self.mv(w["o"][:, j * width:(j + 1) * width], attn[j * width:(j + 1) * width])
                 for j in range(self.g_o)]
        t0 = self.seam(i, "o_proj", torch.cat(parts), t0)
        o = torch.zeros(hidden, device=self.device)
        for part in parts:
            o = o + part
        t0 = self.seam(i, "o_join", o, t0)
        h = x + o
        xin = self.rmsnorm(h, w["ffn_norm"])
        t0 = self.seam(i, "ffn_norm", torch.cat([h, xin]), t0)
        ids, weights = self.route(w, xin)
        id_bits = torch.tensor(ids, dtype=torch.int32, device=self.device).view(torch.float32)
        t0 = self.seam(i, "router", torch.cat([id_bits, weights]), t0)
        slots = [w["experts"][e] for e in ids] + [w["shared"]]
        gs = [self.g_down] * len(ids) + [self.g_shared]
        stride = self.gmax * hidden
        seam_len = len(ids) * stride + self.g_shared * hidden
        full = torch.zeros(seam_len, device=self.device)
        pieces, ys = [], []
        for s, (e, gk) in enumerate(zip(slots, gs)):
            parts = self.expert(e, xin, gk)
            block = torch.cat(parts)
            full[s * stride:s * stride + block.numel()] = block
            pieces.append((block, s * stride))
            y = torch.zeros(hidden, device=self.device)
            for part in parts:
                y = y + part
            ys.append(y)
        t0 = self.seam(i, "experts", full, t0, pieces)
        shared = ys.pop()
        routed = torch.zeros(hidden, device=self.device)
        for ws, ys_ in zip(weights, ys):
            routed = routed + ws * ys_
        t0 = self.seam(i, "moe_join", torch.cat([routed, shared]), t0)
        out = h + (routed + shared)
        self.seam(i, "residual", out, t0)
        return out

    def route(self, w, xin):
        torch, c = self.torch, self.c
        scores = torch.sigmoid(self.mv(w["router"], xin))
        keys = (scores + w["router_bias"]).cpu().tolist()
        # Descending key, ties to the lower id, NaN below every number.
        order = sorted(range(len(keys)), key=lambda e: (0 if keys[e] == keys[e] else 1,
                                                        -keys[e] if keys[e] == keys[e] else 0, e))
        ids = order[:c["top_k"]]
        weights = scores[ids]
        if c["route_norm"]:
            total = torch.zeros((), device=self.device)
            for x in weights:
                total = total + x
            weights = weights / total
        return ids, weights * float(c["route_scale"])

    def expert(self, e, xin, g):
        torch = self.torch
        limit = self.c["swiglu_limit"]
        gate, up = self.mv(e["gate"], xin), self.mv(e["up"], xin)
        silu = gate / (1.0 + torch.exp(-gate))
        if limit is not None:
            act = torch.minimum(silu, torch.tensor(float(limit), device=self.device)) * \
                torch.clamp(up, -float(limit), float(limit))
        else:
            act = silu * up
        width = act.numel() // g
        return [self.mv(e["down"][:, j * width:(j + 1) * width], act[j * width:(j + 1) * width]) for j in range(g)]

    def head(self, x):
        torch = self.torch
        n = self.c["layers"]
        t0 = time.perf_counter_ns()
        normed = self.rmsnorm(x, self.final_norm)
        t0 = self.seam(n, "final_norm", normed, t0)
        logits = self.mv(self.lm_head, normed)
        self.seam(n, "logits", logits, t0)
        clean = torch.where(torch.isnan(logits), torch.full_like(logits, float("-inf")), logits)
        top = torch.topk(clean, 2).values.cpu().tolist()
        token = int(torch.argmax(clean).item())  # the first maximum: ties to the lower id
        return token, (top[0], top[1])

    # ---- the battery ---------------------------------------------------------------------------

    def decode(self, battery):
        torch = self.torch
        c = self.c
        self.capture = {(k["prompt"], k["step"], k["layer"], k["seam"]) for k in battery["capture"]}
        self.tape = ms.Tape(self.run, NAME, VERSION, c["layers"], battery)
        forced = battery["forced_tokens"]
        gen = battery["gen_tokens"]
        with torch.no_grad():
            for p, prompt in enumerate(battery["prompts"]):
                self.prompt = p
                self.kc = [[] for _ in range(c["layers"])]
                self.vc = [[] for _ in range(c["layers"])]
                generated, top2 = [], []
                for step in range(ms.steps_of(prompt, gen)):
                    self.step = step
                    n = len(prompt)
                    if step < n:
                        token = prompt[step]
                    else:
                        token = forced[p][step - n] if forced is not None else generated[step - n]
                    x = self.embed[token]
                    for i in range(c["layers"]):
                        x = self.layer(i, x, step)
                    tok, t2 = self.head(x)
                    if step + 1 >= n:
                        generated.append(tok)
                        top2.append(t2)
                self.tape.tokens(p, generated, top2)
        self.tape.census["torch.matmuls"] = self.matmuls
        if self.bf16_matmuls:
            self.tape.census[BF16_COUNTER] = self.bf16_matmuls
            self.tape.engaged_doors = [BF16_DOOR]
        self.tape.backend = "torch %s on %s" % (torch.__version__, self.where)
        return self.tape


if __name__ == "__main__":
    main()

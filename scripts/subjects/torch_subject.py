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

Rows (protocol 2, `--batch B`): the B sessions of a pass go through every dense projection
together — one [B, in] @ [in, out] matmul per projection (q, k, v, gate, each o K-block, router,
lm_head) — as a batching server would; attention (each session its own KV cache and position)
and the routed experts (each row its own experts) stay per row. B = 1 is the same code with one
row, so single-token decode and its class baseline are the B = 1 case. What to look for on a GPU:
cuBLAS (and its bf16 path above all) may pick another kernel or K split for another M = B, so a
row's numbers may depend on how many rows share its pass — class identity against the B = 1
baseline then FAILs at b > 1, naming the row, while b1 passes. That is a finding about the
engine, not a fault of the subject.

Columns (protocol 2, `--columns T`): T consecutive steps of one session per pass — its prompt
prefilled T tokens at a time, then the last accepted token and T − 1 drafts (the oracle's tokens:
NUMERIC runs are teacher-forced, so every draft is accepted) — through the same code: the T
columns share every dense projection ([T, in] @ [in, out]), each appends its key and value at its
own position before any attends, and column t attends over positions 0 … its own (causal within
the pass); a rejected column's KV entries are cut and its step computed again as column 0 of the
next pass. Class identity then holds every column to the single-token baseline: where a [T, in]
product gives a row other bits than a [1, in] one, t > 1 FAILs naming the column — verify ≠ decode,
the engine's, reported as found.

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
ROWS = (1, 2, 4, 8)  # sessions per pass it runs (torch.toml `batch`)
COLUMNS = (1, 2, 4, 8)  # consecutive tokens of one session per pass (torch.toml `columns`)


def main():
    try:
        run = ms.Run.from_env()
        battery = run.battery()
        bf16 = run.door(BF16_DOOR)
    except (ms.ProtocolError, OSError, ValueError) as e:
        print("torch_subject: %s" % e, file=sys.stderr)
        sys.exit(2)
    if run.batch not in ROWS or run.columns not in COLUMNS or (run.batch > 1 and run.columns > 1):
        print("torch_subject: batch %d columns %d: this subject runs rows %s or columns %s, never both "
              "(its manifest says so)" % (run.batch, run.columns, list(ROWS), list(COLUMNS)), file=sys.stderr)
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
        """The rows of x [B, in] times w [out, in]ᵀ: one [B, out] matmul, in f32 or, under the
        door, in bf16."""
        self.matmuls += 1
        if self.bf16:
            self.bf16_matmuls += 1
            return (x.to(self.torch.bfloat16) @ w.to(self.torch.bfloat16).t()).float()
        return x @ w.t()

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

    def seam(self, layer, seam, rows, t0, parts=None):
        """Close a seam for every lane of the pass: `rows[r]` is lane r's logical tensor — lane r
        is (session, step) `self.lanes[r]` — (`parts[r]`: its (tensor, base) pieces when the
        tensor has gaps). Each lane gets its digest, its capture when requested, and the seam's
        time in this pass. A rejected column's are written too, and again when the next pass
        computes its step as column 0."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
        ns = time.perf_counter_ns() - t0
        for r, (s, step) in enumerate(self.lanes):
            t = rows[r]
            d = 0
            for piece, base in (parts[r] if parts else [(t, 0)]):
                d = (d + self.digest_bits(self.bits(piece), base)) & ms.MASK64
            self.tape.digest(s.p, step, layer, seam, d, ns)
            if (s.p, step, layer, seam) in self.capture:
                flat = t.contiguous().float().cpu().view(self.torch.uint8).reshape(-1).tolist()
                self.tape.capture(s.p, step, layer, seam, bytes(flat))
        return time.perf_counter_ns()

    def layer(self, i, x):
        """One layer for the lanes of a pass: x [B, hidden], row r lane self.lanes[r] = (session,
        step) — rows: B sessions at their own steps; columns: B consecutive steps of one session."""
        torch, c, w = self.torch, self.c, self.layers[i]
        hq, hkv, hidden = c["q_heads"], c["kv_heads"], c["hidden"]
        B = x.shape[0]
        t0 = time.perf_counter_ns()
        normed = self.rmsnorm(x, w["attn_norm"])
        t0 = self.seam(i, "attn_norm", normed, t0)
        q, k, v, g = (self.mv(w[n], normed) for n in ("q", "k", "v", "gate"))  # [B, out] each
        t0 = self.seam(i, "qkv", torch.cat([q, k, v, g], -1), t0)
        ropes, qhs, attn = [], [], torch.zeros(B, hq * HEAD_DIM, device=self.device)
        # Every lane's key and value go in at its position before any lane attends.
        for r, (s, step) in enumerate(self.lanes):
            qh = self.rope(self.rmsnorm(q[r].view(hq, HEAD_DIM), w["q_norm"]), step)
            kh = self.rope(self.rmsnorm(k[r].view(hkv, HEAD_DIM), w["k_norm"]), step)
            if len(s.kc[i]) != step:
                raise RuntimeError("p%d s%d: the layer %d cache holds %d positions, the entry goes at %d"
                                   % (s.p, step, i, len(s.kc[i]), step))
            s.kc[i].append(kh)
            s.vc[i].append(v[r].view(hkv, HEAD_DIM))
            ropes.append(torch.cat([qh.reshape(-1), kh.reshape(-1)]))
            qhs.append(qh)
        # Each lane over its session's positions 0 … its own: causal within a pass of columns.
        for r, (s, step) in enumerate(self.lanes):
            qh = qhs[r]
            K = torch.stack(s.kc[i][:step + 1])  # [step+1, hkv, 128]
            V = torch.stack(s.vc[i][:step + 1])
            group = hq // hkv
            Kq = K.repeat_interleave(group, 1)  # query head h reads kv head h // group
            Vq = V.repeat_interleave(group, 1)
            scores = torch.einsum("hd,thd->ht", qh, Kq) * (1.0 / math.sqrt(HEAD_DIM))
            p = torch.softmax(scores, -1)
            attn[r] = (torch.einsum("ht,thd->hd", p, Vq) * torch.sigmoid(g[r]).unsqueeze(1)).reshape(-1)
        t0 = self.seam(i, "rope", ropes, t0)
        t0 = self.seam(i, "attn", attn, t0)
        width = hq * HEAD_DIM // self.g_o
        parts = [self.mv(w["o"][:, j * width:(j + 1) * width], attn[:, j * width:(j + 1) * width])
                 for j in range(self.g_o)]  # G_o × [B, hidden]
        t0 = self.seam(i, "o_proj", torch.cat(parts, -1), t0)
        o = torch.zeros(B, hidden, device=self.device)
        for part in parts:
            o = o + part
        t0 = self.seam(i, "o_join", o, t0)
        h = x + o
        xin = self.rmsnorm(h, w["ffn_norm"])
        t0 = self.seam(i, "ffn_norm", torch.cat([h, xin], -1), t0)
        scores = torch.sigmoid(self.mv(w["router"], xin))  # [B, experts]
        routes = [self.route(w, scores[r]) for r in range(B)]
        router = [torch.cat([torch.tensor(ids, dtype=torch.int32, device=self.device).view(torch.float32), wts])
                  for ids, wts in routes]
        t0 = self.seam(i, "router", router, t0)
        stride = self.gmax * hidden
        fulls, pieces, outs = [], [], []
        for r, (ids, weights) in enumerate(routes):
            slots = [w["experts"][e] for e in ids] + [w["shared"]]
            gs = [self.g_down] * len(ids) + [self.g_shared]
            full = torch.zeros(len(ids) * stride + self.g_shared * hidden, device=self.device)
            row_pieces, ys = [], []
            for n, (e, gk) in enumerate(zip(slots, gs)):
                eparts = self.expert(e, xin[r:r + 1], gk, i)  # the row's own experts: [1, hidden] each
                block = torch.cat(eparts, -1).reshape(-1)
                full[n * stride:n * stride + block.numel()] = block
                row_pieces.append((block, n * stride))
                y = torch.zeros(hidden, device=self.device)
                for part in eparts:
                    y = y + part[0]
                ys.append(y)
            shared = ys.pop()
            routed = torch.zeros(hidden, device=self.device)
            for ws, ys_ in zip(weights, ys):
                routed = routed + ws * ys_
            fulls.append(full)
            pieces.append(row_pieces)
            outs.append((routed, shared))
        t0 = self.seam(i, "experts", fulls, t0, pieces)
        t0 = self.seam(i, "moe_join", [torch.cat([a, b]) for a, b in outs], t0)
        out = h + torch.stack([a + b for a, b in outs])
        self.seam(i, "residual", out, t0)
        return out

    def route(self, w, scores):
        """One row's selection from its router scores (sigmoid of the router projection)."""
        torch, c = self.torch, self.c
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

    def expert(self, e, xin, g, layer):
        """One expert of layer `layer` on rows xin [R, hidden]: its down projection's g K-block partials,
        [R, hidden] each. A layer listed in `unclamped_layers` has no SwiGLU clamp."""
        torch = self.torch
        limit = None if layer in self.c.get("unclamped_layers", []) else self.c["swiglu_limit"]
        gate, up = self.mv(e["gate"], xin), self.mv(e["up"], xin)
        silu = gate / (1.0 + torch.exp(-gate))
        if limit is not None:
            act = torch.minimum(silu, torch.tensor(float(limit), device=self.device)) * \
                torch.clamp(up, -float(limit), float(limit))
        else:
            act = silu * up
        width = act.shape[-1] // g
        return [self.mv(e["down"][:, j * width:(j + 1) * width], act[:, j * width:(j + 1) * width]) for j in range(g)]

    def head(self, x):
        """The head for the rows of a pass: per row its token and (top-1, top-2) logits."""
        torch = self.torch
        n = self.c["layers"]
        t0 = time.perf_counter_ns()
        normed = self.rmsnorm(x, self.final_norm)
        t0 = self.seam(n, "final_norm", normed, t0)
        logits = self.mv(self.lm_head, normed)  # [B, vocab]
        self.seam(n, "logits", logits, t0)
        clean = torch.where(torch.isnan(logits), torch.full_like(logits, float("-inf")), logits)
        top = torch.topk(clean, 2, dim=-1).values.cpu().tolist()
        tokens = torch.argmax(clean, dim=-1).cpu().tolist()  # the first maximum: ties to the lower id
        return [(int(t), (a, b)) for t, (a, b) in zip(tokens, top)]

    # ---- the battery ---------------------------------------------------------------------------

    def decode(self, battery):
        """Every prompt in passes of the run's shape — rows (memra_subject.row_passes: the
        runtime's schedule, ragged starts) or columns (memra_subject.column_tokens, one session
        at a time); each step's seams go to the tape under its (prompt, step), with the (pass,
        lane) that computed it."""
        torch = self.torch
        c = self.c
        self.capture = {(k["prompt"], k["step"], k["layer"], k["seam"]) for k in battery["capture"]}
        self.tape = ms.Tape(self.run, NAME, VERSION, c["layers"], battery)
        forced = battery["forced_tokens"]
        gen, prompts = battery["gen_tokens"], battery["prompts"]
        sessions = [Session(p, prompt, c["layers"]) for p, prompt in enumerate(prompts)]
        with torch.no_grad():
            if self.run.columns > 1:
                self.decode_columns(sessions, forced, gen)
            else:
                for pss, live in ms.row_passes(prompts, gen, self.run.batch):
                    lanes = [(sessions[p], sessions[p].step) for _, p in live]
                    out = self.run_pass(lanes, [s.token(forced) for s, _ in lanes])
                    for (lane, _), (s, step), (tok, t2) in zip(live, lanes, out):
                        s.accept(step, tok, t2)
                        self.tape.lane(s.p, step, pss, lane)
        for s in sessions:
            self.tape.tokens(s.p, s.generated, s.top2)
        self.tape.census["torch.matmuls"] = self.matmuls
        if self.bf16_matmuls:
            self.tape.census[BF16_COUNTER] = self.bf16_matmuls
            self.tape.engaged_doors = [BF16_DOOR]
        self.tape.backend = "torch %s on %s" % (torch.__version__, self.where)
        return self.tape

    def decode_columns(self, sessions, forced, gen):
        """Columns: one session at a time, prefill and verify passes of up to T columns; a
        rejected column is thrown away — its KV entries cut, its seams written again by the next
        pass, which computes its step as column 0."""
        pss, rejected = 0, 0
        for s in sessions:
            row = forced[s.p] if forced is not None else None
            steps = ms.steps_of(s.prompt, gen)
            while s.step < steps:
                base = s.step
                tokens = ms.column_tokens(s.prompt, s.generated, row, base, gen, self.run.columns)
                lanes = [(s, base + i) for i in range(len(tokens))]
                for i, (tok, t2) in enumerate(self.run_pass(lanes, tokens)):
                    if not ms.column_accepted(s.prompt, s.generated, row, base, i, tokens):
                        rejected += len(tokens) - i
                        for layer in range(len(s.kc)):
                            del s.kc[layer][base + i:]
                            del s.vc[layer][base + i:]
                        break
                    s.accept(base + i, tok, t2)
                    self.tape.lane(s.p, base + i, pss, i)
                pss += 1
        self.tape.census["torch.rejected_columns"] = rejected

    def run_pass(self, lanes, tokens):
        """One pass: every layer and the head for `lanes` [(session, step)] fed `tokens`; per lane
        its (token, (top-1, top-2))."""
        self.lanes = lanes
        x = self.torch.stack([self.embed[tok] for tok in tokens])  # [lanes, hidden]
        for i in range(self.c["layers"]):
            x = self.layer(i, x)
        return self.head(x)


class Session:
    """One prompt's decode: its KV cache, the step it computes next, its generated tokens."""

    def __init__(self, p, prompt, layers):
        self.p, self.prompt, self.step = p, prompt, 0
        self.kc = [[] for _ in range(layers)]
        self.vc = [[] for _ in range(layers)]
        self.generated, self.top2 = [], []

    def token(self, forced):
        """The token fed at this step: the prompt's, then the forced tape's or its own."""
        return ms.fed_token(self.prompt, self.generated, forced[self.p] if forced is not None else None, self.step)

    def accept(self, step, tok, t2):
        """The lane that computed `step` is kept: a step from the prompt's last on generates."""
        if step + 1 >= len(self.prompt):
            self.generated.append(tok)
            self.top2.append(t2)
        self.step = step + 1


if __name__ == "__main__":
    main()

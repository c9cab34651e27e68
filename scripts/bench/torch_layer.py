#!/usr/bin/env python3
"""PyTorch anchor for `memra-gates bench` (docs/DESIGN.md §8): one Step-like MoE decode layer,
`--batch` B rows (default 1: one session; B > 1: B sessions, each with its own KV cache, one token
each — batched decode) or `--columns` T columns (T > 1: T consecutive tokens of ONE session in one
pass, each attending to the cache and to the pass's tokens up to itself — the verify pass of
speculative decoding; docs/DESIGN.md §3.6), in several honest forms a PyTorch user would write, all
timed in this one process; the fastest is reported and named, and every form is in the output
(bench records each in its receipt). A slow anchor flatters the program and misleads, so the
anchor is the best of these forms.

The layer matches the canonical program's shapes and data flow: RMSNorm, Q/K/V/gate projections
(BF16), per-head q/k RMSNorm + NeoX RoPE, attention over `ctx` cached positions with a per-head
sigmoid gate, O projection, residual + RMSNorm, sigmoid top-k router, top-k routed SwiGLU experts
plus the shared expert, weighted combine, residual. The attention half is the same in every form;
the forms differ in how the routed experts are computed:

- `index_einsum`: the route stays on the device; the k experts' weights are taken by plain
  indexing of the expert banks (`eg[ids]`) and applied with `torch.einsum`;
- `gather_bmm`: the route stays on the device; `index_select` of the k experts, batched GEMVs
  (`torch.bmm`);
- `host_loop`: the route ids go to the host once per layer (`ids.tolist()`) and each expert the
  batch selected is a plain view of its bank, one `F.linear` per projection over every row routed
  to it (the usual batched-MoE grouping; no gather; cannot be graph-captured);
- `host_loop_fp8`: `host_loop` with E4M3 experts (the routed and the shared expert) through
  `torch._scaled_mm` (cuBLASLt FP8, one scale per expert bank, activations scaled per call on the
  device): the FP8 serving form, reading the bytes the program's E4M3 kernels read;
- `slots_fp8`: the route stays on the device; each row's k experts are taken one slot at a time
  (`index_select` of the expert's codes by the device id, a gather) into `torch._scaled_mm`: the
  FP8 form a CUDA graph can capture;
- `grouped_mm`: the route stays on the device; the pass's (row, slot) pairs sorted by expert and
  one `torch._grouped_mm` (the grouped GEMM PyTorch ships for MoE) per projection over the whole
  bank with per-expert row offsets: each distinct expert is read once, no gather copy;
- `grouped_mm_fp8`: the same with E4M3 banks through `torch._scaled_grouped_mm` (rowwise scales).

Each form is timed eagerly (`<form>.eager`) and, when it has no host synchronisation, under
CUDA-graph replay of the whole layer (`<form>.graph`). The forms are checked against each other
(`max_rel_diff` against the first form's output) so a fast form that computes something else is
refused rather than reported.

The BF16 forms read 2x the expert bytes that the E4M3 kernels read; the FP8 forms read the same
bytes (codes; their scales are one value per bank) but compute in cuBLASLt's FP8 GEMM, so they are
checked against the first form with the looser FP8 tolerance (AGREE_FP8). A form that raises (an
FP8 GEMM this PyTorch or card does not have) is reported under `not_timed` with its error instead
of ending the anchor. `torch.compile` of the plain layer was measured on an H200 at
6.9-7.0 ms (18x slower than its CUDA graph), so it is not a form today.

Output: one JSON object on stdout:
  batch, columns:   the rows B and columns T of every timing (a layer's time is for all B x T
                    tokens of the pass: per token ÷ B·T)
  distinct:         the distinct routed experts of every pass when `--distinct` fixed them, else
                    absent (the layer's own router chose)
  fp8_rows_padded:  whether the FP8 GEMM's rows were padded to a multiple of 16 (when it refuses
                    fewer), absent without FP8
  forms:            {"<form>.<eager|graph>": {median_us, min_us, p90_us, n}} for every form timed
  not_timed:        {"<form>.<eager|graph>": why} for forms that cannot run that way here (an
                    FP8 form without an FP8 GEMM, a form that raised, a graph a form cannot make)
  fastest:          {"form": name, "median_us": ...} over every form
  layer_eager / layer_graph (+ _form): the fastest eager and graph form (bench's ratios use them)
  attention_eager, attention_graph, moe_eager: the halves (moe_eager: the fastest form's, eager)
  max_rel_diff:     {"<form>": relative difference of its output from the first form's}
`--device cpu` runs everything on the CPU with a wall clock and no graphs (for tests).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

# Relative output difference above which a form is refused (bf16 weights, f32 accumulation; the
# forms only reorder sums, so they agree to about 1e-3).
AGREE = 3e-2
# The same for the FP8 forms: E4M3 weights and activations carry a relative rounding error up to
# 2^-4 each, so their layer differs from the BF16 forms' by a few percent of its largest value.
AGREE_FP8 = 1e-1
FP8_MAX = 448.0


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--experts", type=int, default=288)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=1, help="rows: sessions decoded together, each its own cache")
    p.add_argument("--columns", type=int, default=1, help="columns: consecutive tokens of one session per pass")
    p.add_argument(
        "--distinct",
        type=int,
        default=0,
        help="routed experts the pass reads (the program's measured count; 0: this layer's own router decides)",
    )
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests: wall clock, no graphs)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.columns < 1 or (a.batch > 1 and a.columns > 1):
        p.error(f"--batch {a.batch} --columns {a.columns}: a pass is B rows or T columns, each at least 1, not both above 1")
    tokens = a.batch * a.columns
    if a.distinct and not min(a.top_k, a.experts) <= a.distinct <= min(tokens * a.top_k, a.experts):
        p.error(
            f"--distinct {a.distinct}: a pass of {tokens} tokens × top-{a.top_k} of {a.experts} experts reads "
            f"between {min(a.top_k, a.experts)} and {min(tokens * a.top_k, a.experts)} distinct experts"
        )
    return a


class Layer:
    """The weights of one layer and its two halves; the routed experts in each form."""

    def __init__(self, a, dev):
        torch.manual_seed(0)
        bf = torch.bfloat16
        self.a, self.bf = a, bf
        H, QH, KVH, D = a.hidden, a.q_heads, a.kv_heads, a.head_dim
        s = H ** -0.5
        rnd = lambda *shape: torch.randn(*shape, device=dev)  # noqa: E731
        self.wq = (rnd(QH * D, H) * s).to(bf)
        self.wk = (rnd(KVH * D, H) * s).to(bf)
        self.wv = (rnd(KVH * D, H) * s).to(bf)
        self.wg = (rnd(QH, H) * s).to(bf)
        self.wo = (rnd(H, QH * D) * (QH * D) ** -0.5).to(bf)
        self.wr = (rnd(a.experts, H) * s).to(bf)
        self.bias = torch.zeros(a.experts, device=dev)
        self.eg = (torch.randn(a.experts, a.width, H, device=dev, dtype=bf) * s)
        self.eu = (torch.randn(a.experts, a.width, H, device=dev, dtype=bf) * s)
        self.ed = (torch.randn(a.experts, H, a.width, device=dev, dtype=bf) * a.width ** -0.5)
        self.sg, self.su, self.sd = self.eg[0].clone(), self.eu[0].clone(), self.ed[0].clone()
        self.n1 = torch.ones(H, device=dev)
        self.n2 = torch.ones(H, device=dev)
        self.qn = torch.ones(D, device=dev)
        self.kn = torch.ones(D, device=dev)
        # One cache per session: B rows are B sessions; T columns are one session.
        self.kc = rnd(a.batch, KVH, a.ctx, D)
        self.vc = rnd(a.batch, KVH, a.ctx, D)
        # Columns: token t of the pass sees the ctx cached positions and the pass's tokens 0..t.
        T = a.columns
        self.mask = torch.ones(T, a.ctx + T, dtype=torch.bool, device=dev).tril(a.ctx)
        ang = torch.arange(D // 2, device=dev, dtype=torch.float32)
        self.cos, self.sin = torch.cos(ang), torch.sin(ang)
        self.eps = 1e-6
        self.fp8 = None  # fp8_banks() fills it where the FP8 forms can run
        # --distinct D: slot j of token r takes expert (r·k + j) mod D — k distinct per token, D in
        # the pass — so that the forms whose reads follow the distinct experts (grouped_mm,
        # host_loop) read what the program's pass read (random rows here select about as many as
        # the program's rows, but one session's consecutive tokens select fewer).
        self.fixed_ids = None
        if a.distinct:
            n = a.batch * a.columns
            self.fixed_ids = torch.arange(n * a.top_k, device=dev).remainder(a.distinct).view(n, a.top_k)

    def fp8_banks(self):
        """E4M3 copies of the expert banks (routed and shared), one scale per bank (amax / 448), and
        whether cuBLASLt's FP8 GEMM needs its rows padded to a multiple of 16 here."""
        f8 = torch.float8_e4m3fn

        def q(bank):
            s = bank.abs().amax().float().clamp_min(1e-12) / FP8_MAX
            return (bank.float() / s).to(f8) if bank.dim() < 3 else quant_bank(bank, s, f8), s

        self.fp8 = {name: q(getattr(self, name)) for name in ("eg", "eu", "ed", "sg", "su", "sd")}
        for name in ("eg", "eu", "ed"):  # the rowwise form of the bank's scale (grouped_mm_fp8)
            codes, s = self.fp8[name]
            self.fp8[name + "_rows"] = s.expand(codes.shape[0], codes.shape[1]).contiguous()
        self.pad8 = False
        probe = torch.zeros(1, self.a.hidden, device=self.eg.device)
        try:
            self.mm8(probe, *self.fp8["sg"])
        except RuntimeError:
            self.pad8 = True
            self.mm8(probe, *self.fp8["sg"])

    def mm8(self, x, w8, sw):
        """x [M, K] (f32/bf16) · w8ᵀ (w8 [N, K] E4M3, scale sw) in cuBLASLt's FP8 GEMM, f32 out;
        x is scaled to E4M3 by its own amax on the device (no host sync)."""
        m = x.shape[0]
        if self.pad8 and m % 16:
            x = F.pad(x, (0, 0, 0, 16 - m % 16))
        sx = x.abs().amax().float().clamp_min(1e-12) / FP8_MAX
        xq = (x.float() / sx).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        return y[:m].float()

    def qkvg(self, x):
        """The pass's q (normed, roped), k (normed, roped), v and gate logits: [N, heads, D] each."""
        a, bf = self.a, self.bf
        N, QH, KVH, D = x.shape[0], a.q_heads, a.kv_heads, a.head_dim
        h = rmsnorm(x, self.n1, self.eps).to(bf)
        q = F.linear(h, self.wq).float().view(N, QH, D)
        k = F.linear(h, self.wk).float().view(N, KVH, D)
        v = F.linear(h, self.wv).float().view(N, KVH, D)
        g = F.linear(h, self.wg).float()
        q = rope(rmsnorm(q, self.qn, self.eps), self.cos, self.sin)
        k = rope(rmsnorm(k, self.kn, self.eps), self.cos, self.sin)
        return q, k, v, g

    def attention_half(self, x):
        """x: [N, H]: rows, one per session, each attending over its own cache; or columns, N
        consecutive tokens of one session."""
        a, bf = self.a, self.bf
        B, QH, KVH = x.shape[0], a.q_heads, a.kv_heads
        q, k, v, g = self.qkvg(x)
        if a.columns > 1:
            # One session: the pass's T tokens join its cache; causal within the pass.
            kk = torch.cat([self.kc, k.transpose(0, 1).unsqueeze(0)], dim=2).repeat_interleave(QH // KVH, 1)
            vv = torch.cat([self.vc, v.transpose(0, 1).unsqueeze(0)], dim=2).repeat_interleave(QH // KVH, 1)
            q4 = q.transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(q4, kk, vv, attn_mask=self.mask).squeeze(0).transpose(0, 1)
        else:
            kk = torch.cat([self.kc, k.unsqueeze(2)], dim=2).repeat_interleave(QH // KVH, 1)
            vv = torch.cat([self.vc, v.unsqueeze(2)], dim=2).repeat_interleave(QH // KVH, 1)
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv).squeeze(2)
        o = o * torch.sigmoid(g).unsqueeze(-1)
        hres = x + F.linear(o.reshape(B, -1).to(bf), self.wo).float()
        return hres, rmsnorm(hres, self.n2, self.eps)

    def route(self, xb):
        score = torch.sigmoid(F.linear(xb, self.wr).float())
        _, ids = torch.topk(score + self.bias, self.a.top_k, dim=-1)
        if self.fixed_ids is not None:
            ids = self.fixed_ids  # the selection still runs (its cost), its ids replaced
        w = torch.gather(score, -1, ids)
        return ids, w / w.sum(-1, keepdim=True)

    def shared(self, xb):
        gt = F.linear(xb, self.sg).float()
        up = F.linear(xb, self.su).float()
        return F.linear((F.silu(gt) * up).to(self.bf), self.sd).float()

    def shared_fp8(self, xb):
        f = self.fp8
        act = F.silu(self.mm8(xb, *f["sg"])) * self.mm8(xb, *f["su"])
        return self.mm8(act, *f["sd"])

    # ---- the routed experts, one method per form (xb [B, H], ids and w [B, k]) ---------------
    def experts_index_einsum(self, xb, ids, w):
        gt = torch.einsum("bkwh,bh->bkw", self.eg[ids], xb).float()
        up = torch.einsum("bkwh,bh->bkw", self.eu[ids], xb).float()
        act = (F.silu(gt) * up).to(self.bf)
        y = torch.einsum("bkhw,bkw->bkh", self.ed[ids], act).float()
        return (w.unsqueeze(-1) * y).sum(1)

    def experts_gather_bmm(self, xb, ids, w):
        (B, k), H = ids.shape, self.a.hidden
        flat = ids.reshape(-1)
        xk = xb.repeat_interleave(k, 0).view(B * k, H, 1)
        gt = torch.bmm(self.eg.index_select(0, flat), xk).float().squeeze(-1)
        up = torch.bmm(self.eu.index_select(0, flat), xk).float().squeeze(-1)
        act = (F.silu(gt) * up).to(self.bf).unsqueeze(-1)
        y = torch.bmm(self.ed.index_select(0, flat), act).float().squeeze(-1).view(B, k, H)
        return (w.unsqueeze(-1) * y).sum(1)

    def by_expert(self, xb, ids, w, expert_out):
        """Σ over the experts the pass chose (ids read on the host: one sync per layer) of
        w · expert_out(rows routed to e, e), each expert's rows in one product."""
        acc = torch.zeros(xb.shape[0], self.a.hidden, device=xb.device)
        uses_of = {}
        for b, row in enumerate(ids.tolist()):
            for j, e in enumerate(row):
                uses_of.setdefault(e, []).append((b, j))
        for e, uses in uses_of.items():
            rows = torch.tensor([b for b, _ in uses], device=xb.device)
            slots = torch.tensor([j for _, j in uses], device=xb.device)
            y = expert_out(xb.index_select(0, rows), e)
            acc.index_add_(0, rows, w[rows, slots].unsqueeze(-1) * y)
        return acc

    def experts_host_loop(self, xb, ids, w):
        def out(xe, e):
            gt = F.linear(xe, self.eg[e]).float()
            up = F.linear(xe, self.eu[e]).float()
            return F.linear((F.silu(gt) * up).to(self.bf), self.ed[e]).float()

        return self.by_expert(xb, ids, w, out)

    def experts_host_loop_fp8(self, xb, ids, w):
        f = self.fp8

        def out(xe, e):
            act = F.silu(self.mm8(xe, f["eg"][0][e], f["eg"][1])) * self.mm8(xe, f["eu"][0][e], f["eu"][1])
            return self.mm8(act, f["ed"][0][e], f["ed"][1])

        return self.by_expert(xb, ids, w, out)

    def experts_slots_fp8(self, xb, ids, w):
        f = self.fp8
        out = []
        for b in range(xb.shape[0]):
            xr = xb[b : b + 1]
            acc = torch.zeros(1, self.a.hidden, device=xb.device)
            for j in range(ids.shape[1]):
                e = ids[b, j : j + 1]  # a device index: each weight is gathered, the id never read on the host

                def take(name):  # index_select on the codes' bytes (every PyTorch gathers uint8)
                    bank = f[name][0]
                    return bank.view(torch.uint8).index_select(0, e)[0].view(bank.dtype), f[name][1]

                act = F.silu(self.mm8(xr, *take("eg"))) * self.mm8(xr, *take("eu"))
                acc = acc + w[b, j] * self.mm8(act, *take("ed"))
            out.append(acc)
        return torch.cat(out, 0)

    def grouped(self, ids):
        """The (row, slot) pairs sorted by expert — `order` (pair indices), `rows` (each pair's row)
        — and each expert's end offset in that order (`offs`, int32, all experts: one no row chose
        is a group of 0 rows). Device only: a CUDA graph captures it."""
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        ones = torch.ones_like(flat, dtype=torch.int32)
        counts = torch.zeros(self.a.experts, dtype=torch.int32, device=ids.device).scatter_add_(0, flat, ones)
        return order, order // ids.shape[1], torch.cumsum(counts, 0, dtype=torch.int32)

    def by_group(self, xb, ids, w, gmm):
        """Σ over slots of w · the expert's output, every projection one grouped GEMM
        `gmm(x, bank name, offs)` (f32 out) over the pairs sorted by expert (`grouped`)."""
        order, rows, offs = self.grouped(ids)
        xs = xb.index_select(0, rows)
        act = F.silu(gmm(xs, "eg", offs)) * gmm(xs, "eu", offs)
        ys = gmm(act, "ed", offs)
        y = torch.empty_like(ys).index_copy_(0, order, ys).view(*ids.shape, -1)
        return (w.unsqueeze(-1) * y).sum(1)

    def experts_grouped_mm(self, xb, ids, w):
        def gmm(x, name, offs):  # BF16 in (x already is, or the activation rounded to it)
            return torch._grouped_mm(x.to(self.bf), getattr(self, name).transpose(-2, -1), offs=offs).float()

        return self.by_group(xb, ids, w, gmm)

    def experts_grouped_mm_fp8(self, xb, ids, w):
        f = self.fp8

        def gmm(x, name, offs):  # rowwise activation scales; the bank's one scale per expert and column
            sx = x.float().abs().amax(-1).clamp_min(1e-12) / FP8_MAX
            xq = (x.float() / sx.unsqueeze(-1)).to(torch.float8_e4m3fn)
            w8, sb = f[name][0], f[name + "_rows"]
            return torch._scaled_grouped_mm(
                xq, w8.transpose(-2, -1), sx, sb, offs=offs, out_dtype=torch.bfloat16
            ).float()

        return self.by_group(xb, ids, w, gmm)

    def moe_half(self, form, hres, xin):
        xb = xin.to(self.bf)
        ids, w = self.route(xb)
        shared = self.shared_fp8 if form.endswith("_fp8") else self.shared
        return hres + (getattr(self, "experts_" + form)(xb, ids, w) + shared(xb))

    def layer(self, form, x):
        hres, xin = self.attention_half(x)
        return self.moe_half(form, hres, xin)


# (form, whether it can be captured in a CUDA graph: no host synchronisation). The first is the
# reference every other form is checked against; the FP8 forms run only on CUDA.
FORMS = [
    ("index_einsum", True),
    ("gather_bmm", True),
    ("host_loop", False),
    ("host_loop_fp8", False),
    ("slots_fp8", True),
    ("grouped_mm", True),
    ("grouped_mm_fp8", True),
]


def quant_bank(bank, s, f8):
    """A 3-D bank to E4M3 one expert at a time (no f32 copy of the whole bank)."""
    out = torch.empty(bank.shape, dtype=f8, device=bank.device)
    for e in range(bank.shape[0]):
        out[e] = (bank[e].float() / s).to(f8)
    return out


def first_line(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def summary(t):
    t = sorted(t)
    return {"median_us": statistics.median(t), "min_us": t[0], "p90_us": t[int(0.9 * (len(t) - 1))], "n": len(t)}


def main(argv=None):
    a = parse(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("torch_layer.py: --device cuda, but torch.cuda.is_available() is false")
    dev = torch.device(a.device)
    L = Layer(a, dev)
    x = torch.randn(a.batch * a.columns, a.hidden, device=dev)
    fp8_error = "FP8 GEMMs need --device cuda"
    if cuda:
        try:
            L.fp8_banks()
        except Exception as e:  # an FP8 GEMM this PyTorch or card lacks: the BF16 forms still run
            L.fp8, fp8_error = None, "no FP8 GEMM here: " + first_line(e)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def time_it(fn, n):
        times = []
        for _ in range(n):
            if cuda:
                s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s0.record()
                fn()
                s1.record()
                torch.cuda.synchronize()
                times.append(s0.elapsed_time(s1) * 1000.0)
            else:
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) / 1000.0)
        return summary(times)

    def graphed(fn, arg):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn(arg)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn(arg)
        return g

    # Every form computes the same layer: checked before anything is timed. A form that cannot run
    # here is reported with its error; one that computes something else ends the anchor.
    with torch.no_grad():
        forms, not_timed, outs = {}, {}, {}
        for f, _ in FORMS:
            if f.endswith("_fp8") and L.fp8 is None:
                not_timed[f + ".eager"] = fp8_error
                continue
            try:
                outs[f] = L.layer(f, x)
            except Exception as e:
                if f == FORMS[0][0]:
                    raise
                not_timed[f + ".eager"] = "failed: " + first_line(e)
        ref = outs[FORMS[0][0]]
        max_rel = {f: float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30)) for f, o in outs.items()}
        bad = {f: d for f, d in max_rel.items() if not d <= (AGREE_FP8 if f.endswith("_fp8") else AGREE)}
        if bad:
            raise SystemExit(
                f"torch_layer.py: forms disagree with {FORMS[0][0]} beyond {AGREE} (FP8: {AGREE_FP8}): {bad}"
            )

        static_x = x.clone()
        for f, graphable in FORMS:
            if f not in outs:
                continue
            for _ in range(a.warmup):
                L.layer(f, x)
            sync()
            forms[f + ".eager"] = time_it(lambda f=f: L.layer(f, x), a.iters)
            if not graphable:
                not_timed[f + ".graph"] = "reads the route ids on the host: a CUDA graph cannot capture it"
            elif not cuda:
                not_timed[f + ".graph"] = "CUDA graphs need --device cuda"
            else:
                try:
                    g = graphed(lambda t, f=f: L.layer(f, t), static_x)
                except Exception as e:
                    not_timed[f + ".graph"] = "capture failed: " + first_line(e)
                    continue
                forms[f + ".graph"] = time_it(g.replay, a.iters)

        def best(keys):
            keys = [k for k in keys if k in forms]
            return min(keys, key=lambda k: forms[k]["median_us"]) if keys else None

        fastest = best(forms)
        eager = best(k for k in forms if k.endswith(".eager"))
        graph = best(k for k in forms if k.endswith(".graph"))
        moe_form = fastest.split(".")[0]
        halves = {
            "attention_eager": time_it(lambda: L.attention_half(x), a.iters),
            "moe_eager": time_it(lambda: L.moe_half(moe_form, x, x), a.iters),
        }
        if cuda:
            halves["attention_graph"] = time_it(graphed(L.attention_half, static_x).replay, a.iters)

    out = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "expert_dtype": "bf16" if L.fp8 is None else "bf16; E4M3 in the *_fp8 forms",
        "batch": a.batch,
        "columns": a.columns,
        "forms": forms,
        "not_timed": not_timed,
        "fastest": {"form": fastest, "median_us": forms[fastest]["median_us"]},
        "layer_eager": forms[eager],
        "layer_eager_form": eager,
        "max_rel_diff": max_rel,
        **halves,
    }
    if L.fp8 is not None:
        out["fp8_rows_padded"] = L.pad8
    if a.distinct:
        out["distinct"] = a.distinct
    if graph:
        out["layer_graph"] = forms[graph]
        out["layer_graph_form"] = graph
    print(json.dumps(out))


if __name__ == "__main__":
    main()

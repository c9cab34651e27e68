#!/usr/bin/env python3
"""PyTorch anchor for `memra-gates bench` (docs/DESIGN.md §8): one Step-like MoE decode layer,
`--batch` B rows (default 1: one session; B > 1: B sessions, each with its own KV cache, one token
each — batched decode, docs/DESIGN.md §3.6), in several honest forms a PyTorch user would write, all timed in this one process; the
fastest is reported and named, and every form is in the output (bench records each in its receipt).
A slow anchor flatters the program and misleads, so the anchor is the best of these forms.

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
  to it (the usual batched-MoE grouping; no gather; cannot be graph-captured).

Each form is timed eagerly (`<form>.eager`) and, when it has no host synchronisation, under
CUDA-graph replay of the whole layer (`<form>.graph`). The forms are checked against each other
(`max_rel_diff` against the first form's output) so a fast form that computes something else is
refused rather than reported.

Expert weights are BF16 here: PyTorch has no batch-1 FP8 GEMV, so this anchor reads 2x the expert
bytes that the E4M3 kernels read. `torch.compile` of the plain layer was measured on an H200 at
6.9-7.0 ms (18x slower than its CUDA graph), so it is not a form today.

Output: one JSON object on stdout:
  batch:            the rows B of every timing (a layer's time is for all B rows: per token ÷ B)
  forms:            {"<form>.<eager|graph>": {median_us, min_us, p90_us, n}} for every form timed
  not_timed:        {"<form>.graph": why} for forms that cannot run that way here
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
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests: wall clock, no graphs)")
    return p.parse_args(argv)


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
        self.kc = rnd(a.batch, KVH, a.ctx, D)
        self.vc = rnd(a.batch, KVH, a.ctx, D)
        ang = torch.arange(D // 2, device=dev, dtype=torch.float32)
        self.cos, self.sin = torch.cos(ang), torch.sin(ang)
        self.eps = 1e-6

    def attention_half(self, x):
        """x: [B, H], one row per session; each row attends over its own cache."""
        a, bf = self.a, self.bf
        B, QH, KVH, D = x.shape[0], a.q_heads, a.kv_heads, a.head_dim
        h = rmsnorm(x, self.n1, self.eps).to(bf)
        q = F.linear(h, self.wq).float().view(B, QH, D)
        k = F.linear(h, self.wk).float().view(B, KVH, D)
        v = F.linear(h, self.wv).float().view(B, KVH, D)
        g = F.linear(h, self.wg).float()
        q = rope(rmsnorm(q, self.qn, self.eps), self.cos, self.sin)
        k = rope(rmsnorm(k, self.kn, self.eps), self.cos, self.sin)
        kk = torch.cat([self.kc, k.unsqueeze(2)], dim=2).repeat_interleave(QH // KVH, 1)
        vv = torch.cat([self.vc, v.unsqueeze(2)], dim=2).repeat_interleave(QH // KVH, 1)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv).squeeze(2)
        o = o * torch.sigmoid(g).unsqueeze(-1)
        hres = x + F.linear(o.reshape(B, -1).to(bf), self.wo).float()
        return hres, rmsnorm(hres, self.n2, self.eps)

    def route(self, xb):
        score = torch.sigmoid(F.linear(xb, self.wr).float())
        _, ids = torch.topk(score + self.bias, self.a.top_k, dim=-1)
        w = torch.gather(score, -1, ids)
        return ids, w / w.sum(-1, keepdim=True)

    def shared(self, xb):
        gt = F.linear(xb, self.sg).float()
        up = F.linear(xb, self.su).float()
        return F.linear((F.silu(gt) * up).to(self.bf), self.sd).float()

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

    def experts_host_loop(self, xb, ids, w):
        acc = torch.zeros(xb.shape[0], self.a.hidden, device=xb.device)
        by_expert = {}
        for b, row in enumerate(ids.tolist()):  # one host sync per layer
            for j, e in enumerate(row):
                by_expert.setdefault(e, []).append((b, j))
        for e, uses in by_expert.items():
            rows = torch.tensor([b for b, _ in uses], device=xb.device)
            slots = torch.tensor([j for _, j in uses], device=xb.device)
            xe = xb.index_select(0, rows)
            gt = F.linear(xe, self.eg[e]).float()
            up = F.linear(xe, self.eu[e]).float()
            y = F.linear((F.silu(gt) * up).to(self.bf), self.ed[e]).float()
            acc.index_add_(0, rows, w[rows, slots].unsqueeze(-1) * y)
        return acc

    def moe_half(self, form, hres, xin):
        xb = xin.to(self.bf)
        ids, w = self.route(xb)
        return hres + (getattr(self, "experts_" + form)(xb, ids, w) + self.shared(xb))

    def layer(self, form, x):
        hres, xin = self.attention_half(x)
        return self.moe_half(form, hres, xin)


# (form, whether it can be captured in a CUDA graph: no host synchronisation)
FORMS = [("index_einsum", True), ("gather_bmm", True), ("host_loop", False)]


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
    x = torch.randn(a.batch, a.hidden, device=dev)

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

    # Every form computes the same layer: checked before anything is timed.
    with torch.no_grad():
        outs = {f: L.layer(f, x) for f, _ in FORMS}
        ref = outs[FORMS[0][0]]
        max_rel = {f: float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30)) for f, o in outs.items()}
        bad = {f: d for f, d in max_rel.items() if not d <= AGREE}
        if bad:
            raise SystemExit(f"torch_layer.py: forms disagree with {FORMS[0][0]} beyond {AGREE}: {bad}")

        forms, not_timed = {}, {}
        static_x = x.clone()
        for f, graphable in FORMS:
            for _ in range(a.warmup):
                L.layer(f, x)
            sync()
            forms[f + ".eager"] = time_it(lambda f=f: L.layer(f, x), a.iters)
            if not graphable:
                not_timed[f + ".graph"] = "reads the route ids on the host: a CUDA graph cannot capture it"
            elif not cuda:
                not_timed[f + ".graph"] = "CUDA graphs need --device cuda"
            else:
                forms[f + ".graph"] = time_it(graphed(lambda t, f=f: L.layer(f, t), static_x).replay, a.iters)

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
        "expert_dtype": "bf16",
        "batch": a.batch,
        "forms": forms,
        "not_timed": not_timed,
        "fastest": {"form": fastest, "median_us": forms[fastest]["median_us"]},
        "layer_eager": forms[eager],
        "layer_eager_form": eager,
        "max_rel_diff": max_rel,
        **halves,
    }
    if graph:
        out["layer_graph"] = forms[graph]
        out["layer_graph_form"] = graph
    print(json.dumps(out))


if __name__ == "__main__":
    main()

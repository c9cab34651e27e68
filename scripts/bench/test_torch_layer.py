#!/usr/bin/env python3
"""Tests of scripts/bench/torch_layer.py on the CPU (`python3 scripts/bench/test_torch_layer.py`;
tests/cli/torch_anchor.rs runs it). Skipped where PyTorch is not installed; on the GPU machine
`memra-gates bench` runs the script itself. Tiny shapes: every form that runs on the CPU runs,
agrees with the others and is in the output (the FP8 forms say why they did not run); a form that
computes something else is refused; a verify pass of T columns equals T single-token steps of one
session; `--distinct D` reads exactly D distinct experts; the grouped-GEMM form computes the
reference form's layer. Every check has its negative control: the defect it exists to catch,
planted, and the check then fails."""
import contextlib
import io
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch  # noqa: F401
    import torch_layer
except ImportError as e:  # no torch here: nothing to test
    torch_layer = None
    MISSING = str(e)

TINY = ["--device", "cpu", "--hidden", "64", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "16",
        "--experts", "8", "--top-k", "2", "--width", "32", "--ctx", "4", "--warmup", "1", "--iters", "3"]


def run(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        torch_layer.main(argv)
    return json.loads(buf.getvalue())


@unittest.skipIf(torch_layer is None, "PyTorch is not installed")
class TorchLayer(unittest.TestCase):
    def test_every_form_is_timed_and_the_fastest_is_named(self):
        out = run(TINY)
        forms = {f for f, _ in torch_layer.FORMS if not f.endswith("_fp8")}
        fp8 = {f for f, _ in torch_layer.FORMS if f.endswith("_fp8")}
        self.assertEqual({k.split(".")[0] for k in out["forms"]}, forms)
        self.assertEqual({f + ".eager" for f in fp8}, {k for k, why in out["not_timed"].items() if "FP8" in why})
        for k, s in out["forms"].items():
            self.assertEqual(s["n"], 3, k)
            self.assertLessEqual(s["min_us"], s["median_us"])
        fastest = min(out["forms"], key=lambda k: out["forms"][k]["median_us"])
        self.assertEqual(out["fastest"]["form"], fastest)
        self.assertEqual(out["layer_eager"], out["forms"][out["layer_eager_form"]])
        # On the CPU no form is graphed, and each says why.
        self.assertNotIn("layer_graph", out)
        self.assertEqual({k for k in out["not_timed"] if k.endswith(".graph")}, {f + ".graph" for f in forms})
        self.assertTrue(all(d <= torch_layer.AGREE for d in out["max_rel_diff"].values()), out["max_rel_diff"])

    def test_batched_rows_run_every_form_and_agree(self):
        out = run(TINY + ["--batch", "3"])
        self.assertEqual(out["batch"], 3)
        cpu_forms = {f for f, _ in torch_layer.FORMS if not f.endswith("_fp8")}
        self.assertEqual({k.split(".")[0] for k in out["forms"]}, cpu_forms)
        self.assertTrue(all(d <= torch_layer.AGREE for d in out["max_rel_diff"].values()), out["max_rel_diff"])

    def test_a_form_that_computes_something_else_is_refused(self):
        real = torch_layer.Layer.experts_gather_bmm
        torch_layer.Layer.experts_gather_bmm = lambda self, xb, ids, w: real(self, xb, ids, w) + 1.0
        try:
            with self.assertRaises(SystemExit) as e:
                run(TINY)
            self.assertIn("gather_bmm", str(e.exception))
        finally:
            torch_layer.Layer.experts_gather_bmm = real


# ---- what the anchor computes, at a small shape -----------------------------------------------
SMALL = ["--device", "cpu", "--hidden", "256", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "64",
         "--experts", "16", "--top-k", "4", "--width", "128", "--ctx", "8"]
# Relative difference (max |Δ| ÷ max |ref|) under which two computations of one thing agree: the
# forms only reorder f32 sums. Each planted defect moves the layer by 10⁻¹ or more.
SAME = 1e-4
# The same for a column against its single-token step: the projections are BF16 GEMMs, and the
# CPU's picks its blocking by the row count, so a token alone and in a pass of 4 may round its
# BF16 output differently (≈ 4·10⁻³ of an element; measured 7·10⁻⁴ of the layer's largest).
SAME_COLUMN = 1e-2
WEIGHTS = ["wq", "wk", "wv", "wg", "wo", "wr", "bias", "eg", "eu", "ed", "sg", "su", "sd", "n1", "n2", "qn", "kn",
           "kc", "vc", "cos", "sin"]


def small(extra):
    torch.manual_seed(0)
    a = torch_layer.parse(SMALL + extra)
    return a, torch_layer.Layer(a, torch.device("cpu"))


def rel(x, ref):
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def columns_differ(plant=False):
    """Where a T-column pass differs from T single-token steps of the session (each step's key and
    value appended before the next), or None. plant: each column also sees the next."""
    for T in (2, 4):
        a, cols = small(["--columns", str(T)])
        if plant:
            cols.mask = torch.ones_like(cols.mask).tril(a.ctx + 1)
        _, step = small([])
        for name in WEIGHTS:
            setattr(step, name, getattr(cols, name).clone())
        x = torch.randn(T, a.hidden)
        pass_out, _ = cols.attention_half(x)
        for t in range(T):
            out, _ = step.attention_half(x[t : t + 1])
            d = rel(out, pass_out[t : t + 1])
            if d > SAME_COLUMN:
                return f"T={T}, column {t} differs from the single-token step at its position by {d:.3g}"
            _, k, v, _ = step.qkvg(x[t : t + 1])
            step.kc = torch.cat([step.kc, k.unsqueeze(2)], dim=2)
            step.vc = torch.cat([step.vc, v.unsqueeze(2)], dim=2)
    return None


def distinct_wrong(plant=False):
    """Where `--distinct D` does not read exactly D experts, k distinct per token, or None.
    plant: D − 1 experts."""
    for extra, d in ((["--columns", "8"], 5), (["--batch", "3"], 12), (["--batch", "8"], 16)):
        _, L = small(extra + ["--distinct", str(d)])
        if plant:
            L.fixed_ids = L.fixed_ids.remainder(d - 1)
        ids, _ = L.route(torch.randn(L.fixed_ids.shape[0], L.a.hidden).to(torch.bfloat16))
        got, rows_ok = ids.unique().numel(), all(r.unique().numel() == L.a.top_k for r in ids)
        if got != d or not rows_ok:
            return f"{extra} --distinct {d} read {got} distinct experts (k distinct per token: {rows_ok})"
    return None


def forms_differ(plant=False):
    """Where grouped_mm, host_loop or gather_bmm differ from index_einsum, or None. plant: the
    grouped GEMM's rows of expert e go to expert e + 1."""
    for extra in (["--batch", "3"], ["--columns", "4"], ["--batch", "4", "--distinct", "6"]):
        a, L = small(extra)
        if plant:
            grouped = L.grouped

            def shifted(ids, grouped=grouped):
                order, rows, offs = grouped(ids)
                moved = torch.cat([torch.zeros(1, dtype=offs.dtype), offs[:-1]])
                moved[-1] = offs[-1]
                return order, rows, moved

            L.grouped = shifted
        x = torch.randn(a.batch * a.columns, a.hidden)
        ref = L.layer("index_einsum", x)
        for form in ("grouped_mm", "host_loop", "gather_bmm"):
            d = rel(L.layer(form, x), ref)
            if d > SAME:
                return f"{form} {extra} differs from index_einsum by {d:.3g}"
    return None


@unittest.skipIf(torch_layer is None, "PyTorch is not installed")
class WhatTheAnchorComputes(unittest.TestCase):
    def test_verify_columns_are_single_token_steps(self):
        self.assertIsNone(columns_differ())
        self.assertIsNotNone(columns_differ(plant=True))

    def test_distinct_reads_exactly_d_experts(self):
        self.assertIsNone(distinct_wrong())
        self.assertIsNotNone(distinct_wrong(plant=True))

    def test_the_grouped_form_computes_the_reference_layer(self):
        self.assertIsNone(forms_differ())
        self.assertIsNotNone(forms_differ(plant=True))


if __name__ == "__main__":
    if torch_layer is None:
        print(f"skipped: no PyTorch ({MISSING})")
    unittest.main()

#!/usr/bin/env python3
"""Tests of scripts/bench/torch_layer.py on the CPU (`python3 scripts/bench/test_torch_layer.py`).
Skipped where PyTorch is not installed; on the GPU machine `memra-gates bench` runs the script
itself. Tiny shapes: every form runs, agrees with the others, and is in the output; a form that
computes something else is refused (the negative control)."""
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
        forms = {f for f, _ in torch_layer.FORMS}
        self.assertEqual({k.split(".")[0] for k in out["forms"]}, forms)
        for k, s in out["forms"].items():
            self.assertEqual(s["n"], 3, k)
            self.assertLessEqual(s["min_us"], s["median_us"])
        fastest = min(out["forms"], key=lambda k: out["forms"][k]["median_us"])
        self.assertEqual(out["fastest"]["form"], fastest)
        self.assertEqual(out["layer_eager"], out["forms"][out["layer_eager_form"]])
        # On the CPU no form is graphed, and each says why.
        self.assertNotIn("layer_graph", out)
        self.assertEqual(set(out["not_timed"]), {f + ".graph" for f in forms})
        self.assertTrue(all(d <= torch_layer.AGREE for d in out["max_rel_diff"].values()), out["max_rel_diff"])

    def test_batched_rows_run_every_form_and_agree(self):
        out = run(TINY + ["--batch", "3"])
        self.assertEqual(out["batch"], 3)
        self.assertEqual({k.split(".")[0] for k in out["forms"]}, {f for f, _ in torch_layer.FORMS})
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


if __name__ == "__main__":
    unittest.main()

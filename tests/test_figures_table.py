#!/usr/bin/env python3
"""scripts/figures_table.py on canned inputs (tests/data/figures): the parsers of llama.cpp's and our
benchmark outputs, and the page: medians, ranges, round-by-round ratios, commands once, the machine."""
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "figures_table.py")
DATA = os.path.join(ROOT, "tests", "data", "figures")


def run(*args):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


class Parsers(unittest.TestCase):
    def test_llama_bench(self):
        code, out, _ = run("llama-bench", os.path.join(DATA, "llama-bench.jsonl"))
        self.assertEqual(code, 0)
        self.assertEqual(out.split("\n")[:2], ["512 0 1024 2900.5", "0 128 1024 610.25"])

    def test_batched_bench_skips_the_log_lines(self):
        code, out, _ = run("batched-bench", os.path.join(DATA, "batched-bench.jsonl"))
        self.assertEqual(code, 0)
        self.assertEqual(out.split(), ["1", "640.0", "16", "2048.0"])

    def test_perplexity_final_estimate(self):
        code, out, _ = run("perplexity", os.path.join(DATA, "perplexity.log"))
        self.assertEqual((code, out.strip()), (0, "25.6891"))

    def test_perplexity_without_a_final_line_is_an_error(self):
        code, _, err = run("perplexity", os.path.join(DATA, "node-ttft.log"))
        self.assertNotEqual(code, 0)
        self.assertIn("Final estimate", err)

    def test_node_ttft(self):
        code, out, _ = run("node-ttft", os.path.join(DATA, "node-ttft.log"))
        self.assertEqual((code, out.split()), (0, ["500.0", "40.0"]))

    def test_serve_load(self):
        code, out, _ = run("serve-load", os.path.join(DATA, "serve-load.log"))
        self.assertEqual((code, out.split()), (0, ["343", "459.5", "94.3"]))

    def test_serve_load_with_a_reply_missing_is_an_error(self):
        code, out, err = run("serve-load", os.path.join(DATA, "serve-load-incomplete.log"))
        self.assertNotEqual(code, 0)
        self.assertEqual(out, "")
        self.assertIn("15 of 16 replies completed", err)

    def test_serve_load_without_a_summary_is_an_error(self):
        code, _, err = run("serve-load", os.path.join(DATA, "node-ttft.log"))
        self.assertNotEqual(code, 0)
        self.assertIn("TTFT p50", err)


class Page(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        code, cls.page, err = run("table", os.path.join(DATA, "results.jsonl"))
        assert code == 0, err

    def test_machine(self):
        self.assertIn("- CPU: Test CPU", self.page)
        self.assertIn("- measured read bandwidth (GB/s): 12.35", self.page)
        self.assertIn("`--quick`", self.page)

    def test_medians_ranges_and_ratios_by_round(self):
        # ours 100, 120, 90; llama.cpp 80, 80, 100: ratios 1.25, 1.5, 0.9 -> median 1.25.
        self.assertIn("| context 0, KV fp16 | decode | 100.0 (90.00-120.0) | 80.00 (80.00-100.0) | 1.25x (0.90-1.50) |",
                      self.page)

    def test_one_sided_rows_and_units(self):
        self.assertIn("| q4 default vs Q4_K_M | PPL increase over bf16 (%) | 0.4170 |  |  |", self.page)
        self.assertIn("| 1984-token history | TTFT on a second replica (ms) | 12.50 |  |  |", self.page)

    def test_server_rows_side_by_side(self):
        # ours 300, 500; llama-server 600, 400: ratios 0.5 and 1.25 -> median 0.875 (shown 0.88).
        self.assertIn("## Server: time to first token of a shared-prompt chat load", self.page)
        self.assertIn("| 8 conversations x 2 turns, shared 600-token system prompt | TTFT p50 (ms) | "
                      "400.0 (300.0-500.0) | 500.0 (400.0-600.0) | 0.88x (0.50-1.25) |", self.page)
        self.assertLess(self.page.index("## Prefix store"), self.page.index("## Server:"))
        self.assertIn("llama-server -m model-BF16.gguf", self.page)

    def test_areas_in_order_each_command_once(self):
        self.assertLess(self.page.index("## Prefill and decode"), self.page.index("## Quantized weights"))
        self.assertLess(self.page.index("## Quantized weights"), self.page.index("## Prefix store"))
        self.assertEqual(self.page.count("--kv-quantize fp16 -r 1 -t 2 --json"), 1)
        self.assertNotIn("## Batched decode", self.page)  # nothing measured, no command: no section

    def test_a_bad_line_names_the_file_and_line(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"kind": "value", "area": "x"}\n')
        code, _, err = run("table", f.name)
        os.unlink(f.name)
        self.assertNotEqual(code, 0)
        self.assertIn(f.name + ":1: a value without 'row'", err)


class Only(unittest.TestCase):
    """figures.sh --only AREA: the previous run's other areas are kept, the page is whole again."""

    def test_keep_drops_the_remeasured_areas_and_the_machine(self):
        code, out, err = run("keep", os.path.join(DATA, "results.jsonl"), "context,server")
        self.assertEqual(code, 0, err)
        import json
        kept = [json.loads(line) for line in out.splitlines()]
        areas = {r["area"] for r in kept}
        self.assertNotIn("context", areas)
        self.assertNotIn("server", areas)
        self.assertEqual(areas, {"quantized", "store"})
        self.assertFalse([r for r in kept if r["kind"] == "machine"])
        # Every kept line is one of the file's, unchanged.
        with open(os.path.join(DATA, "results.jsonl"), encoding="utf-8") as f:
            original = [json.loads(line) for line in f if line.strip()]
        for r in kept:
            self.assertIn(r, original)
        self.assertEqual(len(kept), len([r for r in original if r.get("area") in ("quantized", "store")]))

    def test_run_of_and_a_page_of_kept_and_new_areas(self):
        import json
        import tempfile
        code, out, _ = run("run-of", os.path.join(DATA, "results.jsonl"), "context")
        self.assertEqual(code, 0)
        runs = json.loads(out)  # every other area, from the full run that wrote the file
        self.assertEqual(runs, {a: "2026-12-05 02:00, commit abc1234" for a in ("quantized", "server", "store")})
        _, kept, _ = run("keep", os.path.join(DATA, "results.jsonl"), "context")
        new = [
            '{"kind": "value", "area": "context", "row": "context 0, KV fp16", "metric": "decode", "unit": "tok/s", '
            '"side": "ours", "round": 1, "value": 300}',
            '{"kind": "command", "area": "context", "command": "build/posttrainllm bench M --decode-at-context"}',
            json.dumps({"kind": "machine", "cpu": "Test CPU", "date": "2026-12-05 20:00", "commit": "def5678",
                        "only": "context", "kept_from": runs}),
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(kept + "\n".join(new) + "\n")
        code, page, err = run("table", f.name)
        # A second --only run (store): context comes from the first, the others still from the full run.
        code2, out2, _ = run("run-of", f.name, "store")
        os.unlink(f.name)
        self.assertEqual(code, 0, err)
        self.assertIn("| context 0, KV fp16 | decode | 300.0 |  |  |", page)  # the new value alone
        self.assertIn("build/posttrainllm bench M --decode-at-context", page)
        self.assertNotIn("--kv-quantize fp16 -r 1 -t 2 --json", page)  # the old command of the area is gone
        self.assertIn("| q4 default vs Q4_K_M | PPL increase over bf16 (%) | 0.4170 |  |  |", page)  # kept
        self.assertIn("- areas measured on this date (--only): context", page)
        self.assertIn("- the other areas kept from earlier runs: quantized, server, store (2026-12-05 02:00, commit "
                      "abc1234)", page)
        self.assertEqual(code2, 0)
        self.assertEqual(json.loads(out2), {"context": "2026-12-05 20:00, commit def5678",
                                            "quantized": "2026-12-05 02:00, commit abc1234",
                                            "server": "2026-12-05 02:00, commit abc1234"})


if __name__ == "__main__":
    unittest.main()

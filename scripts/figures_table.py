#!/usr/bin/env python3
"""docs/figures.md from the measurements scripts/figures.sh records, and the parsers it uses.

  figures_table.py table RESULTS.jsonl        the Markdown page on stdout
  figures_table.py llama-bench FILE           llama-bench -o jsonl: "n_prompt n_gen n_depth avg_ts" lines
  figures_table.py batched-bench FILE         llama-batched-bench --output-format jsonl: "pl speed_tg" lines
  figures_table.py perplexity FILE            llama-perplexity's log: its final PPL
  figures_table.py node-ttft FILE             a TTFT summary line of scripts/bench_*.mjs: "cold warm"
  figures_table.py serve-load FILE            scripts/serve_load.mjs's load summary: "p50 p95 tok/s" (an
                                              error unless every reply completed)
  figures_table.py keep RESULTS.jsonl AREAS   (figures.sh --only) the values and commands of every area not
                                              in AREAS (comma-separated) on stdout, the machine line dropped
  figures_table.py run-of RESULTS.jsonl AREAS (figures.sh --only) a JSON object: for every area of RESULTS.jsonl
                                              not in AREAS, the date and commit of the run that measured it

RESULTS.jsonl holds one JSON object a line:
  {"kind": "machine", ...}                   the machine (cpu, flags, cores, bandwidth_gb_s, date, ...; with
                                             --only, "only": the areas measured, "kept_from": each other
                                             area's run, {area: "date, commit"})
  {"kind": "command", "area", "command"}     a command an area ran (listed under its table)
  {"kind": "value", "area", "row", "metric", "unit", "side": "ours"|"llama.cpp", "round", "value"}
A row measured by both sides gets the ratio ours / llama.cpp of each round (the two run one after the
other in a round, so drift on the machine hits both alike): its median and its range over the rounds.
"""
import json
import re
import statistics
import sys

AREAS = [
    ("context", "Prefill and decode by context length and KV precision"),
    ("batched", "Batched decode"),
    ("quantized", "Quantized weights (MLX layout)"),
    ("gguf", "GGUF files"),
    ("real-size", "Real size: the Llama-3.2-1B shape"),
    ("real-size-qwen", "Real size: the Qwen2.5-0.5B shape"),
    ("yoco", "YOCO (KV shared across layers)"),
    ("prompt-cache", "Prompt cache and server time to first token"),
    ("store", "Prefix store (Redis) time to first token"),
    ("server", "Server: time to first token of a shared-prompt chat load"),
    ("kv-quality", "KIVI and StreamingLLM quality"),
]


def fmt(v):
    if v is None:
        return ""
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def spread(vals):
    """"median (min-max)" of vals, or the one value."""
    if not vals:
        return ""
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m)
    return f"{fmt(m)} ({fmt(min(vals))}-{fmt(max(vals))})"


def table(path):
    machine, commands, values = {}, {}, []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"{path}:{n}: not JSON ({e})")
        kind = r.get("kind")
        if kind == "machine":
            machine.update(r)
        elif kind == "command":
            commands.setdefault(r["area"], [])
            if r["command"] not in commands[r["area"]]:
                commands[r["area"]].append(r["command"])
        elif kind == "value":
            for k in ("area", "row", "metric", "unit", "side", "round", "value"):
                if k not in r:
                    sys.exit(f"{path}:{n}: a value without '{k}'")
            values.append(r)
        else:
            sys.exit(f"{path}:{n}: unknown kind {kind!r}")

    out = ["# Figures", ""]
    out.append("Written by `scripts/figures.sh` (" + ("`--quick`" if machine.get("quick") else "the full run") +
               "); every figure in the other pages of docs/ that is not given with its own command is a row "
               "here. Speeds in tok/s unless the unit says otherwise; each cell is the median of the rounds "
               "with their range in parentheses; ratio: ours / llama.cpp's, taken round by round (for a time, "
               "ms, under 1 means ours is faster).")
    out.append("")
    out.append("## Machine")
    out.append("")
    for key, label in (("cpu", "CPU"), ("flags", "SIMD flags"), ("cores", "cores"),
                       ("bandwidth_gb_s", "measured read bandwidth (GB/s)"), ("memory_gib", "memory (GiB)"),
                       ("date", "date (UTC)"), ("commit", "commit"), ("threads", "threads"),
                       ("load", "load average before / after"), ("llama_cpp", "llama.cpp"), ("note", "note"),
                       ("only", "areas measured on this date (--only)")):
        if key in machine:
            v = machine[key]
            out.append(f"- {label}: {fmt(v) if isinstance(v, float) else v}")
    kept_from = machine.get("kept_from")
    if isinstance(kept_from, dict) and kept_from:
        by_run = {}
        for area, run in kept_from.items():
            by_run.setdefault(run, []).append(area)
        out.append("- the other areas kept from earlier runs: " +
                   "; ".join(f"{', '.join(areas)} ({run})" for run, areas in by_run.items()))
    elif kept_from:
        out.append(f"- the other areas kept from the run of: {kept_from}")
    out.append("")

    known = [a for a, _ in AREAS]
    titles = dict(AREAS)
    areas = known + sorted({v["area"] for v in values} - set(known))
    for area in areas:
        vs = [v for v in values if v["area"] == area]
        if not vs and area not in commands:
            continue
        out.append(f"## {titles.get(area, area)}")
        out.append("")
        if not vs:
            out.append("Not measured in this run.")
            out.append("")
        else:
            out.append("| row | metric | ours | llama.cpp | ratio |")
            out.append("|---|---|---:|---:|---:|")
            keys = []
            for v in vs:
                k = (v["row"], v["metric"], v["unit"])
                if k not in keys:
                    keys.append(k)
            for row, metric, unit in keys:
                mine = [v for v in vs if (v["row"], v["metric"], v["unit"]) == (row, metric, unit)]
                ours = {v["round"]: float(v["value"]) for v in mine if v["side"] == "ours"}
                theirs = {v["round"]: float(v["value"]) for v in mine if v["side"] == "llama.cpp"}
                ratios = [ours[r] / theirs[r] for r in sorted(ours) if r in theirs and theirs[r] != 0]
                m = metric + ("" if unit in ("tok/s", "") else f" ({unit})")
                ratio = ""
                if ratios:
                    ratio = f"{statistics.median(ratios):.2f}x"
                    if len(ratios) > 1:
                        ratio += f" ({min(ratios):.2f}-{max(ratios):.2f})"
                out.append(f"| {row} | {m} | {spread(list(ours.values()))} | {spread(list(theirs.values()))} | {ratio} |")
            out.append("")
        if commands.get(area):
            out.append("Commands:")
            out.append("")
            out.append("```sh")
            out.extend(commands[area])
            out.append("```")
            out.append("")
    return "\n".join(out)


def llama_bench(path):
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            print(j.get("n_prompt", 0), j.get("n_gen", 0), j.get("n_depth", 0), j["avg_ts"])


def batched_bench(path):
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            print(j["pl"], j["speed_tg"])


def perplexity(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", text)
    if not m:
        sys.exit(f"{path}: no 'Final estimate: PPL = ' line")
    print(m.group(1))


def node_ttft(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    m = re.search(r"TTFT of a \d+-token history: cold (?:prefill )?([0-9.]+) ms.*?"
                  r"(?:after a restart|second replica) ([0-9.]+) ms", text)
    if not m:
        sys.exit(f"{path}: no 'TTFT of a N-token history' line")
    print(m.group(1), m.group(2))


def serve_load(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    t = re.search(r"TTFT p50 ([0-9.]+) ms, p95 ([0-9.]+) ms", text)
    c = re.search(r"replies completed: (\d+) of (\d+); \d+ completion tokens, ([0-9.]+) tok/s aggregate", text)
    if not t or not c:
        sys.exit(f"{path}: no 'TTFT p50 ... ms, p95 ... ms' and 'replies completed: ...' lines")
    if c.group(1) != c.group(2):
        sys.exit(f"{path}: {c.group(1)} of {c.group(2)} replies completed")
    print(t.group(1), t.group(2), c.group(3))


def records(path):
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")


def keep(path, areas):
    """The records of the areas not re-measured: an --only run appends its own after them."""
    drop = set(areas.split(","))
    for r in records(path):
        if r.get("kind") != "machine" and r.get("area") not in drop:
            print(json.dumps(r))


def run_of(path, areas):
    """Where each area kept by an --only run was measured: by the run that wrote RESULTS.jsonl, or,
    for an area that run kept in turn, by the run it named (a chain of --only runs)."""
    rs = list(records(path))
    machines = [r for r in rs if r.get("kind") == "machine"]
    m = machines[-1] if machines else {}
    own = f"{m.get('date', 'an earlier run')}, commit {m.get('commit', 'unknown')}"
    measured = set(m["only"].split(", ")) if "only" in m else None
    kept_from = m.get("kept_from", {})
    runs = {}
    for area in sorted({r["area"] for r in rs if r.get("kind") != "machine"} - set(areas.split(","))):
        if measured is None or area in measured:
            runs[area] = own
        elif isinstance(kept_from, dict):
            runs[area] = kept_from.get(area, "an earlier run")
        else:  # a page written before areas carried their own runs
            runs[area] = kept_from or "an earlier run"
    print(json.dumps(runs))


def main(argv):
    cmds = {"table": lambda p: print(table(p)), "llama-bench": llama_bench, "batched-bench": batched_bench,
            "perplexity": perplexity, "node-ttft": node_ttft, "serve-load": serve_load}
    if len(argv) == 4 and argv[1] in ("keep", "run-of"):
        (keep if argv[1] == "keep" else run_of)(argv[2], argv[3])
        return
    if len(argv) != 3 or argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[argv[1]](argv[2])


if __name__ == "__main__":
    main(sys.argv)

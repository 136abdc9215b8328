#!/usr/bin/env python3
"""Aggregate decode speed of `posttrainllm serve` with speculative decoding on and off.

Starts two servers on one model (one with --spec-type, one without; an idle server takes no CPU),
then alternates rounds: C conversations at once to one server, then the same to the other. A round's
figure is the completion tokens of all its replies over its wall time. Prints every round, then the
median and range of each side and of the ratio taken round by round, and checks that both servers
wrote the same text (greedy). Standard library only.

  scripts/bench_serve_spec.py --binary build/posttrainllm --model ../shared/models/kjv-small \
      --conversations 8 --rounds 5 [--spec-type ngram] [--tokens 256] [--threads 2] [--prompt-file F]

--base-args gives the other server flags of its own instead of none (two speculating variants
side by side: --base-args "--model-draft D --no-spec-draft-batch").
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = [
    "And the LORD said unto Moses",
    "And God said",
    "In the beginning God created the heaven and the earth.",
    "And it came to pass",
    "The LORD is my shepherd",
    "And Jesus answered and said unto them",
    "Blessed are the poor in spirit",
    "And the LORD spake unto Moses, saying",
]


def start(binary, model, threads, parallel, extra):
    cmd = [binary, "serve", model, "--port", "0", "-t", str(threads), "--parallel", str(parallel), "--no-webui"] + extra
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit("server did not start: " + " ".join(cmd))


def complete(port, prompt, tokens, out, i):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out[i] = json.loads(r.read())


def round_(port, prompts, tokens):
    out = [None] * len(prompts)
    threads = [threading.Thread(target=complete, args=(port, p, tokens, out, i)) for i, p in enumerate(prompts)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    n = sum(o["usage"]["completion_tokens"] for o in out)
    return n / dt, out


def summary(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/posttrainllm")
    ap.add_argument("--model", required=True)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec-type", default="ngram")
    ap.add_argument("--spec-args", default="", help="more serve flags of the speculating server")
    ap.add_argument("--base-args", default="", help="the other server's flags (default: none, speculation off)")
    ap.add_argument("--prompt-file", help="one prompt per conversation, every one this file's text")
    a = ap.parse_args()
    if a.prompt_file:
        prompts = [open(a.prompt_file).read()] * a.conversations
    else:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.conversations)]
    par = max(1, a.conversations)
    spec, sp = start(a.binary, a.model, a.threads, par, ["--spec-type", a.spec_type] + a.spec_args.split())
    plain, pp = start(a.binary, a.model, a.threads, par, a.base_args.split())
    try:
        round_(sp, prompts, a.tokens)  # warm-up: buffers grown, pass times measured, prompts in each pool
        round_(pp, prompts, a.tokens)
        on, off, ratio = [], [], []
        base = "base" if a.base_args else "plain"
        drafted = accepted = 0
        for r in range(a.rounds):
            s, so = round_(sp, prompts, a.tokens)
            b, bo = round_(pp, prompts, a.tokens)
            same = all(x["choices"][0]["text"] == y["choices"][0]["text"] for x, y in zip(so, bo))
            if not same:
                print(f"the texts differ between the speculating server and the {base} one", file=sys.stderr)
                sys.exit(1)
            drafted += sum(o["timings"]["draft_n"] for o in so)
            accepted += sum(o["timings"]["draft_n_accepted"] for o in so)
            on.append(s)
            off.append(b)
            ratio.append(s / b)
            print(f"round {r + 1}: spec {s:.1f} tok/s, {base} {b:.1f} tok/s, ratio {s / b:.3f}", flush=True)
        print(f"{a.conversations} conversations x {a.tokens} tokens, --spec-type {a.spec_type} {a.spec_args}".rstrip())
        if a.base_args:
            print(f"base: {a.base_args}")
        print(f"spec  tok/s: {summary(on)}")
        print(f"{base} tok/s: {summary(off)}")
        print(f"ratio spec/{base}: {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})")
        print(f"drafted {drafted}, accepted {accepted} ({100 * accepted / max(1, drafted):.1f}%), same text: yes")
    finally:
        for p in (spec, plain):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()

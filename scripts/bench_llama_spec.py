#!/usr/bin/env python3
"""Speculative decoding at batch 1: `posttrainllm serve` against llama-server on the same GGUF.

Starts each server once on a free loopback port (ours with and without speculation, llama-server
with each --spec-type configuration given and without), then runs rounds: in each round every
server, in an order that rotates from round to round, gets the same short prompts one after the
other (one conversation: batch 1), greedy, a fixed number of tokens past EOS. A server's figure for
the round is its completion tokens over the round's wall time for it (client side, so the same clock
for both programs). Prints every round, the median and range per server, the ratio of ours with
speculation to the best llama-server configuration round by round, each server's drafted/accepted
counts, and whether each server wrote the same text with and without speculation. An idle server
takes no CPU. Standard library only.

  scripts/bench_llama_spec.py --binary build/posttrainllm \
      --llama-server /work/anchors/llama.cpp/build/bin/llama-server \
      --model ../shared/models/gguf/kjv-small-Q4_K_M.gguf --rounds 5 \
      --llama 'ngram-mod=--spec-type ngram-mod' --llama 'ngram-simple=--spec-type ngram-simple'
"""
import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "And the LORD said unto Moses",
    "And God said",
    "And it came to pass",
    "The LORD is my shepherd",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd):
    port = free_port()
    p = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if p.poll() is not None:
            raise SystemExit("server exited: " + " ".join(cmd))
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, base
        except Exception:
            pass
        time.sleep(0.1)
    p.terminate()
    raise SystemExit("server did not start: " + " ".join(cmd))


def complete(base, prompt, tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_round(base, prompts, tokens):
    t0 = time.monotonic()
    outs = [complete(base, p, tokens) for p in prompts]
    dt = time.monotonic() - t0
    n = sum(o["usage"]["completion_tokens"] for o in outs)
    drafted = sum((o.get("timings") or {}).get("draft_n", 0) for o in outs)
    accepted = sum((o.get("timings") or {}).get("draft_n_accepted", 0) for o in outs)
    return n / dt, [o["choices"][0]["text"] for o in outs], drafted, accepted, n


def summary(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/posttrainllm")
    ap.add_argument("--llama-server", default="/work/anchors/llama.cpp/build/bin/llama-server")
    ap.add_argument("--model", required=True, help="a GGUF file both servers load")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ours", action="append", default=[],
                    help="NAME=FLAGS: our speculating server (default: ngram=--spec-type ngram)")
    ap.add_argument("--llama", action="append", default=[],
                    help="NAME=FLAGS: a llama-server speculation configuration (repeatable)")
    ap.add_argument("--no-plain", action="store_true", help="skip the servers without speculation")
    ap.add_argument("--prompt", action="append", help="a prompt (repeatable; default: four scripture openings)")
    a = ap.parse_args()
    prompts = a.prompt or PROMPTS
    t = str(a.threads)
    ours_base = [a.binary, "serve", a.model, "-t", t, "--parallel", "1", "--no-webui"]
    llama_base = [a.llama_server, "-m", a.model, "-t", t, "-tb", t, "-np", "1", "-c", "2048", "--no-webui"]
    configs = []  # (name, side, command)
    for spec in a.ours or ["ngram=--spec-type ngram"]:
        name, _, flags = spec.partition("=")
        configs.append(("ours " + name, "ours", ours_base + shlex.split(flags)))
    for spec in a.llama:
        name, _, flags = spec.partition("=")
        configs.append(("llama " + name, "llama", llama_base + shlex.split(flags)))
    if not a.no_plain:
        configs.append(("ours plain", "ours", ours_base))
        configs.append(("llama plain", "llama", llama_base))

    servers = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # a timeout still stops the servers
    try:
        for name, side, cmd in configs:
            p, base = start(cmd)
            servers.append((name, side, base, p))
        for name, side, base, _ in servers:  # warm-up: buffers grown, pass times measured
            run_round(base, prompts[:1], min(a.tokens, 64))
        rates = {s[0]: [] for s in servers}
        drafts = {s[0]: [0, 0] for s in servers}
        texts = {}
        counts = {s[0]: set() for s in servers}  # completion tokens per round: the same work for all
        for r in range(a.rounds):
            order = servers[r % len(servers):] + servers[:r % len(servers)]
            line = []
            for name, side, base, _ in order:
                rate, txt, d, acc, n = run_round(base, prompts, a.tokens)
                rates[name].append(rate)
                counts[name].add(n)
                drafts[name][0] += d
                drafts[name][1] += acc
                texts.setdefault(name, txt)
                line.append(f"{name} {rate:.1f}")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
        print(f"{len(prompts)} prompts one after another x {a.tokens} tokens, greedy, -t {a.threads}, "
              f"{a.rounds} rounds; tok/s = completion tokens / wall time")
        for name, *_ in servers:
            d, acc = drafts[name]
            extra = f", drafted {d}, accepted {acc} ({100 * acc / d:.1f}%)" if d else ""
            print(f"  {name:28s} {summary(rates[name])} tok/s{extra}")
        if len(set().union(*counts.values())) != 1:
            print(f"completion tokens per round differ between servers: {counts}", file=sys.stderr)
            sys.exit(1)
        for side in ("ours", "llama"):
            plain = f"{side} plain"
            for name, s, *_ in servers:
                if s == side and name != plain and plain in texts:
                    same = "same" if texts[name] == texts[plain] else "DIFFERENT"
                    print(f"  {name}: text {same} as {plain}")
        llama_spec = [s[0] for s in servers if s[1] == "llama" and s[0] != "llama plain"]
        if llama_spec:
            best = max(llama_spec, key=lambda n: statistics.median(rates[n]))
            for name, side, *_ in servers:
                if side != "ours" or name == "ours plain":
                    continue
                q = [x / y for x, y in zip(rates[name], rates[best])]
                print(f"ratio {name} / {best} (llama-server's best), round by round: "
                      f"{statistics.median(q):.3f} ({min(q):.3f}-{max(q):.3f})")
    finally:
        for *_, p in servers:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Seed corpora for the reader fuzz targets (fuzz/fuzz_*.cpp), from the repository's real files.

usage: make_reader_seeds.py REPO OUT   (writes OUT/<target>/seed-*)
Parts of one input are joined by fuzz_input.h's separator.
"""
import glob
import json
import os
import struct
import sys

SEP = b"\n#----#\n"


def main():
    repo, out = sys.argv[1], sys.argv[2]
    seeds = {}

    def add(target, data):
        seeds.setdefault(target, []).append(data)

    def read(p):
        with open(p, "rb") as f:
            return f.read()

    models = sorted(glob.glob(os.path.join(repo, "models", "*")))
    configs = [os.path.join(m, "config.json") for m in models] + sorted(
        glob.glob(os.path.join(repo, "tests", "data", "*", "config.json")))
    for c in configs:
        add("fuzz_config", read(c))

    # safetensors: small files of every dtype and shape kind, and real headers with tiny data.
    def safetensors(tensors):
        header, data, off = {"__metadata__": {"format": "pt"}}, b"", 0
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
            data += raw
            off += len(raw)
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        return struct.pack("<Q", len(h)) + h + data

    small = safetensors([("a", "F32", [2, 2], b"\0" * 16), ("b", "BF16", [3], b"\1" * 6),
                         ("c", "F16", [1, 1, 2], b"\2" * 4), ("d", "I64", [0], b""), ("e", "U8", [], b"\3")])
    add("fuzz_safetensors", b"\0" + small)
    m = read(os.path.join(models[0], "model.safetensors"))
    n = struct.unpack("<Q", m[:8])[0]
    add("fuzz_safetensors", b"\0" + m[:8 + n])  # a real header, its data cut off
    index = json.dumps({"metadata": {"total_size": 16}, "weight_map": {"a": "shard.safetensors",
                                                                       "b": "shard.safetensors"}}).encode()
    add("fuzz_safetensors", b"\1" + index + SEP + small)

    tok_cfgs = [read(os.path.join(mdl, "tokenizer_config.json")) for mdl in models]
    templates = sorted(glob.glob(os.path.join(repo, "tests", "data", "chat_templates", "*.jinja")))
    for t in templates:
        cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": read(t).decode()}
        add("fuzz_tokenizer_config", json.dumps(cfg).encode())
    for c in tok_cfgs:
        add("fuzz_tokenizer_config", c)

    texts = [b"In the beginning God created the heaven and the earth.",
             "Caf\u00e9 \u65e5\u672c\u8a9e \U0001F600 \t\n  x".encode(), b"\xff\xfe invalid \xc3 utf-8 \xe2\x82",
             b"<s> special </s> tokens <pad>", b"1234567 digits,,, punctuation!!"]
    for tok in sorted(glob.glob(os.path.join(repo, "tests", "data", "tokenizers", "*.json"))):
        if os.path.basename(tok) == "cases.json":
            continue
        add("fuzz_tokenizer", read(tok) + SEP + SEP + texts[len(seeds.get("fuzz_tokenizer", [])) % len(texts)])
    add("fuzz_tokenizer", read(os.path.join(models[0], "tokenizer.json")) + SEP + tok_cfgs[0] + SEP + texts[0])

    for i, t in enumerate(texts):
        for mode in range(8):
            add("fuzz_encode", bytes([mode]) + t)
    for mode in range(6):
        add("fuzz_detokenizer", bytes([mode]) + bytes(range(256)) * 2)
        add("fuzz_detokenizer", bytes([mode]) + struct.pack("<8H", 0, 1, 2, 300, 4000, 8191, 8195, 0xFFFF))

    cases = []
    with open(os.path.join(repo, "tests", "data", "chat_cases.jsonl"), "rb") as f:
        for line in f:
            if line.strip():
                cases.append(json.loads(line))
    for i, t in enumerate(templates):
        c = cases[i % len(cases)]
        req = {"messages": c["messages"]}
        if "tools" in c:
            req["tools"] = c["tools"]
        add("fuzz_chat_template", read(t) + SEP + json.dumps(req).encode())

    # Request bodies as the OpenAI clients send them, from the chat cases and a few completions.
    for c in cases:
        req = {"model": "m", "messages": c["messages"], "temperature": 0.7, "top_p": 0.9, "max_tokens": 32,
               "stream": True, "stream_options": {"include_usage": True}, "stop": ["\n\n", "END"], "seed": 7}
        if "tools" in c:
            req["tools"] = c["tools"]
        add("fuzz_request", json.dumps(req).encode())
    for req in ({"prompt": "In the beginning", "max_tokens": 8, "temperature": 0},
                {"prompt": [1, 2, 3, 70000], "stop": "x", "n": 1, "top_k": 40, "min_p": 0.05},
                {"prompt": ["one"], "repeat_penalty": 1.1, "stream": False, "max_completion_tokens": 4},
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "presence_penalty": 0, "frequency_penalty": 0}):
        add("fuzz_request", json.dumps(req).encode())

    for target, items in seeds.items():
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        for i, data in enumerate(items):
            with open(os.path.join(d, "seed-%03d" % i), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()

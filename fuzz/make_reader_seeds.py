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
        glob.glob(os.path.join(repo, "tests", "data", "*", "config.json"))) + sorted(
        glob.glob(os.path.join(repo, "tests", "data", "models", "*", "config.json")))
    for c in configs:
        add("fuzz_config", read(c))
    # the MoE fields beyond the tiny model's: the hub's num_experts name, sparse steps, an unnormalized
    # top-k, and each field refused by name (a shared expert, another gating, scaled or grouped routing)
    moe = json.loads(read(os.path.join(repo, "tests", "data", "models", "qwen3moe-tiny", "config.json")))
    hub = dict(moe, num_experts=moe.pop("num_local_experts"), decoder_sparse_step=2, mlp_only_layers=[0, 2],
               norm_topk_prob=False)
    add("fuzz_config", json.dumps(hub).encode())
    for field, value in [("shared_expert_intermediate_size", 64), ("n_shared_experts", 1), ("scoring_func", "sigmoid"),
                         ("routed_scaling_factor", 2.5), ("n_group", 4), ("num_experts_per_tok", 65)]:
        add("fuzz_config", json.dumps(dict(hub, **{field: value})).encode())

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
    # Grammars: GBNF with every construct, and the JSON Schema corpus (a schema's text starts with '{').
    for g in (b'root ::= ("yes" | "no") " " [0-9]{1,3} "."', b'root ::= obj\nobj ::= "{" ws (pair ("," ws pair)*)? "}"\n'
              b'pair ::= str ws ":" ws val\nval ::= str | [0-9]+ | obj\nstr ::= "\\"" [^"\\\\]* "\\""\nws ::= [ \\t\\n]?',
              b'root ::= [^\\x00-\\x1f]* . [\\u00e9-\\U0001F600]+ # comment\n  | "a"? "b"+ "c"{2,}'):
        add("fuzz_grammar", g + SEP + b'yes 12.')
    for p in sorted(glob.glob(os.path.join(repo, "tests", "data", "json_schemas", "*", "*.json")))[::7]:
        doc = json.loads(read(p))
        if "schema" in doc:
            valid = doc.get("valid") or [None]
            add("fuzz_grammar", json.dumps(doc["schema"]).encode() + SEP + json.dumps(valid[0]).encode())
    # GGUF: small files of every metadata type, a gpt2 and a llama vocabulary, a few tensors; and the
    # shipped llama.cpp file's header (metadata and tensor infos) with its data cut off.
    def gguf_str(b):
        return struct.pack("<Q", len(b)) + b

    def gguf_file(kvs, tensors, alignment=32):
        out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
        for key, typ, payload in kvs:
            out += gguf_str(key.encode()) + struct.pack("<I", typ) + payload
        off, data = 0, b""
        for name, dims, typ, raw in tensors:
            out += gguf_str(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", typ, off)
            pad = (-len(raw)) % alignment
            data += raw + b"\0" * pad
            off += len(raw) + pad
        out += b"\0" * ((-len(out)) % alignment)
        return out + data

    def arr(typ, items, fmt=None):
        body = b"".join(gguf_str(x) for x in items) if fmt is None else b"".join(struct.pack(fmt, x) for x in items)
        return struct.pack("<IQ", typ, len(items)) + body

    u32 = lambda v: struct.pack("<I", v)
    tokens = [b"<s>", b"</s>", b"a", b"b", b"ab", b"\xc4\xa0", b"\xc4\xa0a"]
    common = [("general.architecture", 8, gguf_str(b"llama")), ("llama.block_count", 4, u32(1)),
              ("llama.embedding_length", 4, u32(32)), ("llama.feed_forward_length", 4, u32(32)),
              ("llama.attention.head_count", 4, u32(2)), ("llama.attention.head_count_kv", 4, u32(1)),
              ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)), ("general.alignment", 4, u32(32)),
              ("tokenizer.ggml.tokens", 9, arr(8, tokens)),
              ("tokenizer.ggml.token_type", 9, arr(5, [3, 3, 1, 1, 1, 1, 1], "<i")),
              ("tokenizer.ggml.bos_token_id", 4, u32(0)), ("tokenizer.ggml.add_bos_token", 7, b"\1")]
    every = [("u8", 0, b"\x07"), ("i8", 1, b"\xff"), ("u16", 2, b"\1\2"), ("i16", 3, b"\xff\xff"),
             ("u64", 10, struct.pack("<Q", 1 << 40)), ("i64", 11, struct.pack("<q", -5)),
             ("f64", 12, struct.pack("<d", 0.25)), ("nested", 9, struct.pack("<IQ", 9, 2) + arr(4, [1, 2], "<I") +
                                                   arr(8, [b"x"]))]
    tens = [("token_embd.weight", [32, 7], 0, struct.pack("<224f", *([0.5] * 224))),
            ("output_norm.weight", [32], 0, struct.pack("<32f", *([1.0] * 32))),
            ("blk.0.attn_q.weight", [32, 32], 8, (b"\0\x3c" + bytes(range(32))) * 32)]
    add("fuzz_gguf", gguf_file(common + every + [("tokenizer.ggml.model", 8, gguf_str(b"gpt2")),
                                                 ("tokenizer.ggml.pre", 8, gguf_str(b"llama-bpe")),
                                                 ("tokenizer.ggml.merges", 9, arr(8, [b"a b", b"\xc4\xa0 a"]))], tens))
    add("fuzz_gguf", gguf_file(common + [("tokenizer.ggml.model", 8, gguf_str(b"llama")),
                                         ("tokenizer.ggml.scores", 9, arr(6, [0, 0, -1, -2, -3, -4, -5], "<f"))],
                               tens[:2], 64))
    real = read(os.path.join(repo, "tests", "data", "gguf", "kjv-tiny-Q8_0.gguf"))
    add("fuzz_gguf", real[:300000])
    # the newer architectures' keys (gemma3's pattern and soft-capping, phi3's partial rotary and
    # LongRoPE keys), on the same small body, and llama.cpp's files of the tiny reference models
    for arch, extra in [(b"qwen3", []),
                        (b"gemma3", [("attention.sliding_window", 4, u32(4)),
                                     ("attention.sliding_window_pattern", 4, u32(3)),
                                     ("final_logit_softcapping", 6, struct.pack("<f", 30.0)),
                                     ("rope.freq_base_swa", 6, struct.pack("<f", 10000.0)),
                                     ("rope.scaling.type", 8, gguf_str(b"linear")),
                                     ("rope.scaling.factor", 6, struct.pack("<f", 8.0))]),
                        (b"phi3", [("rope.dimension_count", 4, u32(12)),
                                   ("rope.scaling.attn_factor", 6, struct.pack("<f", 1.19)),
                                   ("rope.scaling.original_context_length", 4, u32(256))]),
                        (b"smollm3", [("no_rope_layers", 9, arr(5, [1], "<i"))])]:
        a = arch.decode()
        kv = [(k.replace("llama", a) if k.startswith("llama.") else k, t, v) for k, t, v in common]
        kv = [("general.architecture", 8, gguf_str(arch)) if k == "general.architecture" else (k, t, v) for k, t, v in kv]
        kv += [(a + "." + k, t, v) for k, t, v in extra] + [("tokenizer.ggml.model", 8, gguf_str(b"gpt2")),
                                                             ("tokenizer.ggml.merges", 9, arr(8, [b"a b"]))]
        add("fuzz_gguf", gguf_file(kv, tens))
    # qwen3moe: the expert keys (and those refused by value) and a sparse layer's tensors, router and
    # stacked experts [hidden, inter, E]; a second layer without ffn_gate_inp is a dense one
    f32 = lambda n, v=0.01: struct.pack("<%df" % n, *([v] * n))
    moe_kv = [(k.replace("llama", "qwen3moe") if k.startswith("llama.") else k, t, v) for k, t, v in common]
    moe_kv = [("general.architecture", 8, gguf_str(b"qwen3moe")) if k == "general.architecture" else (k, t, v)
              for k, t, v in moe_kv if k != "qwen3moe.block_count"]
    moe_kv += [("qwen3moe.block_count", 4, u32(2)), ("qwen3moe.expert_count", 4, u32(4)),
               ("qwen3moe.expert_used_count", 4, u32(2)), ("qwen3moe.expert_feed_forward_length", 4, u32(8)),
               ("qwen3moe.expert_weights_norm", 7, b"\0"), ("qwen3moe.attention.key_length", 4, u32(16)),
               ("qwen3moe.attention.value_length", 4, u32(16)), ("tokenizer.ggml.model", 8, gguf_str(b"gpt2")),
               ("tokenizer.ggml.merges", 9, arr(8, [b"a b"]))]
    moe_tens = tens[:2] + [("blk.0.ffn_gate_inp.weight", [32, 4], 0, f32(128)),
                           ("blk.0.ffn_gate_exps.weight", [32, 8, 4], 0, f32(1024)),
                           ("blk.0.ffn_up_exps.weight", [32, 8, 4], 0, f32(1024)),
                           ("blk.0.ffn_down_exps.weight", [8, 32, 4], 0, f32(1024)),
                           ("blk.1.ffn_gate.weight", [32, 32], 0, f32(1024))]
    add("fuzz_gguf", gguf_file(moe_kv, moe_tens))
    for key, typ, payload in [("expert_shared_count", 4, u32(1)), ("expert_weights_scale", 6, struct.pack("<f", 2.5)),
                              ("expert_gating_func", 4, u32(2)), ("expert_used_count", 4, u32(5))]:
        kv = [x for x in moe_kv if x[0] != "qwen3moe." + key] + [("qwen3moe." + key, typ, payload)]
        add("fuzz_gguf", gguf_file(kv, moe_tens))
    for g in sorted(glob.glob(os.path.join(repo, "tests", "data", "models", "gguf", "*.gguf"))):
        add("fuzz_gguf", read(g)[:300000])

    for target, items in seeds.items():
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        for i, data in enumerate(items):
            with open(os.path.join(d, "seed-%03d" % i), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()

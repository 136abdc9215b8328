#!/usr/bin/env python3
"""Per-tensor type, dims and SHA-256 of the data of GGUF files, as JSON (no third-party modules).

Made tests/data/gguf/llama-quantize-kjv-tiny.json from llama-quantize's files of kjv-tiny (a
llama.cpp build, outside the repository):

    Q=/path/to/llama.cpp/build/bin; export LD_LIBRARY_PATH=$Q
    for t in Q4_K_M Q5_K_M Q6_K Q4_0; do
      $Q/llama-quantize ../shared/models/gguf/kjv-tiny-F32.gguf /tmp/kjv-tiny-$t.gguf $t 1; done
    scripts/gguf_tensor_manifest.py Q4_K_M=/tmp/kjv-tiny-Q4_K_M.gguf ... > tests/data/gguf/llama-quantize-kjv-tiny.json

tests/data/gguf/llama-quantize-Q4_K_M-types.json: the same of `llama-quantize --allow-requantize
../shared/models/gguf/M-Q8_0.gguf /tmp/M-Q4_K_M.gguf Q4_K_M 1` for M = mistral-tiny and
llama-mha-ropescaled-tiny, the "sha256" entries deleted (a requantization's bytes).

tests/data/gguf/llama-quantize-kjv-small.json: Q5_K_M and Q6_K of kjv-small, by llama-quantize from
`posttrainllm quantize ../shared/models/kjv-small /tmp/kjv-small-F32.gguf --format gguf --type F32`.

tests/test_gguf.cpp checks that our writer's file of the same model has the same tensors with the
same types and bytes.
"""
import hashlib
import json
import struct
import sys

GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
# (values per block, bytes per block)
BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22),
          "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
          "Q5_K": (256, 176), "Q6_K": (256, 210)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def manifest(path):
    data = open(path, "rb").read()
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            raise SystemExit(f"{path}: truncated at byte {pos}")
        b = data[pos:pos + n]
        pos += n
        return b

    u32 = lambda: struct.unpack("<I", take(4))[0]
    u64 = lambda: struct.unpack("<Q", take(8))[0]
    string = lambda: take(u64()).decode("utf-8")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = u32(), u64()
            return [value(et) for _ in range(n)]
        raw = take(SCALAR[t])
        return struct.unpack("<I", raw)[0] if t == 4 else raw  # only general.alignment (u32) is read

    if take(4) != b"GGUF" or u32() != 3:
        raise SystemExit(f"{path}: not GGUF version 3")
    n_tensors, n_kv = u64(), u64()
    alignment = 32
    for _ in range(n_kv):
        key, t = string(), u32()
        v = value(t)
        if key == "general.alignment":
            alignment = v
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [u64() for _ in range(u32())]
        infos.append((name, dims, GGML_TYPES[u32()], u64()))
    start = (pos + alignment - 1) // alignment * alignment
    out = {}
    for name, dims, t, off in infos:
        per, nbytes = BLOCKS[t]
        n = 1
        for d in dims:
            n *= d
        size = n // per * nbytes
        blob = data[start + off:start + off + size]
        out[name] = {"type": t, "dims": dims, "sha256": hashlib.sha256(blob).hexdigest()}
    return out


def main():
    result = {}
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        result[label] = manifest(path)
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Runs bad inputs across the CLI and prints docs/errors.md's table (the message each gets, as run).
#   scripts/errors_table.sh > docs/errors.md.table
set -uo pipefail
cd "$(dirname "$0")/.."
B=${PTLLM_BIN:-build/posttrainllm}
M=models/kjv-tiny
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# A copy of kjv-tiny with one file replaced: mk NAME FILE CONTENT-COMMAND
mk() {
  local d="$T/$1"
  mkdir -p "$d"
  for f in $M/*; do [ "$(basename "$f")" = "$2" ] || ln -sf "$PWD/$f" "$d/"; done
  echo "$d"
}
cfg() {  # a config.json with one edit (python expression on c)
  local d; d=$(mk "$1" config.json)
  python3 -c "import json,sys; c=json.load(open('$M/config.json')); $2; json.dump(c, open('$d/config.json','w'))"
  echo "$d"
}
tokjson() {  # tokenizer.json edited (t) and tokenizer_config.json edited (k)
  local d; d=$(mk "$1" tokenizer.json); rm -f "$d/tokenizer_config.json"
  python3 -c "
import json; t=json.load(open('$M/tokenizer.json')); k=json.load(open('$M/tokenizer_config.json'))
$2
json.dump(t, open('$d/tokenizer.json','w')); json.dump(k, open('$d/tokenizer_config.json','w'))"
  echo "$d"
}

row() {  # row "INPUT" command...
  local what=$1; shift
  local out rc
  out=$(cd "$PWD" && timeout 30 "$@" 2>&1 </dev/null | grep -E '^(error|warning)|status: damaged' | sed "s#$T#DIR#g" | head -3 | tr '\n' ' ')
  rc=${PIPESTATUS[0]}
  out=${out//|/\\|}
  printf '| %s | `%s` |\n' "$what" "${out% }"
}

S="sample $M -p hi -n 1"
F="sample $M -n 1"
mkfifo "$T/fifo"
: > "$T/empty"
printf '{"a": ' > "$T/trunc.json"
head -c 100 /dev/urandom > "$T/random.bin"
printf 'hello\n' > "$T/notes.txt"
truncate -s 3G "$T/huge.txt"

echo "| Bad input | Message |"
echo "|---|---|"
row "model directory missing" $B sample "$T/none" -p hi
row "config.json missing" $B sample "$(mk noconfig config.json)" -p hi
d=$(mk cfgempty config.json); : > "$d/config.json"; row "config.json empty" $B sample "$d" -p hi
d=$(mk cfgtrunc config.json); cp "$T/trunc.json" "$d/config.json"; row "config.json truncated" $B sample "$d" -p hi
d=$(mk cfgsyntax config.json); printf '{\n  "hidden_size": 128,\n  num_hidden_layers: 4\n}\n' > "$d/config.json"; row "config.json with a syntax error" $B sample "$d" -p hi
d=$(mk cfgfifo config.json); ln -s "$T/fifo" "$d/config.json"; row "config.json a FIFO" $B sample "$d" -p hi
d=$(mk cfgdev config.json); ln -s /dev/zero "$d/config.json"; row "config.json -> /dev/zero" $B sample "$d" -p hi
d=$(mk cfghuge config.json); ln -s "$T/huge.txt" "$d/config.json"; row "config.json of 3 GB" $B sample "$d" -p hi
row "num_attention_heads 134217732 (wraps in 32 bits)" $B sample "$(cfg heads 'c["num_attention_heads"]=134217732; c["num_key_value_heads"]=134217732')" -p hi
row "num_hidden_layers 10000000" $B sample "$(cfg layers 'c["num_hidden_layers"]=10000000')" -p hi
row "num_hidden_layers 1e7 (a float)" $B sample "$(cfg layersf 'c["num_hidden_layers"]=1e7')" -p hi
row "vocab_size -1" $B sample "$(cfg vocab 'c["vocab_size"]=-1')" -p hi
row "hidden_size a string" $B sample "$(cfg hs 'c["hidden_size"]="128"')" -p hi
row "unsupported architecture" $B sample "$(cfg arch 'c["architectures"]=["GPT2LMHeadModel"]')" -p hi
row "hidden_size mismatching the weights" $B sample "$(cfg hs2 'c["hidden_size"]=256')" -p hi
d=$(mk stnone model.safetensors); row "model.safetensors missing" $B sample "$d" -p hi
d=$(mk stempty model.safetensors); : > "$d/model.safetensors"; row "model.safetensors empty" $B sample "$d" -p hi
d=$(mk sttrunc model.safetensors); head -c 1000 $M/model.safetensors > "$d/model.safetensors"; row "model.safetensors truncated" $B sample "$d" -p hi
d=$(mk sthdr model.safetensors); python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<Q', 2<<30) + b'{}')" > "$d/model.safetensors"; row "safetensors header length 2 GB" $B sample "$d" -p hi
d=$(mk strand model.safetensors); cp "$T/random.bin" "$d/model.safetensors"; row "model.safetensors random bytes" $B sample "$d" -p hi
d=$(mk stdup model.safetensors); python3 -c "
import struct,sys; h=b'{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}'
sys.stdout.buffer.write(struct.pack('<Q', len(h)) + h + b'\0'*8)" > "$d/model.safetensors"; row "a tensor named twice in the header" $B sample "$d" -p hi
d=$(mk stindex model.safetensors); echo '{"metadata": {}, "weight_map": {}}' > "$d/model.safetensors.index.json"; row "model.safetensors.index.json: an empty weight_map" $B sample "$d" -p hi
d=$(mk stfifo model.safetensors); ln -s "$T/fifo" "$d/model.safetensors"; row "model.safetensors a FIFO" $B sample "$d" -p hi
d=$(mk toknone tokenizer.json); row "tokenizer.json missing" $B sample "$d" -p hi
d=$(mk tokempty tokenizer.json); : > "$d/tokenizer.json"; row "tokenizer.json empty" $B sample "$d" -p hi
d=$(mk toktrunc tokenizer.json); head -c 5000 $M/tokenizer.json > "$d/tokenizer.json"; row "tokenizer.json truncated" $B sample "$d" -p hi
d=$(mk tokfifo tokenizer.json); ln -s "$T/fifo" "$d/tokenizer.json"; row "tokenizer.json a FIFO" $B sample "$d" -p hi
d=$(mk tokzero tokenizer.json); ln -s /dev/zero "$d/tokenizer.json"; row "tokenizer.json -> /dev/zero" $B sample "$d" -p hi
row "tokenizer.json: empty vocab" $B sample "$(tokjson tv 't["model"]["vocab"]={}; t["model"]["merges"]=[]; t["added_tokens"]=[]')" -p hi
row "tokenizer.json: two tokens with one id" $B sample "$(tokjson td 't["model"]["vocab"]["zzzz"]=5')" -p hi
row "tokenizer.json: Sequence nested 200 deep" $B sample "$(tokjson tn '
p=t["pre_tokenizer"]
for i in range(200): p={"type":"Sequence","pretokenizers":[p]}
t["pre_tokenizer"]=p')" -p hi
row "tokenizer_config.json: unknown bos_token" $B sample "$(tokjson tb 'k["bos_token"]="<start>"')" -p hi
d=$(mk tcfgtrunc tokenizer_config.json); cp "$T/trunc.json" "$d/tokenizer_config.json"; row "tokenizer_config.json truncated" $B sample "$d" -p hi
row "-f missing file" $B $F -f "$T/none.txt"
row "-f a FIFO" $B $F -f "$T/fifo"
row "eval --text missing" $B eval $M --text "$T/none.txt"
row "eval --text a FIFO" $B eval $M --text "$T/fifo"
row "eval --text /dev/zero" $B eval $M --text /dev/zero
row "eval --text of 3 GB" $B eval $M --text "$T/huge.txt"
row "eval --text empty" $B eval $M --text "$T/empty"
row "--temperature nan" $B $S --temperature nan
row "tokenizer_config.json: bos_token an id" $B sample "$(tokjson tb 'k["bos_token"]=0')" -p hi
row "tokenizer_config.json: bos_token {\"content\": 7}" $B sample "$(tokjson tc 'k["bos_token"]={"content": 7}')" -p hi
row "--top-p 2" $B $S --top-p 2
row "--min-p nan" $B $S --min-p nan
row "--repeat-penalty nan" $B $S --repeat-penalty nan
row "--seed ''" $B $S --seed ''
row "--seed abc" $B $S --seed abc
row "--prompt-cache-max-mb nan" $B $S --prompt-cache-dir "$T/pc" --prompt-cache-max-mb nan
row "--ctx-size 2000000000" $B $S --ctx-size 2000000000 --no-kv-preallocate
row "--ctx-size 0" $B $S --ctx-size 0
big=$(cfg bigctx "c['max_position_embeddings']=1<<30")
row "--ctx-size 1073741824 (more than RAM)" $B sample "$big" -p hi -n 1 --ctx-size 1073741824
row "--kv-quantize int3" $B $S --kv-quantize int3
row "--threads 100000" $B $S --threads 100000
row "--streaming-llm-window 2147483647" $B $S --streaming-llm-window 2147483647
row "stdout on a full disk" sh -c "exec $B $S >/dev/full"
row "stdout closed" sh -c "exec $B $S >&-"
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}' > "$T/t.jinja"
row "chat: a turn with no line end (/dev/zero)" sh -c "exec $B chat $M --chat-template $T/t.jinja </dev/zero"
row "--cache-prompt a text file (kept)" $B $S --cache-prompt "$T/notes.txt"
printf 'PTLLMKVC are the first bytes of a prompt-cache file\n' > "$T/magic.txt"
row "--cache-prompt a text file beginning with PTLLMKVC (kept)" $B $S --cache-prompt "$T/magic.txt"
row "--cache-prompt a FIFO" $B $S --cache-prompt "$T/fifo"
row "--cache-prompt /dev/null" $B $S --cache-prompt /dev/null
row "--cache-prompt random bytes" $B $S --cache-prompt "$T/random.bin"
row "--prompt-cache-dir a file" $B $S --prompt-cache-dir "$T/notes.txt"
head -c 400 README.md > "$T/long.txt"
row "a save at ulimit -f" sh -c "ulimit -f 8; exec $B $F -f $T/long.txt --prompt-cache-dir $T/small"
row "cache inspect a missing file" $B cache inspect "$T/none.kvcache"
row "cache inspect a FIFO" $B cache inspect "$T/fifo"
row "cache inspect random bytes" $B cache inspect "$T/random.bin"
row "cache ls a missing directory" $B cache ls "$T/nodir"
row "tokenize --file a FIFO" $B tokenize $M --file "$T/fifo"
row "template a missing file" $B template "$T/none.jinja" --messages "$T/none.json"
# GGUF files (docs/gguf.md)
Q=tests/data/gguf/kjv-tiny-Q8_0.gguf
row ".gguf missing" $B sample "$T/none.gguf" -p hi
: > "$T/empty.gguf"; row ".gguf empty" $B sample "$T/empty.gguf" -p hi
head -c 100000 $Q > "$T/trunc.gguf"; row ".gguf truncated in the metadata" $B sample "$T/trunc.gguf" -p hi
head -c 1500000 $Q > "$T/trunc2.gguf"; row ".gguf truncated in the tensor data" $B sample "$T/trunc2.gguf" -p hi
cp "$T/random.bin" "$T/random.gguf"; row ".gguf random bytes" $B sample "$T/random.gguf" -p hi
ln -s "$T/fifo" "$T/fifo.gguf"; row ".gguf a FIFO" $B sample "$T/fifo.gguf" -p hi
python3 -c "
import sys; d=bytearray(open('$Q','rb').read()); i=d.find(b'llama', 0, 200); d[i:i+5]=b'gemma'; open('$T/arch.gguf','wb').write(d)"
row ".gguf unsupported architecture" $B sample "$T/arch.gguf" -p hi
python3 -c "
import struct; d=bytearray(open('$Q','rb').read()); struct.pack_into('<Q', d, 8, 1<<40); open('$T/count.gguf','wb').write(d)"
row ".gguf tensor count 2^40" $B sample "$T/count.gguf" -p hi
# An F32 file with token_embd's type id set to Q8_1 (ggml's activation type, which no weight file
# holds): its blocks are smaller than the F32 data, so the file stays in bounds.
$B quantize $M "$T/f32.gguf" --format gguf --type F32 >/dev/null 2>&1
python3 -c "
import struct; d=bytearray(open('$T/f32.gguf','rb').read()); i=d.find(b'token_embd.weight')+17
n=struct.unpack_from('<I', d, i)[0]; struct.pack_into('<I', d, i+4+8*n, 9); open('$T/q81.gguf','wb').write(d)"
row ".gguf of a block type the kernels lack" $B sample "$T/q81.gguf" -p hi
python3 -c "
import struct; d=bytearray(open('$T/f32.gguf','rb').read()); i=d.find(b'token_embd.weight')+17
a, b = struct.unpack_from('<QQ', d, i+4); struct.pack_into('<QQ', d, i+4, b, a); open('$T/swap.gguf','wb').write(d)"
row ".gguf token_embd with its dims swapped" $B sample "$T/swap.gguf" -p hi
row "chat --chat-template with neither a file nor a built-in name" $B chat $Q --chat-template llama-3 -f "$T/notes.txt"
row "quantize --type Q4_K" $B quantize $M "$T/out.gguf" --type Q4_K

#!/usr/bin/env python3
"""Make the tiny reference models of the architectures added after Llama/Qwen2/Mistral
(Qwen3, Qwen3-MoE, Gemma 3, Phi-3, SmolLM3), train each briefly on the corpus so that its
greedy choices have clear margins, and write goldens computed by transformers in float32
(eager attention, from the saved weights reloaded), in the format of
../shared/models/golden_ref.py. Optionally write GGUF files with llama.cpp's converter.

usage: make_arch_models.py CORPUS_DIR TOKENIZER_DIR OUT_DIR [SECONDS] [LLAMA_CPP_DIR]
  TOKENIZER_DIR: a reference model folder (tokenizer.json of the shared 8192-token BPE)
  LLAMA_CPP_DIR: holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (optional)
Needs a GPU, torch and transformers 5.x.
"""
import json, math, os, shutil, subprocess, sys, time
import torch
import transformers
from tokenizers import Tokenizer
from safetensors.torch import save_file, load_file
from transformers import AutoModelForCausalLM

corpus, tokdir, out = sys.argv[1], sys.argv[2], sys.argv[3]
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
llama_cpp = sys.argv[5] if len(sys.argv) > 5 else None
os.makedirs(out, exist_ok=True)
dev = "cuda"
print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)

tok = Tokenizer.from_file(f"{tokdir}/tokenizer.json")
BOS, EOS = tok.token_to_id("<s>"), tok.token_to_id("</s>")

def docs(name, limit=None):
    ds = [d.strip("\n") for d in open(f"{corpus}/{name}.txt", encoding="utf-8").read().split("\n\x1e\n") if d.strip()]
    return ds[:limit] if limit else ds

def stream(ds):
    ids = []
    for e in tok.encode_batch(ds, add_special_tokens=False):
        ids += [BOS] + e.ids + [EOS]
    return torch.tensor(ids, dtype=torch.long)

t0 = time.time()
train_ids = stream(docs("train", 6000)).to(dev)
val_ids = stream(docs("val")).to(dev)
long_ids = stream(docs("longeval_isaiah"))[:1024].to(dev)
print("tokens", train_ids.numel(), val_ids.numel(), "in", round(time.time() - t0, 1), "s", flush=True)

SEQ = 512
def train(name, model, lr=3e-3, bs=64):
    torch.backends.cuda.matmul.allow_tf32 = True
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    t0 = time.time(); step = 0
    while time.time() - t0 < seconds:
        cur = lr * min(1.0, (step + 1) / 50)
        for g in opt.param_groups: g["lr"] = cur
        off = torch.randint(0, train_ids.numel() - SEQ - 1, (bs,), device=dev)
        x = train_ids[off[:, None] + torch.arange(SEQ + 1, device=dev)[None]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); step += 1
    print(f"[{name}] {sum(p.numel() for p in model.parameters())/1e6:.2f}M params, {step} steps, loss {loss.item():.3f}", flush=True)
    return {"steps": step, "train_loss": loss.item(), "seconds": round(time.time() - t0, 1)}

PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "A fool and his money",
           "Photosynthesis, n. The process", "The quick brown fox jumps over the lazy dog."]

@torch.no_grad()
def goldens(d):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").to(dev).eval()
    g = {"prompts": [], "computed_with": f"transformers {transformers.__version__} float32 eager, from the saved weights"}
    for p in PROMPTS:
        ids = tok.encode(p).ids
        o = model.generate(torch.tensor([ids], device=dev), max_new_tokens=48, do_sample=False,
                           pad_token_id=2, eos_token_id=None)[0, len(ids):].tolist()
        g["prompts"].append({"text": p, "ids": ids, "greedy_ids": o, "greedy_text": tok.decode(o)})
    tf = val_ids[1000:1256].clone(); tf[0] = BOS
    logits = model(tf[None]).logits[0].float()
    nll = -torch.log_softmax(logits, -1)[:-1].gather(1, tf[1:, None])[:, 0]
    top2 = logits.topk(2, -1).values
    g["teacher_forced"] = {"ids": tf.tolist(), "mean_nll": nll.mean().item(), "ppl": math.exp(nll.mean().item()),
                           "min_top2_margin": (top2[:, 0] - top2[:, 1]).min().item()}
    pos = torch.tensor([0, 1, 2, 63, 127, 255], device=dev)
    save_file({"tf_ids": tf.to(torch.int32).cpu().contiguous(), "tf_nll": nll.cpu().contiguous(),
               "tf_argmax": logits.argmax(-1).to(torch.int32).cpu().contiguous(),
               "tf_logits_pos": pos.to(torch.int32).cpu(), "tf_logits": logits[pos].cpu().contiguous()},
              f"{d}/golden.safetensors")
    lg = model(long_ids[None]).logits[0].float()
    lnll = -torch.log_softmax(lg, -1)[:-1].gather(1, long_ids[1:, None])[:, 0]
    lpos = torch.tensor([0, 255, 256, 600, 1023], device=dev)
    save_file({"ids": long_ids.to(torch.int32).cpu().contiguous(), "nll": lnll.cpu().contiguous(),
               "argmax": lg.argmax(-1).to(torch.int32).cpu().contiguous(),
               "logits_pos": lpos.to(torch.int32).cpu(), "logits": lg[lpos].cpu().contiguous()},
              f"{d}/golden_long.safetensors")
    g["long_dense"] = {"n": int(long_ids.numel()), "mean_nll": lnll.mean().item()}
    ids = tok.encode(PROMPTS[1]).ids
    o = model.generate(torch.tensor([ids], device=dev), max_new_tokens=300, do_sample=False, pad_token_id=2, eos_token_id=None)
    g["long_greedy"] = {"text": PROMPTS[1], "ids": ids, "greedy_ids": o[0, len(ids):].tolist()}
    json.dump(g, open(f"{d}/golden.json", "w"), indent=1, ensure_ascii=False)
    print(f"[{d}] tf nll {g['teacher_forced']['mean_nll']:.4f} margin {g['teacher_forced']['min_top2_margin']:.2e} "
          f"long nll {g['long_dense']['mean_nll']:.4f} {g['prompts'][1]['greedy_text'][:60]!r}", flush=True)
    return model

def save_tok(d, extra=None):
    shutil.copy(f"{tokdir}/tokenizer.json", f"{d}/tokenizer.json")
    tc = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": True,
          "model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast"}
    tc.update(extra or {})
    json.dump(tc, open(f"{d}/tokenizer_config.json", "w"), indent=2)

BASE = dict(vocab_size=tok.get_vocab_size(), bos_token_id=BOS, eos_token_id=EOS, pad_token_id=2,
            max_position_embeddings=2048, tie_word_embeddings=True, attention_dropout=0.0)

def build(name, cfg_cls, model_cls, dtype, check=None, tok_extra=None, **kw):
    try:
        cfg = cfg_cls(**{**BASE, **kw})
        torch.manual_seed(sum(map(ord, name)))
        model = model_cls(cfg)
        if check: check(model)
        r = train(name, model)
        d = f"{out}/{name}"; os.makedirs(d, exist_ok=True)
        model.to(dtype).save_pretrained(d)
        save_tok(d, tok_extra)
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": 2}, open(f"{d}/generation_config.json", "w"), indent=2)
        json.dump(r, open(f"{d}/training_log.json", "w"), indent=1)
        keys = sorted(load_file(f"{d}/model.safetensors").keys())
        print(f"[{name}] tensors {len(keys)}: {keys[:6]} ... {keys[-4:]}", flush=True)
        return d
    except Exception:
        import traceback; traceback.print_exc(); print(f"[{name}] FAILED", flush=True)

def inv_freqs(model):
    return {n: b.detach().float().cpu() for n, b in model.named_buffers() if "inv_freq" in n}

made = []
# Qwen3: explicit head_dim (32, while hidden / heads = 16), q_norm / k_norm, no qkv bias.
made.append(build("qwen3-tiny", transformers.Qwen3Config, transformers.Qwen3ForCausalLM, torch.bfloat16,
    hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0))
# Qwen3-MoE: 8 experts top-2, normalized top-k, layer 1 dense (mlp_only_layers).
made.append(build("qwen3moe-tiny", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, torch.bfloat16,
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0, output_router_logits=False))
# Gemma 3 text: local/global layers (window 32, pattern 3), two RoPE bases, linear scaling on global,
# query_pre_attn_scalar != head_dim, final logit soft-capping.
def gemma_check(model):
    f = inv_freqs(model); print("[gemma3] inv_freq buffers", {k: (v.shape, v[:2].tolist()) for k, v in f.items()}, flush=True)
made.append(build("gemma3-tiny", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, torch.bfloat16,
    check=gemma_check, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=32, sliding_window_pattern=3,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
    final_logit_softcapping=30.0, attn_logit_softcapping=None, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh"))
# Phi-3 / Phi-4-mini: fused qkv and gate_up, partial rotary 0.75, LongRoPE (original 256, max 2048).
rot_half = int(32 * 0.75) // 2
short_f = [1.0 + 0.02 * i for i in range(rot_half)]
long_f = [1.0 + 0.6 * i for i in range(rot_half)]
def phi_check(model):
    f = inv_freqs(model); print("[phi3] inv_freq buffers", {k: (v.shape, v[:3].tolist()) for k, v in f.items()}, flush=True)
made.append(build("phi3-tiny", transformers.Phi3Config, transformers.Phi3ForCausalLM, torch.bfloat16,
    check=phi_check, tok_extra={"tokenizer_class": "GPT2Tokenizer"},
    hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
    partial_rotary_factor=0.75, rms_norm_eps=1e-5, rope_theta=10000.0, original_max_position_embeddings=256,
    rope_scaling={"type": "longrope", "short_factor": short_f, "long_factor": long_f},
    resid_pdrop=0.0, embd_pdrop=0.0, sliding_window=None))
# SmolLM3: RoPE in layers 0 and 2, none in 1 and 3.
made.append(build("smollm3-tiny", transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM, torch.bfloat16,
    hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    no_rope_layers=[1, 0, 1, 0], rms_norm_eps=1e-6, rope_theta=2000000.0, use_sliding_window=False))
made = [d for d in made if d]

for d in made:
    try:
        print(open(f"{d}/config.json").read(), flush=True)
        goldens(d)
    except Exception:
        import traceback; traceback.print_exc(); print(f"[{d}] goldens FAILED", flush=True)

# The text part of a Gemma3ForConditionalGeneration checkpoint: same weights under the multimodal names.
g = f"{out}/gemma3-tiny"
if os.path.exists(f"{g}/golden.json"):
    mm = f"{out}/gemma3mm-tiny"; os.makedirs(mm, exist_ok=True)
    sd = load_file(f"{g}/model.safetensors")
    save_file({"language_model." + k: v for k, v in sd.items()}, f"{mm}/model.safetensors", metadata={"format": "pt"})
    tc = json.load(open(f"{g}/config.json"))
    for k in ("architectures", "transformers_version", "dtype"): tc.pop(k, None)
    json.dump({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "dtype": "bfloat16",
               "text_config": tc, "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32,
               "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
               "mm_tokens_per_image": 4, "boi_token_index": 8189, "eoi_token_index": 8190, "image_token_index": 8191},
              open(f"{mm}/config.json", "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"): shutil.copy(f"{g}/{f}", f"{mm}/{f}")
    print("[gemma3mm-tiny] written (text weights under language_model.)", flush=True)

if llama_cpp:
    wrap = f"{out}/convert_wrap.py"
    open(wrap, "w").write(f"""import sys
sys.path.insert(0, {llama_cpp!r}); sys.path.insert(1, {llama_cpp + '/gguf-py'!r})
import conversion.base as b
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = {llama_cpp + '/convert_hf_to_gguf.py'!r}
import runpy; runpy.run_path(sys.argv[0], run_name="__main__")
""")
    os.makedirs(f"{out}/gguf", exist_ok=True)
    for d in made:
        n = os.path.basename(d)
        for t in ("bf16", "q8_0"):
            r = subprocess.run([sys.executable, wrap, d, "--outtype", t, "--outfile", f"{out}/gguf/{n}-{t.upper()}.gguf"],
                               capture_output=True, text=True)
            print(f"[{n}] gguf {t}: rc {r.returncode}", r.stderr[-1500:] if r.returncode else "", flush=True)

"""Random-weight models of real shapes for GPU benchmarks, written fast.

    python3 make_big_model.py OUT_DIR SHAPE [--q4 | --q8] [--tokenizer-from DIR]

SHAPE is `llama-8b` (Llama 3 8B), `llama-1b` (Llama 3.2 1B), `qwen3-4b` (Qwen3 4B) or `qwen3-30b-a3b`
(Qwen3-30B-A3B: 128 experts, 8 per token; `--q4` or `--q8` only, its routers 8-bit as
mlx-lm's converter leaves them), or a small shape (`llama-small`, `mistral-small`,
`qwen3-small`, `qwen3-moe-small`) for gpu_decode_check.sh. Weights are bf16 (or MLX affine 4-bit, group
64, with bf16 scales and biases, as mlx-community checkpoints are) in the
HF/MLX layout Grove and mlx-lm load (experts stacked as mlx-lm saves them). Only torch (GPU if
present), numpy and safetensors are needed, so this runs on a GPU host without
mlx. The numbers are random: the models are for speed, not text.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SHAPES = {
    # Small models of the shapes Grove's CUDA decode step covers, for quick
    # comparisons of its logits and tokens with MLX's step (gpu_decode_check.sh).
    "llama-small": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "intermediate_size": 2816,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "mistral-small": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "intermediate_size": 3072,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    "qwen3-small": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    # Qwen2.5-32B's sizes on Llama's layout (no q/k/v biases).
    "llama-32b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "intermediate_size": 27648,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    "llama-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "llama-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
}

# Qwen3-30B-A3B's layout at a small size: 64 experts of 512, 8 a token.
SHAPES["qwen3-moe-small"] = {
    **SHAPES["qwen3-30b-a3b"],
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "moe_intermediate_size": 512,
    "num_experts": 64,
    "num_attention_heads": 16,
}

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GROUP = 64
RNG = np.random.default_rng(0)


def dense(rows: int, cols: int) -> torch.Tensor:
    """A bf16 matrix with roughly unit-variance outputs."""
    return (torch.randn(rows, cols, device=DEVICE) * cols**-0.5).to(torch.bfloat16).cpu()


def packed(rows: int, cols: int, bits: int = 4, experts: int = 0) -> dict:
    """An MLX affine matrix (`experts` of them stacked when > 0): uint32 words
    of `bits`-wide values, bf16 scales and biases centring them."""
    lead = (experts,) if experts else ()
    words = RNG.integers(0, 2**32, size=(*lead, rows, cols * bits // 32), dtype=np.uint32)
    top = 2**bits - 1
    scale = 2.0 / top * cols**-0.5
    return {
        "weight": torch.from_numpy(words),
        "scales": torch.full((*lead, rows, cols // GROUP), scale, dtype=torch.bfloat16),
        "biases": torch.full((*lead, rows, cols // GROUP), -top / 2 * scale, dtype=torch.bfloat16),
    }


def linear(tensors: dict, name: str, rows: int, cols: int, bits: int) -> None:
    """Adds `name.weight` (and scales/biases when quantized to `bits` bits; 0: bf16)."""
    if bits:
        for key, value in packed(rows, cols, bits=bits).items():
            tensors[f"{name}.{key}"] = value
    else:
        tensors[f"{name}.weight"] = dense(rows, cols)


def layer_tensors(cfg: dict, i: int, bits: int) -> dict:
    """One decoder layer's tensors."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // heads)
    p = f"model.layers.{i}"
    t: dict = {}
    linear(t, f"{p}.self_attn.q_proj", heads * hd, h, bits)
    linear(t, f"{p}.self_attn.k_proj", kv * hd, h, bits)
    linear(t, f"{p}.self_attn.v_proj", kv * hd, h, bits)
    linear(t, f"{p}.self_attn.o_proj", h, heads * hd, bits)
    if cfg["model_type"] == "qwen3_moe":
        # The router 8-bit, the experts stacked 4- or 8-bit (mlx-lm's layout).
        e, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
        for key, value in packed(e, h, bits=8).items():
            t[f"{p}.mlp.gate.{key}"] = value
        for name, rows, cols in (("gate_proj", mi, h), ("up_proj", mi, h), ("down_proj", h, mi)):
            for key, value in packed(rows, cols, bits=bits, experts=e).items():
                t[f"{p}.mlp.switch_mlp.{name}.{key}"] = value
    else:
        linear(t, f"{p}.mlp.gate_proj", inter, h, bits)
        linear(t, f"{p}.mlp.up_proj", inter, h, bits)
        linear(t, f"{p}.mlp.down_proj", h, inter, bits)
    t[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    t[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    if cfg["model_type"] in ("qwen3", "qwen3_moe"):
        t[f"{p}.self_attn.q_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
        t[f"{p}.self_attn.k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--q4", dest="bits", action="store_const", const=4, default=0)
    ap.add_argument("--q8", dest="bits", action="store_const", const=8)
    ap.add_argument("--tokenizer-from", type=Path)
    args = ap.parse_args()
    cfg = dict(SHAPES[args.shape], torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    if cfg["model_type"] == "qwen3_moe" and not args.bits:
        ap.error("the expert shapes are made quantized only (--q4, --q8)")
    if args.bits:
        cfg["quantization"] = {"group_size": GROUP, "bits": args.bits, "mode": "affine"}
        if cfg["model_type"] == "qwen3_moe":
            for i in range(cfg["num_hidden_layers"]):
                cfg["quantization"][f"model.layers.{i}.mlp.gate"] = {"group_size": GROUP, "bits": 8}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    weight_map = {}
    shards = [{}]
    linear(shards[0], "model.embed_tokens", vocab, h, args.bits)
    shards[0]["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    if not cfg["tie_word_embeddings"]:
        linear(shards[0], "lm_head", vocab, h, args.bits)
    for i in range(cfg["num_hidden_layers"]):
        if i % 4 == 0:
            shards.append({})
        shards[-1].update(layer_tensors(cfg, i, args.bits))
    n = len(shards)
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(args.out / name), metadata={"format": "mlx"})
        weight_map.update({t: name for t in shard})
    (args.out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2))
    if args.tokenizer_from:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (args.tokenizer_from / f).exists():
                shutil.copy(args.tokenizer_from / f, args.out / f)
    print(f"{args.out}: {args.shape} {f'{args.bits}-bit' if args.bits else 'bf16'}, {n} shards")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Grove against llama.cpp on the CPU, on the same GGUF files, in one run.

    python3 tests/bench/cpu.py --runner target/release/grove-runner \
        --gguf NAME=FILE [--gguf NAME=FILE ...] [--prompt-lens 128,1024] \
        [--max-tokens 64] [--threads 2] [--llama-1b DIR]

llama.cpp is PyPI's `xllamacpp` (llama.cpp's own server, in this process);
Grove is `grove-runner generate` on the same file (it imports GGUF itself:
Q4_0/Q4_1/Q8_0 as MLX affine 4/8-bit with groups of 32, K-quants re-quantized
to 4-bit). Both get the same random prompt ids (no BOS added), greedy
decoding, the same thread count (GROVE_CPU_THREADS for Grove; its OpenBLAS
uses as many), and each is warmed up first: llama.cpp by a short completion,
Grove by `--repeat 2` (the second run's figures are used). llama.cpp ignores
EOS; Grove stops at it, so its decode rate may come from fewer tokens (the
table says how many). Ratios are Grove / llama.cpp. It reports, asserts
nothing.

`--llama-1b DIR` also builds a Llama-3.2-1B-shaped model with random weights
in DIR (once), as a GGUF file of Q4_0 blocks (the `gguf` package quantizes),
and runs it as a third model.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

RUNNER_TIMEOUT_S = 1800


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompt_ids(vocab: int, length: int, seed: int) -> list:
    rng = random.Random(seed)
    # Skip the first ids (special tokens in both vocabularies benchmarked).
    return [rng.randrange(300, vocab - 300) for _ in range(length)]


def llama_cpp(gguf: Path, prompts: dict, max_tokens: int, threads: int) -> dict:
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = str(gguf)
    p.n_ctx = max(len(v) for v in prompts.values()) + max_tokens + 16
    p.n_parallel = 1
    p.n_batch = 2048
    p.n_ubatch = 512
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.n_gpu_layers = 0
    p.warmup = True
    server = xlc.Server(p)

    def complete(ids: list, n: int) -> dict:
        out = server.handle_completions(
            {
                "prompt": ids,
                "n_predict": n,
                "temperature": 0.0,
                "top_k": 1,
                "cache_prompt": False,
                "ignore_eos": True,
            }
        )
        if isinstance(out, str):
            out = json.loads(out)
        if "timings" not in out:
            raise RuntimeError(f"llama.cpp gave no timings: {str(out)[:500]}")
        return out["timings"]

    complete(prompts[min(prompts)][:16], 4)  # warm-up
    results = {}
    for length, ids in prompts.items():
        t = complete(ids, max_tokens)
        results[length] = {
            "prompt_tps": t["prompt_per_second"],
            "decode_tps": t["predicted_per_second"],
            "tokens": t["predicted_n"],
        }
    del server
    return results


def grove(runner: Path, gguf: Path, ids: list, max_tokens: int, threads: int) -> dict:
    cmd = [
        str(runner), "generate", "--model", str(gguf),
        "--prompt-tokens", ",".join(map(str, ids)),
        "--max-tokens", str(max_tokens), "--temperature", "0", "--json", "--repeat", "2",
    ]  # fmt: skip
    env = dict(os.environ, GROVE_CPU_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"grove-runner exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "prompt_tps": out["prompt_tps"],
        "decode_tps": out["decode_tps"],
        "tokens": len(out["tokens"]),
    }


def vocab_size(gguf: Path) -> int:
    from gguf import GGUFReader

    r = GGUFReader(str(gguf))
    for name, field in r.fields.items():
        if name == "tokenizer.ggml.tokens":
            return len(field.data)
    raise RuntimeError(f"{gguf}: no tokenizer.ggml.tokens")


def build_llama_1b(out: Path, src_gguf: Path) -> Path:
    """A Llama-3.2-1B-shaped GGUF (random weights, Q4_0 blocks; norms and the tied
    embedding's copy as Q4_0 too) reusing `src_gguf`'s tokenizer (SmolLM2's)."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFWriter, quants

    path = out / "llama-1b-random.Q4_0.gguf"
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    src = GGUFReader(str(src_gguf))
    tokens = [bytes(src.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
              for i in src.fields["tokenizer.ggml.tokens"].data]
    merges = [bytes(src.fields["tokenizer.ggml.merges"].parts[i]).decode("utf-8", "replace")
              for i in src.fields["tokenizer.ggml.merges"].data]
    hidden, inter, layers, heads, kv_heads, vocab = 2048, 8192, 16, 32, 8, len(tokens)
    head_dim = hidden // heads
    w = GGUFWriter(str(path) + ".tmp", "llama")
    w.add_name("llama-1b-random")
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(2)  # MOSTLY_Q4_0
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    types = src.fields["tokenizer.ggml.token_type"]
    w.add_token_types([int(types.parts[i][0]) for i in types.data])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def q4(shape):
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return quants.quantize(a, Q.Q4_0), Q.Q4_0

    data, qt = q4((vocab, hidden))
    w.add_tensor("token_embd.weight", data, raw_dtype=qt)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, shape in [
            ("attn_q", (hidden, hidden)),
            ("attn_k", (kv_heads * head_dim, hidden)),
            ("attn_v", (kv_heads * head_dim, hidden)),
            ("attn_output", (hidden, hidden)),
            ("ffn_gate", (inter, hidden)),
            ("ffn_up", (inter, hidden)),
            ("ffn_down", (hidden, inter)),
        ]:
            data, qt = q4(shape)
            w.add_tensor(p + name + ".weight", data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(path) + ".tmp", path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True, type=Path)
    ap.add_argument("--gguf", action="append", default=[], help="NAME=FILE")
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--llama-1b", type=Path, help="folder for the random 1B Llama")
    args = ap.parse_args()
    models = [tuple(g.split("=", 1)) for g in args.gguf]
    if args.llama_1b:
        log("bench: building the random 1B Llama (Q4_0) once")
        models.append(("Llama-1B random Q4_0", str(build_llama_1b(args.llama_1b, Path(models[0][1])))))
    lens = [int(x) for x in args.prompt_lens.split(",")]
    rows = []
    for name, file in models:
        gguf = Path(file)
        vocab = vocab_size(gguf)
        prompts = {n: prompt_ids(vocab, n, seed=n) for n in lens}
        log(f"bench: llama.cpp on {name}")
        t0 = time.perf_counter()
        theirs = llama_cpp(gguf, prompts, args.max_tokens, args.threads)
        log(f"  {time.perf_counter() - t0:.0f}s")
        for n in lens:
            log(f"bench: Grove on {name}, {n} prompt tokens")
            ours = grove(args.runner, gguf, prompts[n], args.max_tokens, args.threads)
            rows.append((name, n, ours, theirs[n]))
    print(f"\nCPU: Grove vs llama.cpp (xllamacpp), same GGUF, {args.threads} threads, "
          f"{args.max_tokens} new tokens, greedy; tok/s, ratio = Grove / llama.cpp")
    print(f"| model | prompt | Grove prompt | llama.cpp prompt | ratio | Grove decode "
          f"| llama.cpp decode | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, o, t in rows:
        print(f"| {name} | {n} | {o['prompt_tps']:.1f} | {t['prompt_tps']:.1f} | "
              f"{o['prompt_tps'] / t['prompt_tps']:.2f}x | {o['decode_tps']:.1f} ({o['tokens']} tok) | "
              f"{t['decode_tps']:.1f} | {o['decode_tps'] / t['decode_tps']:.2f}x |")


if __name__ == "__main__":
    main()

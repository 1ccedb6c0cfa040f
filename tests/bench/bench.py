#!/usr/bin/env python3
"""Benchmark Grove's runner against mlx-lm: prompt and decode speed, greedy tokens.

    python3 tests/bench/bench.py --runner target/release/grove-runner --fixtures DIR \
        [--models llama-f32,qwen3-q4 | none] [--max-tokens 256] [--prompt-len 512] \
        [--repeats 3] [--stat median|best] [--extra-model DIR ...] \
        [--make-model SPEC ...] [--json-out FILE]

Every model gets the same prompt on both sides: --prompt-len token ids drawn (seeded) from
the tokenizer's non-special vocabulary, given as ids, so no tokenizer is timed. Both sides
decode greedily for up to --max-tokens tokens and stop at EOS; prompts whose greedy
output reaches EOS early are redrawn (a few times), so that runs are full length.

Speeds have one definition on both sides, that of Grove's `--json` output:
    prompt tok/s = prompt tokens / (time from the start of prefill until the first
                   generated token is known)
    decode tok/s = (generated tokens - 1) / (time from the first to the last token)
Model load time is excluded. mlx-lm is measured in this process with
mlx_lm.generate.generate_step (its greedy sampler, default prefill chunk of 2048; no
detokenization); Grove by running `grove-runner generate --json`. Each side is warmed up
once, then run --repeats times; a speed is the median (or, with --stat best, the best) of
its runs, each speed on its own. Ratios are Grove / mlx-lm: above 1, Grove is faster.
The "same" column says whether every Grove run's tokens equal mlx-lm's greedy tokens
("no@i": they first differ at generated token i).

Models: the fixtures named by --models (default: all in DIR/index.json; "none" for
none), every --extra-model directory, and every --make-model SPEC, a random-weight model
made here with mlx-lm into a temporary directory:

    FAMILY:key=value,...[,q4]
    e.g. llama:hidden=4096,layers=32,inter=14336,heads=32,kv=8,vocab=128256,dtype=bfloat16

FAMILY is a fixture family (llama, mistral, qwen2, qwen3): its DIR/<family>-f32 gives the
rest of the config and the tokenizer. Keys: hidden, layers, inter, heads, kv, vocab,
head_dim, dtype (float32, float16, bfloat16); q4 quantizes with mlx-lm (4 bits, group 64).

Only reports: it asserts nothing about speed. Exits 1 when a run fails (the runner's
error, or a model mlx-lm cannot load), after benchmarking the other models.
"""

import argparse
import contextlib
import gc
import importlib
import io
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

import mlx.core as mx
import mlx_lm
import mlx_lm.utils
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step, generation_stream, wired_limit

PROMPT_TRIES = 32  # prompts drawn per model before settling for one that hits EOS early
RUNNER_TIMEOUT_S = 3600


class BenchError(Exception):
    """A failure that ends one model's benchmark (and makes the exit status 1)."""


# ---------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One generation: its tokens and speeds (see the module docstring)."""

    tokens: List[int]
    prompt_tps: float
    decode_tps: float


def speeds(n_prompt: int, start: float, token_times: List[float]) -> tuple:
    """(prompt tok/s, decode tok/s) from the prefill start and each token's time."""
    prompt_tps = n_prompt / (token_times[0] - start) if token_times else math.nan
    n = len(token_times)
    decode_tps = (n - 1) / (token_times[-1] - token_times[0]) if n > 1 else math.nan
    return prompt_tps, decode_tps


def mlx_run(model, prompt: List[int], max_tokens: int, eos_ids: set) -> Run:
    """Greedy generation with mlx-lm's generate_step, stopping at EOS (not counted), as
    stream_generate does."""
    tokens, times = [], []
    with wired_limit(model, [generation_stream]):
        start = time.perf_counter()
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
            if token in eos_ids:
                break
            times.append(time.perf_counter())
            tokens.append(token)
        mx.synchronize(generation_stream)  # generate_step runs one step ahead
    return Run(tokens, *speeds(len(prompt), start, times))


def speed(value) -> float:
    """A speed from the runner's JSON, where null stands for NaN (too few tokens)."""
    return math.nan if value is None else float(value)


def grove_run(runner: Path, model_dir: Path, prompt: List[int], max_tokens: int) -> Run:
    """Greedy generation by `grove-runner generate --json`."""
    cmd = [
        str(runner), "generate", "--model", str(model_dir),
        "--prompt-tokens", ",".join(map(str, prompt)),
        "--max-tokens", str(max_tokens), "--temperature", "0", "--json",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    if proc.returncode != 0:
        stderr = proc.stderr.strip()[-2000:]
        raise BenchError(f"grove-runner exited with {proc.returncode} on {model_dir}:\n{stderr}")
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
        return Run(out["tokens"], speed(out["prompt_tps"]), speed(out["decode_tps"]))
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise BenchError(f"grove-runner gave no JSON result on {model_dir} ({e}):\n{proc.stdout[-2000:]}")


# ---------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------


def regular_ids(tokenizer) -> List[int]:
    """The tokenizer's ids that are not special tokens."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def random_prompt(ids: List[int], length: int, seed: int) -> List[int]:
    """`length` ids drawn from `ids` with a seeded generator."""
    rng = random.Random(seed)
    return [rng.choice(ids) for _ in range(length)]


def pick_prompt(model, tokenizer, args) -> List[int]:
    """The first seeded prompt whose greedy output is not cut short by EOS, else the one
    with the longest output. Its mlx-lm run is the warm-up."""
    ids, eos_ids = regular_ids(tokenizer), set(tokenizer.eos_token_ids)
    best, best_len, best_seed = None, -1, 0
    for seed in range(PROMPT_TRIES):
        prompt = random_prompt(ids, args.prompt_len, seed)
        n = len(mlx_run(model, prompt, args.max_tokens, eos_ids).tokens)
        if n > best_len:
            best, best_len, best_seed = prompt, n, seed
        if n == args.max_tokens:
            break
    if best_len < args.max_tokens:
        log(f"no prompt of {PROMPT_TRIES} runs {args.max_tokens} tokens before EOS; seed {best_seed} runs {best_len}")
    elif best_seed > 0:
        log(f"prompt seed {best_seed} (those before it reach EOS early)")
    return best


# ---------------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------------


@dataclass
class Side:
    """One side's runs and the speeds taken from them."""

    runs: List[Run]
    prompt_tps: float = 0.0
    decode_tps: float = 0.0

    def summarize(self, stat: str) -> "Side":
        """Set the speeds to the median or best of the runs."""
        pick = max if stat == "best" else statistics.median
        self.prompt_tps = pick(r.prompt_tps for r in self.runs)
        self.decode_tps = pick(r.decode_tps for r in self.runs)
        return self

    @property
    def generated(self) -> int:
        """Tokens generated in the first run."""
        return len(self.runs[0].tokens)

    @property
    def decode_ms(self) -> float:
        """Milliseconds per decode step."""
        return 1000.0 / self.decode_tps


@dataclass
class Result:
    """A model's benchmark."""

    model: str
    path: str
    prompt_tokens: int
    max_tokens: int
    mlx_lm: Optional[Side] = None
    grove: Optional[Side] = None
    first_mismatch: Optional[int] = None  # None: all tokens equal
    error: Optional[str] = None
    prompt: List[int] = field(default_factory=list, repr=False)

    @property
    def tokens_match(self) -> Optional[bool]:
        """Whether Grove's tokens equal mlx-lm's (None: no results)."""
        return None if self.error else self.first_mismatch is None


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    """The first index where `a` and `b` differ (also in length), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bench_mlx(model_dir: Path, args) -> tuple:
    """(prompt, mlx-lm side): load with mlx_lm.load, warm up, run --repeats times. The
    model is freed before returning, so that Grove has the memory."""
    model, tokenizer = mlx_lm.load(str(model_dir))
    prompt, eos_ids = pick_prompt(model, tokenizer, args), set(tokenizer.eos_token_ids)
    runs = [mlx_run(model, prompt, args.max_tokens, eos_ids) for _ in range(args.repeats)]
    del model, tokenizer
    gc.collect()
    mx.clear_cache()
    return prompt, Side(runs).summarize(args.stat)


def bench_grove(model_dir: Path, prompt: List[int], args) -> Side:
    """Grove's side: one warm-up run, then --repeats runs."""
    grove_run(args.runner, model_dir, prompt, args.max_tokens)
    runs = [grove_run(args.runner, model_dir, prompt, args.max_tokens) for _ in range(args.repeats)]
    return Side(runs).summarize(args.stat)


def bench_model(name: str, model_dir: Path, args) -> Result:
    """Benchmark one model on both sides; a failure is recorded in `error`."""
    result = Result(name, str(model_dir), args.prompt_len, args.max_tokens)
    tic = time.perf_counter()
    try:
        result.prompt, result.mlx_lm = bench_mlx(model_dir, args)
        result.grove = bench_grove(model_dir, result.prompt, args)
    except BenchError as e:
        result.error = str(e)
    except Exception as e:  # mlx-lm failing to load or run the model
        result.error = f"{type(e).__name__}: {e}"
    if result.error is None:
        reference = result.mlx_lm.runs[0].tokens
        diffs = [first_difference(reference, r.tokens) for r in result.grove.runs]
        result.first_mismatch = min((d for d in diffs if d is not None), default=None)
    status = "failed" if result.error else "done"
    log(f"{name}: {status} ({time.perf_counter() - tic:.1f}s)")
    return result


# ---------------------------------------------------------------------------------
# Making models (--make-model)
# ---------------------------------------------------------------------------------

SPEC_KEYS = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "inter": "intermediate_size",
    "heads": "num_attention_heads",
    "kv": "num_key_value_heads",
    "vocab": "vocab_size",
    "head_dim": "head_dim",
}
ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
DTYPE_TAGS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


@dataclass
class ModelSpec:
    """A parsed --make-model SPEC."""

    family: str
    config: dict  # HF config keys to set
    dtype: str = "float32"
    q4: bool = False


def parse_spec(text: str) -> ModelSpec:
    """Parse FAMILY:key=value,...[,q4] (see the module docstring)."""
    family, _, rest = text.partition(":")
    if family not in ARCH:
        raise argparse.ArgumentTypeError(f"unknown family {family!r} (one of {', '.join(ARCH)})")
    spec = ModelSpec(family, {})
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key == "q4" and not value:
            spec.q4 = True
        elif key == "dtype" and value in DTYPES:
            spec.dtype = value
        elif key in SPEC_KEYS and value.isdigit():
            spec.config[SPEC_KEYS[key]] = int(value)
        else:
            raise argparse.ArgumentTypeError(f"bad --make-model item {item!r} in {text!r}")
    return spec


def spec_config(spec: ModelSpec, base: dict) -> dict:
    """The fixture's config with the spec's shape; vocab at least the tokenizer's, and
    head_dim (where the family names it) following hidden/heads unless given."""
    config = {**base, **spec.config, "torch_dtype": spec.dtype}
    config["vocab_size"] = max(config["vocab_size"], base["vocab_size"])
    if "head_dim" in base and "head_dim" not in spec.config:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    return config


def model_name(spec: ModelSpec, config: dict) -> str:
    """A short name for a made model, e.g. llama-h4096-l32-bf16-q4."""
    parts = [spec.family, f"h{config['hidden_size']}", f"l{config['num_hidden_layers']}", DTYPE_TAGS[spec.dtype]]
    return "-".join(parts + (["q4"] if spec.q4 else []))


def random_weights(model, dtype) -> None:
    """Give `model` random weights in `dtype`: matrices N(0, 1/fan_in) (embeddings
    N(0, 1)), norm weights 1, biases 0. mlx-lm's own initial values are never evaluated,
    so this is fast for big shapes."""

    def draw(path: str, w: mx.array) -> mx.array:
        if w.ndim == 1:
            return (mx.zeros if path.endswith("bias") else mx.ones)(w.shape, dtype=dtype)
        scale = 1.0 if "embed" in path else w.shape[-1] ** -0.5
        return mx.random.normal(w.shape, dtype=dtype, scale=scale)

    mx.random.seed(0)
    model.update(tree_unflatten([(p, draw(p, w)) for p, w in tree_flatten(model.parameters())]))


def make_model(spec: ModelSpec, fixtures: Path, out: Path) -> Path:
    """Write the random-weight model `spec` describes into out/<name> and return it."""
    source = fixtures / f"{spec.family}-f32"
    config = spec_config(spec, json.loads((source / "config.json").read_text()))
    arch = importlib.import_module(f"mlx_lm.models.{ARCH[spec.family]}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    random_weights(model, DTYPES[spec.dtype])
    if spec.q4:
        with contextlib.redirect_stdout(io.StringIO()):
            model, config = mlx_lm.utils.quantize_model(model, config, group_size=64, bits=4)
    model_dir = out / model_name(spec, config)
    mlx_lm.utils.save_model(model_dir, model)
    mlx_lm.utils.save_config(config, model_dir / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, model_dir / name)
    return model_dir


# ---------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------

COLUMNS = [
    # header, width, cell(result)
    ("model", -22, lambda r: r.model),
    ("prompt", 6, lambda r: r.prompt_tokens),
    ("gen", 9, lambda r: generated_cell(r)),
    ("mlx p/s", 9, lambda r: f"{r.mlx_lm.prompt_tps:.0f}"),
    ("grove p/s", 9, lambda r: f"{r.grove.prompt_tps:.0f}"),
    ("ratio", 6, lambda r: f"{r.grove.prompt_tps / r.mlx_lm.prompt_tps:.2f}"),
    ("mlx d/s", 8, lambda r: f"{r.mlx_lm.decode_tps:.1f}"),
    ("grove d/s", 9, lambda r: f"{r.grove.decode_tps:.1f}"),
    ("ratio", 6, lambda r: f"{r.grove.decode_tps / r.mlx_lm.decode_tps:.2f}"),
    ("mlx ms", 7, lambda r: f"{r.mlx_lm.decode_ms:.3f}"),
    ("grove ms", 8, lambda r: f"{r.grove.decode_ms:.3f}"),
    ("same", 5, lambda r: "yes" if r.tokens_match else f"no@{r.first_mismatch}"),
]


def generated_cell(r: Result) -> str:
    """Tokens generated: one number, or mlx-lm/Grove when they differ."""
    a, b = r.mlx_lm.generated, r.grove.generated
    return str(a) if a == b else f"{a}/{b}"


def format_row(cells) -> str:
    """Cells padded to the column widths (negative: left-aligned)."""
    return "  ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w, _) in zip(cells, COLUMNS))


def print_table(results: List[Result], args) -> None:
    """The results table, then notes on short runs and failures."""
    print(format_row([h for h, _, _ in COLUMNS]))
    for r in results:
        if r.error is None:
            print(format_row([str(cell(r)) for _, _, cell in COLUMNS]))
    print(f"(p/s, d/s: prompt and decode tok/s, {args.stat} of {args.repeats}; ms: per decode step; "
          "ratio: grove / mlx-lm)")  # fmt: skip
    for r in results:
        if r.error is None and min(r.mlx_lm.generated, r.grove.generated) < r.max_tokens:
            print(f"note: {r.model}: stopped at EOS before {r.max_tokens} tokens (mlx-lm "
                  f"{r.mlx_lm.generated}, grove {r.grove.generated})")  # fmt: skip
    for r in results:
        if r.error is not None:
            print(f"FAILED {r.model}: {r.error}")


def side_json(side: Optional[Side]) -> Optional[dict]:
    """A side as JSON: its speeds, and each run's speeds and token count."""
    if side is None:
        return None
    runs = [{"prompt_tps": r.prompt_tps, "decode_tps": r.decode_tps, "generated": len(r.tokens)} for r in side.runs]
    return {"prompt_tps": side.prompt_tps, "decode_tps": side.decode_tps, "generated": side.generated,
            "decode_ms": side.decode_ms, "runs": runs}  # fmt: skip


def write_json(path: Path, results: List[Result], args) -> None:
    """Write the settings and results to `path`."""
    settings = {k: getattr(args, k) for k in ("max_tokens", "prompt_len", "repeats", "stat")}
    models = []
    for r in results:
        entry = {k: v for k, v in asdict(r).items() if k not in ("mlx_lm", "grove")}
        entry.update(mlx_lm=side_json(r.mlx_lm), grove=side_json(r.grove), tokens_match=r.tokens_match)
        if r.error is None:
            entry["prompt_ratio"] = r.grove.prompt_tps / r.mlx_lm.prompt_tps
            entry["decode_ratio"] = r.grove.decode_tps / r.mlx_lm.decode_tps
        models.append(entry)
    out = {
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "settings": settings,
        "models": models,
    }
    path.write_text(json.dumps(out, indent=2) + "\n")


def log(message: str) -> None:
    """Progress, on stderr."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", type=Path, required=True, help="grove-runner binary")
    parser.add_argument("--fixtures", type=Path, help="fixtures directory (with index.json)")
    parser.add_argument("--models", help="fixtures to run, comma separated (default: all; 'none': none)")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (default 3)")
    parser.add_argument("--stat", choices=("median", "best"), default="median", help="how runs combine")
    parser.add_argument("--extra-model", type=Path, action="append", default=[], help="another model directory")
    parser.add_argument("--make-model", type=parse_spec, action="append", default=[], metavar="SPEC",
                        help="a random-weight model to make and run, e.g. llama:hidden=512,layers=8,dtype=bfloat16")
    parser.add_argument("--json-out", type=Path, help="also write the results here as JSON")
    args = parser.parse_args()  # fmt: skip
    if args.max_tokens < 2 or args.prompt_len < 1 or args.repeats < 1:
        parser.error("need --max-tokens >= 2, --prompt-len >= 1, --repeats >= 1")
    if not args.runner.is_file():
        parser.error(f"no runner binary at {args.runner}")
    if args.fixtures is None and (args.models != "none" or args.make_model):
        parser.error("--fixtures is needed for fixture models and --make-model")
    return args


def fixture_models(args) -> list:
    """(name, dir) of the fixtures to run."""
    if args.models == "none":
        return []
    if args.models:
        names = args.models.split(",")
    else:
        names = json.loads((args.fixtures / "index.json").read_text())["models"]
    missing = [n for n in names if not (args.fixtures / n / "config.json").is_file()]
    if missing:
        raise SystemExit(f"bench: error: no fixture {', '.join(missing)} in {args.fixtures}")
    return [(n, args.fixtures / n) for n in names]


def main() -> int:
    args = parse_args()
    start = time.perf_counter()
    models = fixture_models(args) + [(d.name, d) for d in args.extra_model]
    with tempfile.TemporaryDirectory(prefix="grove-bench-") as tmp:
        for spec in args.make_model:
            tic = time.perf_counter()
            try:
                model_dir = make_model(spec, args.fixtures, Path(tmp))
            except Exception as e:
                log(f"error: making a {spec.family} model: {type(e).__name__}: {e}")
                return 1
            models.append((model_dir.name, model_dir))
            log(f"made {model_dir.name} ({time.perf_counter() - tic:.1f}s)")
        results = [bench_model(name, model_dir, args) for name, model_dir in models]
    print_table(results, args)
    if args.json_out:
        write_json(args.json_out, results, args)
    log(f"{len(results)} models in {time.perf_counter() - start:.1f}s")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

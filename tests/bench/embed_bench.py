#!/usr/bin/env python3
"""Embedding throughput: Grove (`grove-embed-bench` on a real daemon) and
mlx-embeddings 0.1.0 in this process, side by side on the same random-weight
models and texts, at batch 1 (one text after another), 8 and 32.

    python3 tests/bench/embed_bench.py --bin target/release/grove-embed-bench \
        --fixtures DIR [--rounds 5]

Models, made here into a temporary directory (random weights, the fixture's
WordPiece tokenizer): a BERT of all-MiniLM-L6-v2's shape (384 wide, 6 layers,
12 heads, 1536 MLP, 30522 vocab; larger shapes take mlx-embeddings, on the
wheel's reference BLAS, many minutes here). Texts:
32 sentences of 20-40 words, the same generator as grove-embed-bench.
mlx-embeddings runs a padded batch with an attention mask and mean pooling,
evaluated (`mx.eval`) per batch; Grove's figures include its gRPC call,
tokenization and batching. Ratios are Grove / mlx-embeddings. Only reports.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from make_embed_fixtures import me_bert, randomize  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

WORDS = ["the", "river", "carries", "light", "over", "stones", "while", "a", "keeper", "counts",
         "ships", "at", "night", "near", "old", "harbors"]

SHAPES = {
    "minilm-l6": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
}


def texts(n):
    out = []
    for i in range(n):
        length = 20 + (i * 7) % 21
        out.append(" ".join(WORDS[(i * 5 + j * 3 + j * j) % len(WORDS)] for j in range(length)))
    return out


def make(root: Path, fixtures: Path, name: str, shape: dict) -> Path:
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522,
        "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        "hidden_act": "gelu", **shape,
    }
    model = me_bert.Model(me_bert.ModelArgs.from_dict(config))
    weights = randomize(model, 5)
    out = root / name
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), {k: v for k, v in weights.items()
                                                          if not k.startswith("pooler.")})
    (out / "config.json").write_text(json.dumps(config))
    for f in ["tokenizer.json", "tokenizer_config.json", "modules.json"]:
        shutil.copy(fixtures / "embed" / "bert-f32" / f, out / f)
    shutil.copytree(fixtures / "embed" / "bert-f32" / "1_Pooling", out / "1_Pooling")
    return out


def mlx_embeddings(model_dir: Path, rounds: int) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    model = me_bert.Model(me_bert.ModelArgs.from_dict(config))
    model.load_weights(str(model_dir / "model.safetensors"), strict=False)
    model.eval()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    all_ids = [tok.encode(t).ids for t in texts(32)]

    def run(batch):
        width = max(len(i) for i in batch)
        ids = mx.array([i + [0] * (width - len(i)) for i in batch])
        mask = mx.array([[1] * len(i) + [0] * (width - len(i)) for i in batch])
        mx.eval(model(ids, attention_mask=mask).text_embeds)

    run(all_ids[:8])  # warm-up
    out = {}
    for b in (1, 8, 32):
        alone, together = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            for i in all_ids[:b]:
                run([i])
            alone.append(time.perf_counter() - t)
            t = time.perf_counter()
            run(all_ids[:b])
            together.append(time.perf_counter() - t)
        out[b] = (b / sorted(alone)[rounds // 2], b / sorted(together)[rounds // 2])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grove-embed-bench-"))
    try:
        print("| model | batch | mlx-embeddings texts/s (one by one / batched) | Grove texts/s "
              "(one by one / one call / concurrent calls) | Grove / mlx-embeddings (batched) |")
        print("|---|---|---|---|---|")
        for name, shape in SHAPES.items():
            d = make(root, Path(args.fixtures), name, shape)
            ref = mlx_embeddings(d, args.rounds)
            out = subprocess.run([args.bin, str(d), str(args.rounds)], capture_output=True,
                                 text=True, timeout=1800)
            if out.returncode != 0:
                sys.exit(f"grove-embed-bench failed: {out.stderr}")
            rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            for r in rows:
                if r["row"] == "throughput":
                    b = r["batch"]
                    one, many = ref[b]
                    print(f"| {name} | {b} | {one:.1f} / {many:.1f} | {r['texts_per_s_batch_1']:.1f} / "
                          f"{r['texts_per_s_one_call']:.1f} / {r['texts_per_s_concurrent_calls']:.1f} | "
                          f"{r['texts_per_s_one_call'] / many:.2f}x |")
            for r in rows:
                if r["row"] == "http":
                    print(f"| {name} | http {r['path']} (8 texts) | | gRPC {r['grpc_ms']:.2f} ms, HTTP "
                          f"{r['http_ms']:.2f} ms: {100 * r['overhead']:+.2f}% | |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""References for the real-model tests, from the reference implementations.

    reference.py generate --model DIR --cases FILE [--promote]
        mlx-lm's greedy generation on each case: prints a JSON list of
        {name, prompt_tokens, tokens, text, finish_reason}. A case is
        {"name", "max_tokens"} plus "prompt_tokens" (ids), "messages" (rendered
        with the model's chat template, tokenized without special tokens, as
        mlx-lm's server does) or "prompt" (tokenized as mlx_lm.generate does:
        BOS unless already there).
        --promote casts every float16/bfloat16 array to float32 first: the same
        model converted to the dtypes Grove computes in on the CPU backend.

    reference.py tokenizer --gguf FILE --texts FILE
        transformers' tokenizer built from the GGUF file's metadata
        (integrations/gguf): prints {"ids": [[...], ...]} for the texts.

    reference.py mlx-gguf --gguf FILE --model DIR --tensors FILE
        MLX's own GGUF reader (mx.load) against DIR's safetensors: for each
        {"gguf": NAME, "module": HF_MODULE}, whether weight, scales and biases are
        bit for bit the same. Prints {"HF_MODULE": true|false, ...}.
"""

import argparse
import json
import sys
from pathlib import Path


def generate(args) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(args.model))
    if args.promote:
        half = (mx.float16, mx.bfloat16)
        model.update(tree_map(lambda a: a.astype(mx.float32) if a.dtype in half else a, model.parameters()))
        mx.eval(model.parameters())
    out = []
    for case in json.loads(Path(args.cases).read_text()):
        if "prompt_tokens" in case:
            ids = case["prompt_tokens"]
        elif "messages" in case:
            text = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            prompt = case["prompt"]
            bos = tokenizer.bos_token
            ids = tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
        tokens, text, finish = [], "", None
        for r in stream_generate(model, tokenizer, ids, max_tokens=case["max_tokens"]):
            text += r.text
            finish = r.finish_reason
            if finish == "stop":
                break
            tokens.append(r.token)
        out.append(
            {"name": case["name"], "prompt_tokens": ids, "tokens": tokens, "text": text, "finish_reason": finish}
        )
    json.dump(out, sys.stdout)


def tokenizer(args) -> None:
    import gguf
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    reader = gguf.GGUFReader(str(args.gguf))
    meta = {k: f.contents() for k, f in reader.fields.items()}
    names = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tok_dict = {name: meta[f"tokenizer.{key}"] for key, name in names.items() if f"tokenizer.{key}" in meta}
    backend, _ = convert_gguf_tokenizer(meta["general.architecture"], tok_dict)
    texts = json.loads(Path(args.texts).read_text())
    json.dump({"ids": [backend.encode(t, add_special_tokens=False).ids for t in texts]}, sys.stdout)


def mlx_gguf(args) -> None:
    import mlx.core as mx

    theirs = mx.load(str(args.gguf))
    ours = {}
    for f in sorted(Path(args.model).glob("*.safetensors")):
        ours.update(mx.load(str(f)))
    result = {}
    for t in json.loads(Path(args.tensors).read_text()):
        g, m = t["gguf"].removesuffix(".weight"), t["module"]
        same = True
        for part in ("weight", "scales", "biases"):
            a, b = theirs.get(f"{g}.{part}"), ours.get(f"{m}.{part}")
            same = same and a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape
            same = same and bool(mx.array_equal(a, b).item())
        result[m] = same
    json.dump(result, sys.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", type=Path, required=True)
    g.add_argument("--cases", type=Path, required=True)
    g.add_argument("--promote", action="store_true")
    t = sub.add_parser("tokenizer")
    t.add_argument("--gguf", type=Path, required=True)
    t.add_argument("--texts", type=Path, required=True)
    m = sub.add_parser("mlx-gguf")
    m.add_argument("--gguf", type=Path, required=True)
    m.add_argument("--model", type=Path, required=True)
    m.add_argument("--tensors", type=Path, required=True)
    args = parser.parse_args()
    {"generate": generate, "tokenizer": tokenizer, "mlx-gguf": mlx_gguf}[args.command](args)


if __name__ == "__main__":
    main()

"""Embeddings through the official clients against `grove serve`.

Usage: embed_client.py BASE_URL KEY MODEL_DIR...

For each model directory (with mlx-embeddings' `embed_ref.json` beside it):
OpenAI's Python SDK (`embeddings.create`: its default base64 encoding,
`encoding_format="float"`, `dimensions`, token ids, a list of token lists)
and ollama's (`embed` with `dimensions` and `truncate`, the older
`embeddings`), eight calls at once (they share the runner's passes), each
vector compared with the reference within 1e-4 (cosine >= 0.9999). Prints one
JSON line per model: what was checked and the largest difference.
"""

import json
import math
import sys
import threading
from pathlib import Path

import ollama
import openai

base, key, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
oa = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
ol = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)

TOL = 1e-4


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / max(na * nb, 1e-30)


def check(what, got, want, worst):
    if len(got) != len(want):
        raise SystemExit(f"{what}: {len(got)} values, the reference {len(want)}")
    diff = max(abs(g - w) for g, w in zip(got, want))
    cos = cosine(got, want)
    if diff > TOL or cos < 0.9999:
        raise SystemExit(f"{what}: largest difference {diff}, cosine {cos}")
    worst[0] = max(worst[0], diff)


for d in dirs:
    model = str(Path(d).resolve())
    ref = json.loads((Path(d) / "embed_ref.json").read_text())
    cases = ref["cases"]
    texts = [c["text"] for c in cases]
    worst = [0.0]
    # OpenAI: the SDK's default (base64 of float32), then floats.
    r = oa.embeddings.create(model=model, input=texts)
    assert [e.index for e in r.data] == list(range(len(texts))), r.data
    for c, e in zip(cases, r.data):
        check(f"{d} openai base64 {c['text'][:20]!r}", e.embedding, c["embedding"], worst)
    assert r.usage.prompt_tokens == sum(len(c["ids"]) for c in cases), r.usage
    r = oa.embeddings.create(model=model, input=texts[0], encoding_format="float")
    check(f"{d} openai float", r.data[0].embedding, cases[0]["embedding"], worst)
    # Matryoshka: the first DIMS values, renormalized if the model normalizes.
    r = oa.embeddings.create(model=model, input=texts[1:3], dimensions=ref["cases"][0]["dims"])
    for c, e in zip(cases[1:3], r.data):
        check(f"{d} openai dimensions", e.embedding, c["embedding_dims"], worst)
    # Token ids, one list and several.
    r = oa.embeddings.create(model=model, input=cases[1]["ids"], encoding_format="float")
    check(f"{d} openai ids", r.data[0].embedding, cases[1]["embedding"], worst)
    r = oa.embeddings.create(model=model, input=[c["ids"] for c in cases[:2]])
    for c, e in zip(cases[:2], r.data):
        check(f"{d} openai id lists", e.embedding, c["embedding"], worst)
    # ollama: /api/embed (batched, dimensions, truncate) and /api/embeddings.
    r = ol.embed(model=model, input=texts, truncate=True, keep_alive="5m")
    for c, e in zip(cases, r.embeddings):
        check(f"{d} ollama embed", e, c["embedding"], worst)
    assert r.prompt_eval_count == sum(len(c["ids"]) for c in cases), r
    r = ol.embed(model=model, input=texts[3], dimensions=cases[3]["dims"])
    check(f"{d} ollama dimensions", r.embeddings[0], cases[3]["embedding_dims"], worst)
    r = ol.embeddings(model=model, prompt=texts[4])
    check(f"{d} ollama embeddings", r.embedding, cases[4]["embedding"], worst)
    # Eight calls at once, each its own text: the runner batches them.
    errors = []

    def one(i):
        c = cases[i % len(cases)]
        try:
            r = oa.embeddings.create(model=model, input=c["text"], encoding_format="float")
            check(f"{d} concurrent {i}", r.data[0].embedding, c["embedding"], worst)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"{i}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors or any(t.is_alive() for t in threads):
        raise SystemExit(f"{d} concurrent calls: {errors or 'a call did not return'}")
    print(json.dumps({"model": Path(d).name, "pooling": ref["pooling"], "max_diff": worst[0]}))

#!/usr/bin/env bash
# Grove's CUDA decode step against MLX's step (GROVE_FAST_DECODE=0) on small
# random-weight models of every shape and weight format the step covers
# (make_big_model.py: Llama, Mistral, Qwen3, Qwen3-MoE; bf16, 4- and 8-bit affine): the
# first decode step's logits (largest difference, against their spread) and
# how many greedy tokens agree. Random weights give flat logits, so a
# rounding difference can change a token where two are within it; the logits
# say how close the two steps are. Run by the device tool as gpu_decode.sh
# (tests/bench/README.md); CHECK_MODELS and MAX_TOKENS change the run.
set -euo pipefail
. tests/bench/gpu_env.sh
MODELS=${CHECK_MODELS:-llama-small llama-small:q4 llama-small:q8 mistral-small mistral-small:q4 qwen3-small qwen3-small:q4 qwen3-small:q8 qwen3-moe-small:q4 qwen3-moe-small:q8}
N=${MAX_TOKENS:-64}
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(5, 1000)) for _ in range(100)))")
for m in $MODELS; do
  dir=$(model_dir "$m" 2>/dev/null)
  for fast in 1 0; do
    GROVE_FAST_DECODE=$fast "$G/bin/grove-runner" generate --model "$dir" --prompt-tokens "$ids" \
      --max-tokens "$N" --json --dump-step-logits "$OUT/$m.$fast.logits" > "$OUT/$m.$fast.json" 2> "$OUT/$m.$fast.err"
  done
  python3 - "$OUT/$m" "$m" <<'PY'
import json, sys
base, name = sys.argv[1:3]
a, b = (json.load(open(f"{base}.{f}.logits")) for f in (1, 0))
ta, tb = (json.loads([l for l in open(f"{base}.{f}.json") if l.startswith("{")][-1])["tokens"] for f in (1, 0))
used = "Grove's CUDA step" in open(f"{base}.1.err").read()
diff = max(abs(x - y) for x, y in zip(a, b))
mean = sum(b) / len(b)
spread = (sum((y - mean) ** 2 for y in b) / len(b)) ** 0.5
am = max(range(len(a)), key=a.__getitem__)
bm = max(range(len(b)), key=b.__getitem__)
same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
print(f"{name}: step used {used}; step logits max |diff| {diff:.4g} (spread {spread:.3g}, {diff / spread:.2%}); "
      f"argmax equal {am == bm}; greedy tokens agree {same} of {len(ta)}")
PY
done

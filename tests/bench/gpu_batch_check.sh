#!/usr/bin/env bash
# Batched decode through Grove's CUDA step against MLX's step
# (GROVE_FAST_DECODE=0): grove-batch-bench's greedy texts per stream, at each
# stream count, on small random-weight models (make_big_model.py). Prints per
# model and count how many streams' texts are equal and, where one is not,
# after how many characters they part (random weights give flat logits, so a
# rounding difference can change a token). Run by the device tool as
# gpu_decode.sh (tests/bench/README.md); CHECK_MODELS, STREAMS and
# MAX_TOKENS change the run.
set -euo pipefail
. tests/bench/gpu_env.sh
MODELS=${CHECK_MODELS:-llama-small qwen3-small}
N=${MAX_TOKENS:-32}
COUNTS=${STREAMS:-1,3,8,32}
most=$(echo "$COUNTS" | tr , '\n' | sort -n | tail -1)
python3 -c "
import json, random
random.seed(1)
print(json.dumps([[random.randrange(5, 1000) for _ in range(random.randrange(20, 90))] for _ in range($most)]))
" > "$OUT/prompts.json"
for m in $MODELS; do
  dir=$(model_dir "$m" 2>/dev/null)
  for fast in 1 0; do
    GROVE_FAST_DECODE=$fast timeout "${BATCH_TIMEOUT:-600}" "$G/bin/grove-batch-bench" "$dir" "$OUT/prompts.json" "$N" "$COUNTS" \
      --num-parallel="$most" > "$OUT/$m.batch.$fast.json" 2> "$OUT/$m.batch.$fast.err" ||
      { tail -20 "$OUT/$m.batch.$fast.err"; exit 1; }
  done
  python3 - "$OUT/$m.batch" "$m" <<'PY'
import json, sys
base, name = sys.argv[1:3]
fast, mlx = ([json.loads(l) for l in open(f"{base}.{f}.json") if l.startswith("{")] for f in (1, 0))
for a, b in zip(fast, mlx):
    parts = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), min(len(s), len(t)))
             for s, t in zip(a["texts"], b["texts"]) if s != t]
    same = sum(s == t for s, t in zip(a["texts"], b["texts"]))
    print(f"{name}: {a['streams']} streams: texts equal {same} of {len(a['texts'])}"
          + (f"; the others part after {sorted(parts)} characters" if parts else ""))
PY
done

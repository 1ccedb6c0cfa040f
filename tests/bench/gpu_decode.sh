#!/usr/bin/env bash
# Single-stream speed on an NVIDIA GPU, Grove against mlx-lm's benchmark in
# the same run: random-weight models of real shapes made here (Llama-8B bf16
# and 4-bit g64, Qwen3-4B bf16, Llama-1B bf16; weights are never carried),
# a 512-token prompt and 256 new tokens, warm (Grove's first run in a process
# is left out; mlx-lm warms up itself), then one table (gpu_table.py) with
# ratios and the share of the memory-bandwidth roofline.
# The device tool's last call runs it, as gpu_moe.sh (see
# tests/bench/README.md): /tmp/g holds bin/ (grove-runner built with
# GROVE_BACKEND=cuda), whl/ (mlx, mlx-lm) and rt.part1/2; the call carries
# .device/rt/p3 and .device/tok. MODELS, PROMPT_LEN, MAX_TOKENS, REPEAT,
# TRIALS and BANDWIDTH_GBS (default: from the GPU's name) change the run;
# VARIANTS="LABEL:VAR=VALUE,VAR=VALUE ..." adds a row per model and label,
# Grove run again with those variables (e.g. before:GROVE_CUDA_QMV=0,GROVE_FUSE=0
# for Grove without its quantized matvec and joined gate/up), and ROUNDS
# alternates Grove's runs that many times.
set -euo pipefail
. tests/bench/gpu_env.sh
MODELS=${MODELS:-llama-1b llama-8b llama-8b:q4 qwen3-4b}
P=${PROMPT_LEN:-512}
N=${MAX_TOKENS:-256}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H200*) bw=4800 ;;
  *H100*) bw=3350 ;;
  *) bw=${BANDWIDTH_GBS:?set BANDWIDTH_GBS for $gpu} ;;
esac
bw=${BANDWIDTH_GBS:-$bw}
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(5, 1000)) for _ in range($P)))")
specs=()
for m in $MODELS; do
  name=${m/:/-}
  dir=$(model_dir "$m")
  echo "== $name: mlx-lm"
  python3 tests/bench/mlx_lm_bench.py --model "$dir" -p "$P" -g "$N" -n "${TRIALS:-3}" > "$OUT/$name.mlx.txt" 2>&1
  specs+=("$name=$dir")
  for variant in ${VARIANTS:-}; do
    specs+=("$name/${variant%%:*}=$dir:$OUT/$name.grove-${variant%%:*}.json:$OUT/$name.mlx.txt")
  done
  # Grove, then each variant (LABEL:VAR=VALUE,VAR=VALUE: Grove run again with
  # those variables), in turn, ROUNDS times, so that a drift of the machine
  # touches them alike. A file keeps its first process's cold run first (the
  # table leaves it out) and only the warm runs of later rounds.
  for round in $(seq "${ROUNDS:-1}"); do
    for variant in default ${VARIANTS:-}; do
      label=${variant%%:*}
      vars=${variant#*:}; [ "$variant" = default ] && vars=
      file="$OUT/$name.grove-$label"; [ "$variant" = default ] && file="$OUT/$name.grove"
      keep=(cat); [ "$round" = 1 ] || keep=(tail -n +2)
      echo "== $name: grove ${vars//,/ } (round $round)"
      env GROVE_STEP_PROFILE=1 ${vars//,/ } "$G/bin/grove-runner" generate --model "$dir" --prompt-tokens "$ids" \
          --max-tokens "$N" --repeat "${REPEAT:-4}" --json 2>> "$file.err" | "${keep[@]}" >> "$file.json"
    done
  done
  for variant in ${VARIANTS:-}; do
    # How many greedy tokens each variant agrees on with Grove's default run.
    python3 - "$OUT/$name.grove.json" "$OUT/$name.grove-${variant%%:*}.json" "${variant%%:*}" <<'PY'
import json, sys
a, b = ([json.loads(l)["tokens"] for l in open(p) if l.startswith("{")][-1] for p in sys.argv[1:3])
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{sys.argv[3]}: greedy tokens agree with the default run: {same} of {len(a)}")
PY
  done
done
python3 tests/bench/gpu_table.py --bandwidth-gbs "$bw" --out "$OUT" "${specs[@]}" | tee "$OUT/table.txt"
# Host time per decode step (the last run of each): build, dispatch, and the
# wait for the device (near zero: the host bounds the step).
for f in "$OUT"/*.err; do
  echo "$(basename "$f" .err): $(grep 'step profile' "$f" | tail -1 | sed 's/.*per step: //')"
done | tee -a "$OUT/table.txt"

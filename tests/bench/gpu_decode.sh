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
# TRIALS and BANDWIDTH_GBS (default: from the GPU's name) change the run.
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
  shape=${m%%:*}
  name=${m/:/-}
  dir="$G/$name"
  q=(); [ "$m" = "$shape" ] || q=(--q4)
  [ -d "$dir" ] || python3 tests/bench/make_big_model.py "$dir" "$shape" --tokenizer-from .device/tok "${q[@]}"
  echo "== $name: grove"
  "$G/bin/grove-runner" generate --model "$dir" --prompt-tokens "$ids" --max-tokens "$N" \
      --repeat "${REPEAT:-4}" --json > "$OUT/$name.grove.json"
  echo "== $name: mlx-lm"
  python3 tests/bench/mlx_lm_bench.py --model "$dir" -p "$P" -g "$N" -n "${TRIALS:-3}" > "$OUT/$name.mlx.txt" 2>&1
  specs+=("$name=$dir")
done
python3 tests/bench/gpu_table.py --bandwidth-gbs "$bw" --out "$OUT" "${specs[@]}" | tee "$OUT/table.txt"

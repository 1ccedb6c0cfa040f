#!/usr/bin/env bash
# Tensor parallelism on one host with several NVIDIA GPUs (NCCL): per model,
# Grove on 1 and SHARDS ranks (`grove-runner generate --shards N`) against
# mlx-lm's benchmark on 1 and SHARDS ranks (its sharded_load over the same
# NCCL group, started by hand as mlx.launch would), in the same run; then one
# table (gpu_table.py: tok/s and Grove / mlx-lm per row) and each rank's load
# time and memory. Random-weight models of real shapes are made here
# (Llama-8B and a 32B shape, bf16; weights are never carried). Run it as the
# device tool's last call, as gpu_decode.sh (tests/bench/README.md), on a
# kind with 2 or more GPUs. MODELS, SHARDS, PROMPT_LEN, MAX_TOKENS, REPEAT
# and TRIALS change the run. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -euo pipefail
. tests/bench/gpu_env.sh
MODELS=${MODELS:-llama-8b llama-32b}
S=${SHARDS:-2}
P=${PROMPT_LEN:-512}
N=${MAX_TOKENS:-256}
export NCCL_NVLS_ENABLE=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H200*) bw=4800 ;;
  *H100*) bw=3350 ;;
  *) bw=${BANDWIDTH_GBS:?set BANDWIDTH_GBS for $gpu} ;;
esac
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(5, 1000)) for _ in range($P)))")
specs=()
for m in $MODELS; do
  dir="$G/$m"
  [ -d "$dir" ] || python3 tests/bench/make_big_model.py "$dir" "$m" --tokenizer-from .device/tok
  for n in 1 "$S"; do
    tag="$m.x$n"
    echo "== $tag: mlx-lm"
    if [ "$n" = 1 ]; then
      python3 tests/bench/mlx_lm_bench.py --model "$dir" -p "$P" -g "$N" -n "${TRIALS:-3}" > "$OUT/$tag.mlx.txt" 2>&1 || true
    else
      port=$((20000 + RANDOM % 20000))
      pids=()
      for r in $(seq 0 $((n - 1))); do
        env MLX_RANK=$r MLX_WORLD_SIZE=$n NCCL_HOST_IP=127.0.0.1 NCCL_PORT=$port \
            CUDA_VISIBLE_DEVICES=$r MLX_BENCH_BACKEND=nccl \
            python3 tests/bench/mlx_lm_bench.py --model "$dir" -p "$P" -g "$N" -n "${TRIALS:-3}" \
            > "$OUT/$tag.mlx.rank$r.txt" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || true; done
      cp "$OUT/$tag.mlx.rank0.txt" "$OUT/$tag.mlx.txt"
    fi
    tail -2 "$OUT/$tag.mlx.txt"
    echo "== $tag: grove"
    t0=$(date +%s.%N)
    "$G/bin/grove-runner" generate --model "$dir" --prompt-tokens "$ids" --max-tokens "$N" \
      --repeat "${REPEAT:-4}" --json --shards "$n" > "$OUT/$tag.grove.json" 2> "$OUT/$tag.grove.err" || true
    echo "grove wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    grep -E "rank [0-9]+ of|error" "$OUT/$tag.grove.err" || true
    specs+=("$tag=$dir:$OUT/$tag.grove.json:$OUT/$tag.mlx.txt")
  done
done
python3 tests/bench/gpu_table.py --bandwidth-gbs "$bw" --out "$OUT" "${specs[@]}" | tee "$OUT/table.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader

#!/usr/bin/env bash
# Mixture-of-experts decode on an NVIDIA GPU: Grove against mlx-lm's benchmark
# on a Qwen3-30B-A3B-shaped random 4-bit model (128 experts, 8 per token),
# 512-token prompt, 256 new tokens, warm, in the same run. Run by the device
# tool's last call (see tests/bench/README.md): expects in /tmp/g the stripped
# grove-runner (bin/), the mlx and mlx-lm wheels for the host's Python (whl/)
# and rt.part1/rt.part2 from ../shared/tools/pack-mlx-cuda; the call carries
# .device/rt/p3 (rt.part3, unpack-mlx-cuda) and .device/tok (a tokenizer).
set -euo pipefail
. tests/bench/gpu_env.sh
M="$G/qwen3-30b-a3b-q4"
[ -d "$M" ] || { time python3 tests/bench/make_big_model.py "$M" qwen3-30b-a3b --q4 --tokenizer-from .device/tok; }
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(5, 1000)) for _ in range(512)))")
echo "== grove"
"$G/bin/grove-runner" generate --model "$M" --prompt-tokens "$ids" --max-tokens 256 --repeat "${REPEAT:-4}" --json \
    | tee "$OUT/grove.json" | tail -c 2000
echo "== mlx-lm"
python3 tests/bench/mlx_lm_bench.py --model "$M" -p 512 -g 256 -n "${TRIALS:-3}" 2>&1 | tee "$OUT/mlx_lm.txt" | tail -n 12

#!/usr/bin/env bash
# Batched decode on an NVIDIA GPU: Grove against mlx-lm's BatchGenerator on a
# Llama-8B-shaped bf16 random model, 1/8/32 streams (the device tool's last
# call; see tests/bench/README.md). Expects in /tmp/g: bin/ (stripped
# grove-runner and grove-batch-bench built here), whl/ (the mlx and mlx-lm
# wheels for Python 3.12) and rt.part1/rt.part2 (pack-mlx-cuda); the call
# carries .device/rt/p3 (rt.part3, unpack-mlx-cuda) and .device/tok (a
# fixture tokenizer).
set -euo pipefail
. tests/bench/gpu_env.sh
SHAPE=${SHAPE:-llama-8b}
M="$G/$SHAPE${Q4:+-q4}"
[ -d "$M" ] || python3 tests/bench/make_big_model.py "$M" "$SHAPE" --tokenizer-from .device/tok ${Q4:+--q4}
python3 tests/bench/batched.py --bench "$G/bin/grove-batch-bench" --model "$M" \
    --streams "${STREAMS:-1,8,32}" --prompt-len "${PROMPT_LEN:-128}" --max-tokens "${MAX_TOKENS:-128}" \
    --no-pick --json-out "$OUT/batched.json" ${VARIANTS:+$(for v in $VARIANTS; do printf -- '--variant %s ' "$v"; done)}

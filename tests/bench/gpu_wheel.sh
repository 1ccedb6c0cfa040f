#!/usr/bin/env bash
# The grove-llm-cuda wheel on the GPU machine (issue 30), run by the device
# tool's last call (tests/bench/README.md): pip installs it with --no-index
# from carried files (the wheel, mlx-cuda-13 joined from its parts,
# scipy-openblas32) into the machine's Python, whose PyTorch brought the
# nvidia-* CUDA 13 wheels mlx-cuda-13 asks for (GBs: never carried). Then,
# from that environment with no LD_LIBRARY_PATH: `grove serve` answers an
# OpenAI chat on a random-weight Llama made here, `grove ps` names the device,
# and the installed runner's decode speed is set beside the source build's
# runner (same libmlx, LD_LIBRARY_PATH) and MLX's own step (GROVE_FAST_DECODE=0),
# alternated in ROUNDS.
#   W: the carried files (mlx_cuda_13.part*, mlx_cuda_13.name, the two
#   wheels, src/{grove-runner,libgrove_cuda.so}); SHAPE (llama-1b), ROUNDS (2).
set -euo pipefail
W=${W:-/tmp/w}
OUT=${OUT:-$W/out}
SHAPE=${SHAPE:-llama-1b}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cat "$W"/mlx_cuda_13.part* > "$W/$(cat "$W/mlx_cuda_13.name")"

# 1. pip, from files only.
t0=$(date +%s.%N)
python3 -m pip install --no-index --find-links "$W" --disable-pip-version-check grove-llm-cuda 2>&1 | tail -3
t1=$(date +%s.%N)
echo "install: $(python3 -c "print(round($t1 - $t0, 1))") s"
bin=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
python3 -m pip show grove-llm-cuda mlx-cuda-13 2>/dev/null | grep -E '^(Name|Version|Requires)'
ls "$site/grove_llm_cuda" "$site/mlx/lib"
unset LD_LIBRARY_PATH PYTHONPATH
ldd "$bin/grove-runner" | grep -E 'mlx|openblas'

# 2. A random-weight model, and the daemon from the environment.
M=$W/$SHAPE
[ -d "$M" ] || python3 tests/bench/make_big_model.py "$M" "$SHAPE" --tokenizer-from .device/tok > /dev/null
export GROVE_HOME=$W/home GROVE_HOST=127.0.0.1:11500
"$bin/grove" serve > "$OUT/serve.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://$GROVE_HOST/" > /dev/null && break; sleep 0.2; done
curl -s "http://$GROVE_HOST/v1/chat/completions" -H 'content-type: application/json' -d "{
  \"model\": \"$M\", \"max_tokens\": 16, \"temperature\": 0,
  \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}" \
  > "$OUT/chat.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("chat:", r["choices"][0]["finish_reason"], r["usage"]) if "choices" in r else print("chat failed:", r)' "$OUT/chat.json"
"$bin/grove" ps
kill $daemon; wait $daemon 2>/dev/null || true
grep -i "cuda\|decode step" "$OUT/serve.log" | head -5 || true

# 3. Decode speed: the installed runner, the source build's, MLX's step.
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randrange(5, 1000)) for _ in range(512)))")
src_env="LD_LIBRARY_PATH=$site/mlx/lib:$site/scipy_openblas32/lib"
for round in $(seq "${ROUNDS:-2}"); do
  for v in wheel source mlx-step; do
    case $v in
      wheel) cmd=(env "$bin/grove-runner") ;;
      source) cmd=(env "$src_env" "$W/src/grove-runner") ;;
      mlx-step) cmd=(env GROVE_FAST_DECODE=0 "$bin/grove-runner") ;;
    esac
    GROVE_STEP_PROFILE=1 "${cmd[@]}" generate --model "$M" --prompt-tokens "$ids" --max-tokens 256 \
      --repeat 3 --json 2>> "$OUT/$v.err" | tail -n +2 >> "$OUT/$v.json"
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
for v in ("wheel", "source", "mlx-step"):
    rows = [json.loads(l) for l in open(f"{out}/{v}.json") if l.startswith("{")]
    tps = [r["decode_tps"] for r in rows]
    print(f"{v}: decode tok/s {[round(t, 1) for t in tps]} median {statistics.median(tps):.1f}")
PY

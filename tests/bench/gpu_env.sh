# Sourced by the GPU benchmark scripts on the device machine: unpacks the MLX
# CUDA runtime carried in parts into /tmp/g, installs the carried mlx and
# mlx-lm wheels beside it, and sets G, OUT, LD_LIBRARY_PATH and PYTHONPATH.
# Expects /tmp/g/{bin,whl,rt.part1,rt.part2} from earlier calls and the call's
# own .device/rt/p3 (see tests/bench/README.md).
G=/tmp/g
OUT=${OUT:-$G/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cp .device/rt/p3/* "$G/"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$G/site" "$G"/whl/*.whl
sh "$G/unpack-mlx-cuda" "$G" "$G/site" > "$G/env.sh"
. "$G/env.sh"
# bin/ also holds the runner's OpenBLAS and Grove's CUDA decode step library.
export LD_LIBRARY_PATH=$G/bin:$LD_LIBRARY_PATH
export PYTHONPATH=$G/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"

# MLX's kernels compiled at run time (NVRTC) live in $G/mlx-ptx. A fresh
# machine compiles the quantized prefill tiles at the first 4-bit and 8-bit
# warm-up: 2-3 minutes of device time each. A call that carries
# .device/ptx/mlx-ptx.tgz (save_ptx's output of an earlier machine, copied
# there by hand) starts from it.
export MLX_PTX_CACHE_DIR=$G/mlx-ptx
if [ -f .device/ptx/mlx-ptx.tgz ] && [ ! -d "$MLX_PTX_CACHE_DIR" ]; then
  tar xzf .device/ptx/mlx-ptx.tgz -C "$G" && echo "mlx-ptx: $(ls "$MLX_PTX_CACHE_DIR" | wc -l) kernels carried"
fi
save_ptx() { tar czf "$OUT/mlx-ptx.tgz" -C "$G" mlx-ptx && ls -l "$OUT/mlx-ptx.tgz"; }

# The directory of the random-weight model SPEC (SHAPE, or SHAPE:q4 /
# SHAPE:q8 for MLX's affine quantization) under $G, made with
# make_big_model.py (its output on stderr) the first time it is asked for.
model_dir() {
  local shape=${1%%:*} q=() dir="$G/${1/:/-}"
  [ "$1" = "$shape" ] || q=("--${1#*:}")
  [ -d "$dir" ] || python3 tests/bench/make_big_model.py "$dir" "$shape" --tokenizer-from .device/tok "${q[@]}" >&2
  echo "$dir"
}

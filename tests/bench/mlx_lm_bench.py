#!/usr/bin/env python3
"""mlx-lm's own benchmark (`python -m mlx_lm benchmark ARGS`), with mlx-lm
0.32.2's quantized expert layers made to run on mlx 0.32.2 (see
tests/fixtures/mlx_lm_patch.py): the same computation, minus one keyword."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import mlx_lm_patch  # noqa: E402,F401
from mlx_lm import benchmark  # noqa: E402

if __name__ == "__main__":
    import os

    # A group started by hand (gpu_shards.sh): MLX_BENCH_BACKEND names the
    # backend mlx-lm's benchmark joins (its own init() asks for "any").
    backend = os.environ.get("MLX_BENCH_BACKEND")
    if backend:
        import mlx.core as mx

        _init = mx.distributed.init
        mx.distributed.init = lambda *a, **k: _init(strict=True, backend=backend)
    benchmark.main()

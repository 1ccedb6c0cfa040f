"""Grove's CUDA quantized matvec (runner/src/model/layers/qmv.cuh) against MLX's
own `quantized_matmul`, on the GPU machine: for each decode shape of the
Llama-8B and Qwen3-4B models and M = 1, 2, 4, 8 rows, checks the two agree and
times both over enough weight copies to defeat the L2 cache, printing us per
call and the weight bytes' GB/s.

    python3 tests/bench/qmv_bench.py [--bits 4] [--group 64] [--dtype bfloat16]
"""

import argparse
import pathlib
import time

import mlx.core as mx

HEADER = (pathlib.Path(__file__).resolve().parents[2] / "runner/src/model/layers/qmv.cuh").read_text()
BODY = "grove_qmv<M, K, N, BITS, GS, R, CHUNK>(x, w, scales, biases, out);"

SHAPES = [  # (name, N, K)
    ("8b q/o", 4096, 4096),
    ("8b k/v", 1024, 4096),
    ("8b gate/up", 14336, 4096),
    ("8b down", 4096, 14336),
    ("8b lm_head", 128256, 4096),
    ("4b q", 4096, 2560),
    ("4b o", 2560, 4096),
    ("4b gate/up", 9728, 2560),
    ("4b down", 2560, 9728),
    ("4b lm_head", 151936, 2560),
]

KERNEL = mx.fast.cuda_kernel(
    name="grove_qmv",
    input_names=["x", "w", "scales", "biases"],
    output_names=["out"],
    source=BODY,
    header=HEADER,
    ensure_row_contiguous=True,
)


ROWS = 1


def grove_qmv(x, w, scales, biases, bits, group, chunk):
    m, k = x.shape
    n = w.shape[0]
    r = ROWS if n % ROWS == 0 else 1
    return KERNEL(
        inputs=[x, w, scales, biases],
        template=[("M", m), ("K", k), ("N", n), ("BITS", bits), ("GS", group), ("R", r), ("CHUNK", chunk)],
        grid=(32 * n // r, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[x.dtype],
    )[0]


def timed(fn, copies, reps):
    outs = [fn(*c) for c in copies]
    mx.eval(outs)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        outs = []
        for c in copies:
            outs.append(fn(*c))
        mx.eval(outs)
        best = min(best, (time.perf_counter() - t) / len(copies))
    return best


def profile(a):
    """One warm call of MLX's kernel then Grove's per shape and M, in that order,
    for `ncu -k regex:'qmv|qmm'` to time (see gpu_qmv.sh)."""
    dtype = getattr(mx, a.dtype)
    for name, n, k in SHAPES:
        if a.shapes and name not in a.shapes.split(","):
            continue
        wf = (mx.random.normal((n, k)) * 0.02).astype(dtype)
        w, s, b = mx.quantize(wf, group_size=a.group, bits=a.bits)
        for m in [int(v) for v in a.ms.split(",")]:
            x = mx.random.normal((m, k)).astype(dtype)
            mx.eval(x, w, s, b)
            print(f"CASE {name}|{m}|{n}|{k}|{w.nbytes + s.nbytes + b.nbytes}", flush=True)
            mx.eval(mx.quantized_matmul(x, w, s, b, transpose=True, group_size=a.group, bits=a.bits))
            mx.eval(grove_qmv(x, w, s, b, a.bits, a.group, a.chunk))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--ms", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1, help="output rows per warp")
    ap.add_argument("--profile", action="store_true", help="one call of each, for ncu to time")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default all)")
    a = ap.parse_args()
    global ROWS
    ROWS = a.rows
    if a.profile:
        return profile(a)
    dtype = getattr(mx, a.dtype)
    mx.random.seed(0)
    print(f"bits {a.bits} group {a.group} dtype {a.dtype} chunk {a.chunk}")
    print(f"{'shape':12} {'M':>2} {'N':>6} {'K':>6} {'mlx us':>8} {'grove us':>9} {'mlx GB/s':>9} {'grove GB/s':>10} {'ratio':>6} {'max rel err':>11}")
    for name, n, k in SHAPES:
        if a.shapes and name not in a.shapes.split(","):
            continue
        wf = (mx.random.normal((n, k)) * 0.02).astype(dtype)
        w, s, b = mx.quantize(wf, group_size=a.group, bits=a.bits)
        mx.eval(w, s, b)
        nbytes = w.nbytes + s.nbytes + b.nbytes
        copies_n = max(2, int(256e6 // nbytes) + 1)
        mats = [(w, s, b)] + [tuple(mx.array(t) + 0 for t in (w, s, b)) for _ in range(copies_n - 1)]
        mx.eval(mats)
        for m in [int(v) for v in a.ms.split(",")]:
            x = mx.random.normal((m, k)).astype(dtype)
            ref = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=a.group, bits=a.bits)
            got = grove_qmv(x, w, s, b, a.bits, a.group, a.chunk)
            exact = (x.astype(mx.float32) @ mx.dequantize(w, s, b, group_size=a.group, bits=a.bits).astype(mx.float32).T)
            scale = mx.abs(exact).max()
            err_g = (mx.abs(got.astype(mx.float32) - exact).max() / scale).item()
            err_m = (mx.abs(ref.astype(mx.float32) - exact).max() / scale).item()
            copies = [(x, *t) for t in mats]
            t_m = timed(lambda x, w, s, b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=a.group, bits=a.bits), copies, a.reps)
            t_g = timed(lambda x, w, s, b: grove_qmv(x, w, s, b, a.bits, a.group, a.chunk), copies, a.reps)
            print(f"{name:12} {m:>2} {n:>6} {k:>6} {t_m*1e6:8.1f} {t_g*1e6:9.1f} {nbytes/t_m/1e9:9.0f} {nbytes/t_g/1e9:10.0f} {t_m/t_g:6.2f} {err_g:.1e}/{err_m:.1e}", flush=True)
        del mats


if __name__ == "__main__":
    main()

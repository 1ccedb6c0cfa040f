# On the GPU machine, after gpu_env.sh: times MLX's quantized matvec and Grove's
# (qmv.cuh) kernel by kernel with Nsight Compute (GPU time only, no host
# overhead), one line per shape and M with both times and the ratio.
#   bash tests/bench/gpu_qmv.sh [extra qmv_bench.py arguments]
set -e
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)}
"$NCU" --clock-control none --metrics gpu__time_duration.sum -k 'regex:qmv|qmm' --csv \
  python3 tests/bench/qmv_bench.py --profile "$@" > "$OUT/qmv_ncu.csv" 2> "$OUT/qmv_ncu.err" || { tail -20 "$OUT/qmv_ncu.err"; exit 1; }
python3 - "$OUT/qmv_ncu.csv" <<'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
cases = [l[5:].split("|") for l in lines if l.startswith("CASE ")]
rows = [r for r in csv.reader(l for l in lines if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
times = []
for r in rows:
    v = float(r[vi].replace(",", ""))
    v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r[ui]]  # to microseconds
    times.append((r[ki][:40], v))
print(f"{'shape':12} {'M':>2} {'mlx us':>8} {'grove us':>9} {'mlx GB/s':>9} {'grove GB/s':>10} {'ratio':>6}  mlx kernel")
for i, (name, m, n, k, nbytes) in enumerate(cases):
    (km, tm), (kg, tg) = times[2 * i], times[2 * i + 1]
    nb = int(nbytes)
    print(f"{name:12} {m:>2} {tm:8.1f} {tg:9.1f} {nb/tm/1e3:9.0f} {nb/tg/1e3:10.0f} {tm/tg:6.2f}  {km}")
PY

#!/usr/bin/env python3
"""One table from a GPU decode run (tests/bench/gpu_decode.sh): per model,
Grove's and mlx-lm's prefill and decode tok/s, their ratios (Grove / mlx-lm),
and decode as a share of the memory-bandwidth roofline (every weight byte
read once per token: bandwidth / weight bytes).

    gpu_table.py --bandwidth-gbs 4800 NAME=MODEL_DIR[:GROVE_JSON:MLX_TXT] ...

GROVE_JSON is `grove-runner generate --repeat N --json` output (one line per
run; the first, cold run is left out); MLX_TXT is mlx-lm's benchmark output
(its `Averages:` line). Missing paths default to OUT/NAME.grove.json and
OUT/NAME.mlx.txt (--out).
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def weight_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def grove(path: Path) -> tuple[float, float, int]:
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    if not runs:
        raise SystemExit(f"{path}: no runs")
    warm = runs[1:] or runs
    return (
        statistics.median(r["prompt_tps"] for r in warm),
        statistics.median(r["decode_tps"] for r in warm),
        len(warm),
    )


def mlx_lm(path: Path) -> tuple[float, float]:
    m = re.search(r"Averages: prompt_tps=([\d.]+), generation_tps=([\d.]+)", path.read_text())
    if not m:
        raise SystemExit(f"{path}: no mlx-lm Averages line")
    return float(m.group(1)), float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bandwidth-gbs", type=float, required=True, help="the GPU's memory bandwidth, GB/s")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("runs", nargs="+", help="NAME=MODEL_DIR[:GROVE_JSON:MLX_TXT]")
    args = ap.parse_args()
    head = ("model", "GiB", "Grove pf", "mlx pf", "pf x", "Grove dec", "mlx dec", "dec x", "roofline", "Grove %", "mlx %")
    rows = []
    for spec in args.runs:
        name, _, rest = spec.partition("=")
        parts = rest.split(":")
        model = Path(parts[0])
        gj = Path(parts[1]) if len(parts) > 1 else args.out / f"{name}.grove.json"
        mt = Path(parts[2]) if len(parts) > 2 else args.out / f"{name}.mlx.txt"
        gb = weight_bytes(model)
        g_pf, g_dec, _ = grove(gj)
        m_pf, m_dec = mlx_lm(mt)
        roof = args.bandwidth_gbs * 1e9 / gb if gb else float("nan")
        rows.append((name, f"{gb / 2**30:.2f}", f"{g_pf:.0f}", f"{m_pf:.0f}", f"{g_pf / m_pf:.2f}",
                     f"{g_dec:.1f}", f"{m_dec:.1f}", f"{g_dec / m_dec:.2f}", f"{roof:.0f}",
                     f"{100 * g_dec / roof:.0f}%", f"{100 * m_dec / roof:.0f}%"))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    print("pf/dec: prefill/decode tok/s; x: Grove / mlx-lm; roofline: bandwidth / weight bytes (tok/s)")


if __name__ == "__main__":
    sys.exit(main())

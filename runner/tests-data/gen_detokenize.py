#!/usr/bin/env python3
"""Writes detokenize.json: what mlx-lm's streaming detokenizer produces for id sequences.

    PYTHONPATH=.grove/py python3 runner/tests-data/gen_detokenize.py FIXTURES_DIR

For each fixture tokenizer (llama-f32, mistral-f32, qwen2-f32, qwen3-f32) it builds
seeded id sequences (encoded texts, random ids, random byte tokens, hand-picked edge
cases) and records mlx-lm's `detokenizer.text` after feeding them one at a time,
reading `last_segment` after each token (as `stream_generate` does), then `finalize()`.
The Rust tests in runner/src/detokenize.rs replay them.
"""

import json
import random
import sys
from pathlib import Path

import mlx_lm
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
    _byte_decoder,
    load,
)

MODELS = ["llama-f32", "mistral-f32", "qwen2-f32", "qwen3-f32"]

TEXTS = [
    "Hello, world!",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "line one\nline two\n\n  indented\ttab",
    "emoji 👋🏽 and family 👨‍👩‍👧 and flag 🇫🇷!",
    "中文字符和日本語のテキスト、한국어",
    "accents: héllo wörld façade naïve",
    "combining e\u0301 and replacement \ufffd char",
    "nul \x00 byte and bell \x07",
    "math ∑∫√∞ ≠ ≤ arrows → ←",
    "▁ literal metaspace ▁▁ here",
    "   ",
    "\n",
]

# Invalid or truncated UTF-8 to spell out with byte tokens.
BAD_BYTES = [
    b"\xe4\xb8",            # truncated CJK at the end
    b"\xe4\xb8a",           # truncated CJK then ASCII
    b"\xe0\x80\x80",        # overlong
    b"\xed\xa0\x80x",       # surrogate
    b"\xf4\x90\x80\x80",    # above U+10FFFF
    b"\xc0\xaf\xff\xfe",    # never-valid bytes
    b"\x80\x80 a\xbf",      # stray continuations
    b"\xf0\x9f\x98",        # truncated emoji at the end
    b"\xf0\x9f\x98 \xf0\x9f\x98\x80",
    b"\xef\xbf\xbd",        # a literal U+FFFD at the end
    b"\xef\xbf\xbdz",
    b"\xe2\x96\x81x",       # ▁ spelled in bytes
    b"\xe2\x96\x81",
    b" \xe4",
    b"\x00",
    b"a\x00\xe4",
    b"\xe4\x00",
]


def stream(wrapper, ids):
    d = wrapper.detokenizer
    pieces = []
    for t in ids:
        d.add_token(t)
        pieces.append(d.last_segment)
    d.finalize()
    pieces.append(d.last_segment)
    assert "".join(pieces) == d.text, (ids, pieces, d.text)
    return d.text


def kind(wrapper):
    d = wrapper.detokenizer
    if isinstance(d, SPMStreamingDetokenizer):
        return "spm" if d.trim_space else "spm_no_trim"
    if isinstance(d, BPEStreamingDetokenizer):
        return "bpe"
    return "naive"


def byte_ids(wrapper, k):
    """id of each byte's single-byte token."""
    tokens = wrapper.convert_ids_to_tokens(list(range(len(wrapper))))
    out = {}
    if k == "bpe":
        dec = _byte_decoder()
        for i, t in enumerate(tokens):
            if t is not None and len(t) == 1 and t in dec:
                out.setdefault(dec[t], i)
    else:
        for i, t in enumerate(tokens):
            if t is not None and t.startswith("<0x") and len(t) == 6:
                out.setdefault(int(t[3:5], 16), i)
    return out


def cases_for(wrapper, k):
    rng = random.Random(1234)
    n = len(wrapper)
    special = sorted(set(wrapper.all_special_ids) | set(wrapper.added_tokens_decoder))
    bytes_ = byte_ids(wrapper, k)
    assert len(bytes_) == 256, len(bytes_)

    def spell(bs):
        return [bytes_[b] for b in bs]

    cases = []
    for i, t in enumerate(TEXTS):
        cases.append((f"text{i}", wrapper.encode(t, add_special_tokens=False)))
        cases.append((f"text{i}_bytes", spell(t.encode("utf-8"))))
    cases.append(("text_bos", wrapper.encode(" Hi there", add_special_tokens=True)))
    for i, bs in enumerate(BAD_BYTES):
        cases.append((f"bad{i}", spell(bs)))
        cases.append((f"bad{i}_after_word", wrapper.encode("ok", add_special_tokens=False) + spell(bs)))
    for i in range(8):
        cases.append((f"random{i}", [rng.randrange(n) for _ in range(rng.randrange(1, 48))]))
    for i in range(8):
        seq = [bytes_[rng.choice([rng.randrange(256), rng.randrange(0x80, 0x100)])]
               for _ in range(rng.randrange(1, 24))]
        cases.append((f"random_bytes{i}", seq))
    words = wrapper.encode(" the quick brown fox jumps over", add_special_tokens=False)
    for i in range(12):
        seq = []
        for _ in range(rng.randrange(1, 30)):
            r = rng.random()
            if r < 0.15:
                seq.append(rng.choice(special))
            elif r < 0.45:
                seq.append(bytes_[rng.randrange(0x80, 0x100)])
            elif r < 0.55:
                seq.append(bytes_[rng.choice([0x20, 0x00, 0x0A])])
            elif r < 0.8:
                seq.append(rng.choice(words))
            else:
                seq.append(rng.randrange(n))
        cases.append((f"mixed{i}", seq))
    sp = bytes_[0x20]
    cases += [
        ("empty", []),
        ("space_only", [sp]),
        ("spaces", [sp, sp, sp]),
        ("space_then_word", [sp] + words[:3]),
        ("spaces_then_word", [sp, sp] + words[:2]),
        ("special_then_space_word", special[:1] + [sp] + words[:2]),
        ("special_then_word", special[-1:] + words[:3]),
        ("words_then_space", words[:2] + [sp]),
    ]
    if k == "bpe":
        cases += [("out_of_range", [n, words[0], n + 100]), ("out_of_range_first", [n + 1])]
    return cases


# Unusual byte-level tokens (byte 0 next to others, characters outside GPT-2's
# alphabet) for mlx-lm's quirks; the Rust test builds a tokenizer from them.
ODD_TOKENS = ["ĀĠ", "Āä", "aĀ", "ĠĀ", "ä¸", "Āä¸", "中", "▁x", "ĠĠ", "ðŁ", "ĀðŁ", "\n"]


class OddTokenizer:
    """Just what BPEStreamingDetokenizer reads from a tokenizer."""

    def __init__(self):
        self.vocab = sorted(_byte_decoder(), key=ord) + ODD_TOKENS

    def __len__(self):
        return len(self.vocab)

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]


def odd_cases():
    tok = OddTokenizer()
    base = BPEStreamingDetokenizer(tok)
    n = len(tok)
    rng = random.Random(99)
    cases = []
    while len(cases) < 150:
        ids = [n - 1 - rng.randrange(len(ODD_TOKENS)) if rng.random() < 0.5
               else rng.randrange(n + 2) for _ in range(rng.randrange(1, 12))]
        d = base.__class__(tok)
        try:
            for t in ids:
                d.add_token(t)
            d.finalize()
        except KeyError:
            continue  # mlx-lm's finalize fails on a character outside the alphabet
        cases.append({"name": f"odd{len(cases)}", "ids": ids, "text": d.text})
    return {"tokens": tok.vocab, "cases": cases}


def main():
    root = Path(sys.argv[1])
    out = {"mlx_lm_version": mlx_lm.__version__, "models": {}}
    for name in MODELS:
        wrapper = load(root / name)
        k = kind(wrapper)
        cases = [
            {"name": c, "ids": ids, "text": stream(wrapper, ids)}
            for c, ids in cases_for(wrapper, k)
        ]
        out["models"][name] = {"detokenizer": k, "vocab_size": len(wrapper), "cases": cases}
    out["odd_bpe"] = odd_cases()
    path = Path(__file__).with_name("detokenize.json")
    path.write_text(json.dumps(out, ensure_ascii=True) + "\n")
    print(f"wrote {path}: {sum(len(m['cases']) for m in out['models'].values())} cases")


if __name__ == "__main__":
    main()

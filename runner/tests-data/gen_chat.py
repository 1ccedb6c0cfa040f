#!/usr/bin/env python3
"""Writes runner/tests-data/chat/: chat templates and what transformers renders from them.

    PYTHONPATH=.grove/py python3 runner/tests-data/gen_chat.py [FIXTURES_DIR]

FIXTURES_DIR defaults to $GROVE_FIXTURES, else .grove/fixtures in the repository.

It writes:
- chat/templates/<name>/: model directories holding only chat-template files, assembled
  from chat/templates/src/*.jinja (realistic Llama 3.1, Qwen2.5, Qwen3 and Mistral v0.3
  style templates, plus a set of three named ChatML templates) in every layout transformers
  reads: `chat_template` as a string or as a list of {"name", "template"} in
  tokenizer_config.json, and chat_template.jinja plus additional_chat_templates/*.jinja beside it (with
  a stale `chat_template` left in tokenizer_config.json, which the files must win over).
- chat/fixtures.json: the conversations (messages, tools) by name, and cases naming one:
  `AutoTokenizer.from_pretrained(fixture).apply_chat_template(...)` for
  the eight fixture models (f32: template in tokenizer_config.json; q4: chat_template.jinja),
  text and token ids (tokenize=True), over several conversations.
- chat/templates.json: the same for chat/templates/<name>, each loaded with the tokenizer.json
  of a fixture of its family copied beside it (text only).
- chat/jinja.json: single templates exercising Jinja features (tojson options, Python
  methods, printing of None/True/floats/containers, loop controls, namespace, whitespace
  control, ...) rendered through transformers' environment.
- chat/strftime.json: datetime.strftime for fixed UTC timestamps (the `strftime_now` global).

A case that transformers rejects records `error` (the exception text) and `error_type`.
Dicts given to transformers have their keys sorted (except messages, built in the order
the Rust side builds them: role, content, name, tool_calls, tool_call_id; a tool call as
type, function{name, arguments}, id), because serde_json without `preserve_order` hands the
Rust side sorted maps.
"""

import json
import os
import re
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
CHAT = HERE / "chat"
TEMPLATES = CHAT / "templates"
SRC = TEMPLATES / "src"


def fixtures_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("GROVE_FIXTURES"):
        return Path(os.environ["GROVE_FIXTURES"])
    return HERE.parent.parent / ".grove" / "fixtures"


def sorted_deep(v):
    if isinstance(v, dict):
        return {k: sorted_deep(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sorted_deep(x) for x in v]
    return v


def write_json(path, value):
    """Indented JSON, with lists of integers (token ids) kept on one line."""
    text = json.dumps(value, ensure_ascii=False, indent=1)
    text = re.sub(
        r"\[\n\s+(-?\d+(?:,\n\s+-?\d+)*)\n\s+\]",
        lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]",
        text,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def src(name):
    return (SRC / f"{name}.jinja").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------
# Template directories


def build_template_dirs():
    """(Re)creates chat/templates/<name>/ from chat/templates/src/."""
    for d in TEMPLATES.iterdir():
        if d.is_dir() and d.name != "src":
            shutil.rmtree(d)

    # Llama 3.1 style, a string in tokenizer_config.json.
    write_json(
        TEMPLATES / "llama3" / "tokenizer_config.json",
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": src("llama3"),
        },
    )
    # Qwen2.5 style in chat_template.jinja; the stale string in tokenizer_config.json loses.
    write_json(
        TEMPLATES / "qwen25" / "tokenizer_config.json",
        {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": "STALE {{ messages }}",
        },
    )
    (TEMPLATES / "qwen25" / "chat_template.jinja").write_text(src("qwen25"), encoding="utf-8")
    # Qwen3 style (tools, <think>), chat_template.jinja only, as transformers 5 saves it.
    write_json(
        TEMPLATES / "qwen3" / "tokenizer_config.json",
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    (TEMPLATES / "qwen3" / "chat_template.jinja").write_text(src("qwen3"), encoding="utf-8")
    # Mistral v0.3 style; special tokens as serialized AddedToken objects.
    added = lambda s: {  # noqa: E731
        "__type": "AddedToken",
        "content": s,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }
    write_json(
        TEMPLATES / "mistral" / "tokenizer_config.json",
        {
            "bos_token": added("<s>"),
            "eos_token": added("</s>"),
            "unk_token": added("<unk>"),
            "chat_template": src("mistral"),
        },
    )
    # Three named templates as a list in tokenizer_config.json ...
    named = [
        ("default", src("chatml_default")),
        ("tool_use", src("chatml_tool_use")),
        ("rag", src("chatml_rag")),
    ]
    write_json(
        TEMPLATES / "multi" / "tokenizer_config.json",
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": [{"name": n, "template": t} for n, t in named],
        },
    )
    # ... and as chat_template.jinja + additional_chat_templates/*.jinja (the stale list loses).
    write_json(
        TEMPLATES / "multi_dir" / "tokenizer_config.json",
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": [{"name": "default", "template": "STALE"}],
        },
    )
    (TEMPLATES / "multi_dir" / "chat_template.jinja").write_text(named[0][1], encoding="utf-8")
    for n, t in named[1:]:
        p = TEMPLATES / "multi_dir" / "additional_chat_templates" / f"{n}.jinja"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(t, encoding="utf-8")


# Which fixture's tokenizer.json renders each template directory in transformers.
TEMPLATE_TOKENIZER = {
    "llama3": "llama-f32",
    "qwen25": "qwen2-f32",
    "qwen3": "qwen3-f32",
    "mistral": "mistral-f32",
    "multi": "qwen2-f32",
    "multi_dir": "qwen2-f32",
}


def load_template_dir(name, fixtures, tmp):
    """AutoTokenizer over chat/templates/<name> with a fixture's tokenizer.json beside it."""
    d = Path(tmp) / name
    shutil.copytree(TEMPLATES / name, d)
    shutil.copy(fixtures / TEMPLATE_TOKENIZER[name] / "tokenizer.json", d / "tokenizer.json")
    return AutoTokenizer.from_pretrained(str(d))


# ---------------------------------------------------------------------------------------
# Conversations

WEATHER = sorted_deep(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and country, e.g. Paris, France",
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    }
)
TIME = sorted_deep(
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "description": "IANA time zone"}},
                "required": ["tz"],
            },
        },
    }
)


def msg(role, content, name=None, tool_calls=None, tool_call_id=None):
    m = {"role": role, "content": content}
    if name is not None:
        m["name"] = name
    if tool_calls:
        m["tool_calls"] = tool_calls
    if tool_call_id is not None:
        m["tool_call_id"] = tool_call_id
    return m


def call(name, arguments, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": sorted_deep(arguments)}}
    if id is not None:
        c["id"] = id
    return c


SYSTEM = msg("system", "You are a terse assistant. Answer in one sentence.\n")
UNICODE = 'Ça va ? <b>&amp;</b> "quoted" \\ back\tslash 日本語 🙂 \u2028 end'
CALL_PARIS = call("get_weather", {"location": "Paris, France", "unit": "celsius"}, "a1b2c3d4e")
CALL_TIME = call("get_time", {"tz": "Europe/Paris"}, "f5g6h7i8j")

CONVERSATIONS = {
    "system_user": dict(messages=[SYSTEM, msg("user", "What is the capital of France?")]),
    "user_only": dict(messages=[msg("user", "  Hello there!  ")]),
    "multi_turn": dict(
        messages=[
            msg("user", "Hi! Who are you?"),
            msg("assistant", "I am a helpful assistant."),
            msg("user", UNICODE),
        ]
    ),
    "tools": dict(
        messages=[SYSTEM, msg("user", "What's the weather in Paris?")],
        tools=[WEATHER, TIME],
    ),
    "tool_call": dict(
        messages=[
            msg("user", "What's the weather in Paris?"),
            msg("assistant", "", tool_calls=[CALL_PARIS]),
            msg(
                "tool",
                json.dumps({"temperature": 21, "unit": "celsius", "note": UNICODE}, ensure_ascii=False),
                tool_call_id="a1b2c3d4e",
            ),
        ],
        tools=[WEATHER],
    ),
    "tool_call_answered": dict(
        messages=[
            SYSTEM,
            msg("user", "What's the weather in Paris?"),
            msg("assistant", "Let me check.", tool_calls=[CALL_PARIS]),
            msg("tool", '{"temperature": 21}', tool_call_id="a1b2c3d4e"),
            msg("assistant", "It is 21 °C in Paris."),
            msg("user", "Thanks! And the time there?"),
        ],
        tools=[WEATHER, TIME],
    ),
    "parallel_calls": dict(
        messages=[
            msg("user", "Weather and time in Paris?"),
            msg("assistant", "", tool_calls=[CALL_PARIS, CALL_TIME]),
            msg("tool", '{"temperature": 21}', tool_call_id="a1b2c3d4e"),
            msg("tool", '"14:05"', tool_call_id="f5g6h7i8j"),
        ],
        tools=[WEATHER, TIME],
    ),
    "thinking": dict(
        messages=[
            msg("user", "Hello!"),
            msg("assistant", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"),
            msg("user", "Tell me a joke."),
        ]
    ),
    "named": dict(
        messages=[
            msg("user", "Hi, I'm Alice.", name="alice"),
            msg("assistant", "Hello Alice!"),
            msg("user", "What's my name?", name="alice"),
        ]
    ),
}


def variants(template):
    """(conversation, add_generation_prompt, extra, template_name) cases for one template."""
    out = []
    for conv in CONVERSATIONS:
        for agp in (True, False):
            extras = [{}]
            names = [None]
            if template in ("qwen3", "qwen3-f32", "qwen3-q4"):
                extras = [{}, {"enable_thinking": True}, {"enable_thinking": False}]
            if template == "llama3":
                extras = [{"date_string": "26 Jul 2024"}]
                if "tools" in CONVERSATIONS[conv]:
                    extras.append({"date_string": "26 Jul 2024", "tools_in_user_message": False})
                    extras.append({"date_string": "26 Jul 2024", "custom_tools": [TIME]})
            if template in ("llama-f32", "llama-q4") and conv == "system_user":
                extras = [{}, {"bos_token": "<BOS>"}]
            if template in ("multi", "multi_dir"):
                names = [None, "rag", "default"]
            for extra in extras:
                for name in names:
                    out.append((conv, agp, extra, name))
    return out


def render(tok, conv, agp, extra, name, with_ids):
    c = CONVERSATIONS[conv]
    case = {
        "conversation": conv,
        "add_generation_prompt": agp,
        "extra": extra,
        "template_name": name,
    }
    kwargs = dict(tools=c.get("tools"), add_generation_prompt=agp, **sorted_deep(extra))
    if name is not None:
        kwargs["chat_template"] = name
    try:
        case["expected"] = tok.apply_chat_template(c["messages"], tokenize=False, **kwargs)
        if with_ids:
            case["ids"] = tok.apply_chat_template(
                c["messages"], tokenize=True, return_dict=False, **kwargs
            )
    except Exception as e:  # noqa: BLE001 - recorded as the expected outcome
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    return case


# ---------------------------------------------------------------------------------------
# Jinja features

FLOATS = [1.0, 0.1, 1e16, 1e15, 1e-5, 0.0001, 123456789.125, -0.0, 1.5e300, 2.5e-300, -3.75]
TOJSON_VALUE = {
    "b": [True, False, None],
    "e": {"empty_list": [], "empty_obj": {}},
    "f": FLOATS,
    "i": [0, -1, 9007199254740993, 18446744073709551615],
    "s": 'quote " backslash \\ slash / <html> & \' \u00e9 \u65e5 \U0001f642 \x00 \x1f \x7f \u2028 \n\r\t\b\f',
}

JINJA_CASES = [
    ("tojson", "{{ x | tojson }}", {"x": TOJSON_VALUE}),
    ("tojson_indent", "{{ x | tojson(indent=2) }}", {"x": TOJSON_VALUE}),
    ("tojson_indent_zero", "{{ x | tojson(indent=0) }}", {"x": {"a": [1, {"b": []}]}}),
    ("tojson_indent_str", "{{ x | tojson(indent='\t') }}", {"x": {"a": [1, 2]}}),
    ("tojson_ensure_ascii", "{{ x | tojson(ensure_ascii=true) }}", {"x": TOJSON_VALUE}),
    (
        "tojson_sort_keys",
        "{{ {'b': 1, 'a': {'d': 2, 'c': 3}} | tojson(sort_keys=true) }}|{{ {'b': 1, 'a': 2} | tojson }}",
        {},
    ),
    ("tojson_separators", "{{ x | tojson(separators=(',', ':')) }}", {"x": {"a": [1, 2], "b": "c"}}),
    (
        "tojson_indent_separators",
        "{{ x | tojson(indent=1, separators=(', ', ' = ')) }}",
        {"x": {"a": [1, 2], "b": "c"}},
    ),
    ("tojson_scalars", "{{ 'x' | tojson }} {{ 3 | tojson }} {{ 2.50 | tojson }} {{ none | tojson }} {{ true | tojson }}", {}),
    ("tojson_messages", "{{ messages | tojson }}", {}),
    ("print_scalars", "{{ none }}|{{ true }}|{{ false }}|{{ 1.0 }}|{{ 1e20 }}|{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}|{{ 0.1 + 0.2 }}", {}),
    ("print_containers", "{{ [1, 'a', none, true, 2.0] }}|{{ {'k': \"it's\", 'n': none} }}|{{ x }}", {"x": {"a": ["b\n", 'say "hi"'], "c": {"d": False}}}),
    ("print_extra_scalars", "{{ f }}|{{ b }}|{{ n }}|{{ i }}", {"f": 1e-7, "b": True, "n": None, "i": -12}),
    (
        "str_methods",
        "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nz'.lstrip('\\n') }}|{{ 'z  '.rstrip() }}|"
        "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|"
        "{{ 'abc'.startswith('a') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hello'.upper() }}|{{ 'Hello'.lower() }}|"
        "{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}|{{ 'hello'.replace('l', 'L') }}|{{ 'hello'.find('l') }}|"
        "{{ 'hello'.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}|{{ 'ab12'.isalnum() }}",
        {},
    ),
    (
        "dict_methods",
        "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('a') }}|{{ d.get('zz', 'dflt') }}|{{ d.get('zz') }}|"
        "{{ d.keys() | list }}|{{ d.values() | list }}|{{ 'a' in d }}|{{ d | length }}",
        {"d": {"a": 1, "b": "two"}},
    ),
    (
        "loop_controls",
        "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 6 %}{% break %}{% endif %}"
        "{{ i }}{{ ',' if not loop.last }}{% endfor %}|{% for m in messages %}{{ loop.index }}{{ loop.index0 }}"
        "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{% endfor %}",
        {},
    ),
    (
        "namespace",
        "{% set ns = namespace(count=0, seen=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
        "{% set ns.seen = ns.seen + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.seen | join('/') }}"
        "{% set ns2 = namespace() %}{% set ns2.x = 'late' %} {{ ns2.x }}",
        {},
    ),
    (
        "whitespace",
        "Start\n  {% if true %}\n    inside\n  {% endif %}\n  {# a comment #}\n{%- for i in [1, 2] %}\n  item {{ i }}\n{% endfor %}\n"
        "{% if false %}no{% else %}  yes  {% endif %}\n{{- ' trimmed' }}   \n   {{ 'kept' -}}   \nEnd\n",
        {},
    ),
    (
        "slicing",
        "{{ (messages[::-1] | map(attribute='role') | list) }}|{{ 'abcdef'[1:-1] }}|{{ [1, 2, 3][-1] }}|{{ 'abc'[::-1] }}|{{ [1, 2, 3, 4][1::2] }}",
        {},
    ),
    (
        "tests",
        "{{ 'x' in 'xyz' }}{{ 'x' is string }}{{ 'x' is iterable }}{{ 'x' is mapping }}{{ [1] is sequence }}"
        "{{ {} is mapping }}{{ missing is defined }}{{ none is none }}{{ 3 is number }}{{ false is false }}"
        "{{ 0 is false }}{{ true is true }}{{ 3 is odd }}{{ 'a' is lower }}{{ flag is false }}",
        {"flag": False},
    ),
    (
        "filters",
        "{{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
        "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}|"
        "{{ missing | default('d') }}|{{ '  t  ' | trim }}|{{ 'up' | upper }}|{{ '42' | int + 1 }}|{{ 5 | string }}|"
        "{{ [1, 2] | list }}|{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}|{{ [1, 2, 3] | reverse | list }}|{{ 'a.b' | replace('.', '-') }}|"
        "{{ [1, 1, 2] | unique | list }}|{{ [3, 1, 2] | sort }}|{{ [1, 2, 3] | sum }}|{% for k, v in {'k': 'v'} | items %}{{ k }}{{ v }}{% endfor %}|{{ 'abc' | length }}",
        {},
    ),
    ("macro", "{% macro r(m, sep=': ') %}[{{ m.role }}{{ sep }}{{ m.content }}]{% endmacro %}{{ r(messages[0]) }}{{ r(messages[0], sep='=') }}", {}),
    ("generation_tag", "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}\n{% endfor %}", {}),
    ("undefined", "[{{ missing }}][{{ messages[0].missing }}]{% if not messages[0].tool_calls %}none{% endif %}", {}),
    ("dict_global", "{{ dict(a=1, b='x') | tojson }}", {}),
    ("concat", "{{ 'n=' ~ 3 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ messages[0]['content'] ~ '!' }}", {}),
    ("special_tokens", "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|{{ unk_token is defined }}", {}),
    ("extra_override", "{{ eos_token }}|{{ custom }}", {"eos_token": "<EOS>", "custom": {"nested": [1, "two"]}}),
    ("raise", "{% if messages | length < 5 %}{{ raise_exception('Need at least 5 messages, got ' ~ (messages | length)) }}{% endif %}", {}),
    ("tools_none", "{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}", {}),
]

JINJA_MESSAGES = [msg("user", "hi there"), msg("assistant", "hello"), msg("user", "bye")]


# ---------------------------------------------------------------------------------------


def main():
    fixtures = fixtures_dir()
    build_template_dirs()

    fixture_cases = []
    for model in ["llama", "mistral", "qwen2", "qwen3"]:
        for kind in ["f32", "q4"]:
            name = f"{model}-{kind}"
            tok = AutoTokenizer.from_pretrained(str(fixtures / name))
            for conv, agp, extra, tname in variants(name):
                case = render(tok, conv, agp, extra, tname, with_ids=True)
                fixture_cases.append({"model": name, **case})
    write_json(CHAT / "fixtures.json", {"conversations": CONVERSATIONS, "cases": fixture_cases})

    template_cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in TEMPLATE_TOKENIZER:
            tok = load_template_dir(name, fixtures, tmp)
            for conv, agp, extra, tname in variants(name):
                case = render(tok, conv, agp, extra, tname, with_ids=False)
                template_cases.append({"template": name, **case})
    # The list in tokenizer_config.json and the .jinja files hold the same templates.
    key = lambda c: json.dumps([c["conversation"], c["add_generation_prompt"], c["extra"], c["template_name"]])  # noqa: E731
    by_layout = {
        layout: {key(c): c.get("expected", c.get("error")) for c in template_cases if c["template"] == layout}
        for layout in ("multi", "multi_dir")
    }
    assert by_layout["multi"] == by_layout["multi_dir"], "multi and multi_dir render differently"
    write_json(CHAT / "templates.json", {"conversations": CONVERSATIONS, "cases": template_cases})

    tok = AutoTokenizer.from_pretrained(str(fixtures / "qwen2-f32"))
    jinja_cases = []
    for name, template, extra in JINJA_CASES:
        case = {"name": name, "template": template, "messages": JINJA_MESSAGES, "extra": extra}
        try:
            case["expected"] = tok.apply_chat_template(
                JINJA_MESSAGES, chat_template=template, tokenize=False, **sorted_deep(extra)
            )
        except Exception as e:  # noqa: BLE001
            case["error"] = str(e)
            case["error_type"] = type(e).__name__
        jinja_cases.append(case)
    write_json(CHAT / "jinja.json", {"special_tokens_from": "qwen2-f32", "cases": jinja_cases})

    stamps = [0, 951782400, 1721995200, 1735689599, 1767225600 + 3 * 86400 + 13 * 3600 + 7 * 60 + 9, 4102444800]
    formats = [
        "%d %b %Y",
        "%Y-%m-%d %H:%M:%S",
        "%A, %B %d, %Y",
        "%a %j %I:%M %p %y %%",
        "%-d %-m %-H %e|%D|%F|%T|%R|%u %w|%Z %z",
        "%c|%x|%X",
    ]
    strftime = []
    for ts in stamps:
        # strftime_now formats a naive datetime.now(): %Z and %z are empty.
        dt = datetime.fromtimestamp(ts, tz=timezone.utc).replace(tzinfo=None)
        for fmt in formats:
            strftime.append({"timestamp": ts, "format": fmt, "expected": dt.strftime(fmt)})
    write_json(CHAT / "strftime.json", strftime)

    errors = sum("error" in c for c in fixture_cases + template_cases + jinja_cases)
    print(
        f"{len(fixture_cases)} fixture cases, {len(template_cases)} template cases, "
        f"{len(jinja_cases)} jinja cases ({errors} errors), {len(strftime)} strftime cases"
    )


if __name__ == "__main__":
    main()

"""The `openai` Python package (from PyPI, unchanged) against a Grove daemon.

Run by tests/tests/http_api.rs: python3 openai_client.py BASE_URL API_KEY MODEL
Prints a transcript of what the client sent and got; any failed check raises.
"""
import json
import sys

import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
messages = [{"role": "user", "content": "What is the capital of France?"}]


def show(title, value):
    print(f"--- {title}")
    print(value if isinstance(value, str) else json.dumps(value, indent=1, default=str))


# Models.
ids = [m.id for m in client.models.list().data]
show("models.list()", ids)
assert model in ids, ids
assert client.models.retrieve(model).id == model

# Chat, not streamed: greedy, so repeatable.
r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
show("chat.completions.create(max_tokens=12, temperature=0)", r.model_dump(exclude_none=True))
choice = r.choices[0]
assert choice.finish_reason == "length", choice.finish_reason
assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
first_text = choice.message.content
assert first_text

# The same again: the prompt comes from the prompt cache, and the text is the same.
r2 = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=12, temperature=0)
cached = r2.usage.prompt_tokens_details.cached_tokens
show("again: usage", r2.usage.model_dump(exclude_none=True))
assert r2.choices[0].message.content == first_text
assert cached > 0, cached

# Fields that only label, store or route (agent frameworks send them) and the
# neutral values of others are taken, and the greedy text is the same.
r3 = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0,
    metadata={"run": "grove-test"}, store=False, service_tier="auto", prompt_cache_key="k",
    safety_identifier="s", user="u", modalities=["text"], audio=None, prediction=None,
    n=1, top_logprobs=0, verbosity="medium",
)
show("create(metadata, store, service_tier, prompt_cache_key, safety_identifier, user, modalities=['text'], ...)",
     r3.choices[0].message.content)
assert r3.choices[0].message.content == first_text

# Streamed, with usage at the end.
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
chunks = list(stream)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
usage = chunks[-1].usage
show(f"stream=True: {len(chunks)} chunks", {"text": text, "finish_reason": finish, "usage": usage.model_dump()})
assert text == first_text, (text, first_text)
assert finish == ["length"] and usage.completion_tokens == 12

# Sampling options, a stop string and a seed: the same seed gives the same text.
kw = dict(model=model, messages=messages, max_tokens=10, temperature=0.9, top_p=0.9, seed=7,
          frequency_penalty=0.5, presence_penalty=0.5, logit_bias={"17": -100})
a = client.chat.completions.create(**kw).choices[0].message.content
b = client.chat.completions.create(**kw).choices[0].message.content
show("seed=7 twice", [a, b])
assert a == b
stop = first_text[3:6]
if stop.strip():
    s = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, stop=[stop])
    show(f"stop={stop!r}", s.choices[0].message.content)
    assert stop not in s.choices[0].message.content and s.choices[0].finish_reason == "stop"

# Tools: the definitions reach the template (a longer prompt); the reply is
# the random model's text, so only its shape is checked.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
t = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="auto", max_tokens=4)
show("tools=[get_weather]: usage", t.usage.model_dump(exclude_none=True))
assert t.usage.prompt_tokens > r.usage.prompt_tokens
# A conversation carrying a tool call and its result renders.
history = messages + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
]
h = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=4)
show("a tool result in the history: finish_reason", h.choices[0].finish_reason)

# Structured output: JSON following a schema, always.
person = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "color"], "additionalProperties": False}
s = client.chat.completions.create(model=model, messages=messages, max_tokens=200, response_format={
    "type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}})
show("response_format=json_schema", s.choices[0].message.content)
assert s.choices[0].finish_reason == "stop"
p = json.loads(s.choices[0].message.content)
assert set(p) == {"name", "age", "color"} and isinstance(p["name"], str) and len(p["name"]) <= 8
assert isinstance(p["age"], int) and 0 <= p["age"] <= 120 and p["color"] in ("red", "green", "blue")
o = client.chat.completions.create(model=model, messages=messages, max_tokens=300,
                                   response_format={"type": "json_object"})
show("response_format=json_object: finish_reason", o.choices[0].finish_reason)
if o.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(o.choices[0].message.content), dict)
# The SDK's own parse helper (pydantic) on the same constraint.
try:
    import pydantic

    class Person(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=120)
        ok: bool

    parsed = client.chat.completions.parse(model=model, messages=messages, max_tokens=200, response_format=Person)
    show("chat.completions.parse(response_format=Person)", repr(parsed.choices[0].message.parsed))
    assert isinstance(parsed.choices[0].message.parsed, Person)
except AttributeError:
    pass

# A forced tool call: parsed into tool_calls, its arguments following the schema.
weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}]
f = client.chat.completions.create(model=model, messages=messages, tools=weather, tool_choice="required", max_tokens=300)
show("tool_choice=required", f.choices[0].model_dump(exclude_none=True))
call = f.choices[0].message.tool_calls[0]
args = json.loads(call.function.arguments)
assert f.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7
stream = client.chat.completions.create(model=model, messages=messages, tools=weather, max_tokens=300, stream=True,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
deltas = [d for c in stream if c.choices for d in (c.choices[0].delta.tool_calls or [])]
show("tool_choice=get_weather, stream=True: tool call deltas", [d.model_dump(exclude_none=True) for d in deltas])
assert len(deltas) == 1 and deltas[0].function.name == "get_weather" and json.loads(deltas[0].function.arguments)

# The legacy functions API: functions as tools, function_call as tool_choice, the
# reply's call as message.function_call (finish_reason "function_call").
functions = [w["function"] for w in weather]
lf = client.chat.completions.create(model=model, messages=messages, functions=functions,
                                    function_call={"name": "get_weather"}, max_tokens=300)
show("functions, function_call=get_weather", lf.choices[0].model_dump(exclude_none=True))
fc = lf.choices[0].message.function_call
assert lf.choices[0].finish_reason == "function_call" and fc.name == "get_weather", lf
assert json.loads(fc.arguments)["city"] in ("Paris", "Rome")
parts = [c.choices[0].delta.function_call for c in client.chat.completions.create(
    model=model, messages=messages, functions=functions, function_call={"name": "get_weather"}, max_tokens=300,
    stream=True) if c.choices and c.choices[0].delta.function_call]
assert len(parts) == 1 and parts[0].name == "get_weather" and parts[0].arguments == fc.arguments, parts
# Its history: the assistant's function_call and the function's result (role "function").
legacy_history = messages + [{"role": "assistant", "content": None, "function_call": {"name": fc.name, "arguments": fc.arguments}},
                             {"role": "function", "name": "get_weather", "content": "22 C and sunny"}]
lh = client.chat.completions.create(model=model, messages=legacy_history, functions=functions, max_tokens=4)
show("a function result in the history: usage", lh.usage.model_dump(exclude_none=True))
assert lh.usage.prompt_tokens > lf.usage.prompt_tokens

# Legacy completions.
c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0)
show("completions.create", c.model_dump(exclude_none=True))
assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5

# The Responses API: whole and streamed alike; previous_response_id continues
# the conversation as the explicit history would; store=False is not kept.
ask = "What is the capital of France?"
rr = client.responses.create(model=model, input=ask, instructions="Answer briefly.", max_output_tokens=8)
show("responses.create(max_output_tokens=8)", rr.model_dump(exclude_none=True))
assert rr.status == "incomplete" and rr.incomplete_details.reason == "max_output_tokens"
assert rr.output_text and rr.usage.output_tokens == 8 and rr.output[0].type == "message"
# (The SDK's stream helper takes only response.completed as final; a reply cut
# by max_output_tokens ends with response.incomplete, as OpenAI's does.)
with client.responses.stream(model=model, input=ask, instructions="Answer briefly.", max_output_tokens=8) as s:
    events = list(s)
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
show("responses.stream(): event types", [e.type for e in events])
assert events[-1].type == "response.incomplete" and deltas == rr.output_text
assert events[-1].response.output[0].content[0].text == deltas
with client.responses.stream(model=model, input=ask, max_output_tokens=300,
                             text={"format": {"type": "json_object"}}) as s:
    final = s.get_final_response()
show("responses.stream(json_object): final", final.output_text)
assert final.status == "completed" and isinstance(json.loads(final.output_text), dict)
follow = client.responses.create(model=model, input="And of Italy?", previous_response_id=rr.id, max_output_tokens=2)
explicit = client.responses.create(model=model, max_output_tokens=2, input=[
    {"role": "user", "content": ask}, {"role": "assistant", "content": rr.output_text},
    {"role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]}])
alone = client.responses.create(model=model, input="And of Italy?", max_output_tokens=2)
show("input tokens: previous_response_id, explicit history, alone",
     [follow.usage.input_tokens, explicit.usage.input_tokens, alone.usage.input_tokens])
assert follow.usage.input_tokens == explicit.usage.input_tokens > alone.usage.input_tokens
assert follow.output_text == explicit.output_text
unkept = client.responses.create(model=model, input=ask, store=False, max_output_tokens=1)
try:
    client.responses.create(model=model, input="Hi", previous_response_id=unkept.id, max_output_tokens=1)
    raise AssertionError("a response with store=False was remembered")
except openai.NotFoundError as e:
    show("previous_response_id of a store=False response -> NotFoundError", e.body)
rl = client.responses.create(model=model, input=ask, max_output_tokens=4, top_logprobs=2,
                             include=["message.output_text.logprobs"])
lps = rl.output[0].content[0].logprobs
show("responses: include output_text.logprobs, top_logprobs=2", [(t.token, round(t.logprob, 4)) for t in lps])
assert len(lps) == 4 and all(len(t.top_logprobs) == 2 and t.logprob == t.top_logprobs[0].logprob for t in lps)
with client.responses.stream(model=model, input=ask, max_output_tokens=4, top_logprobs=2,
                             include=["message.output_text.logprobs"]) as s:
    slp = [t for e in s if e.type == "response.output_text.delta" for t in (e.logprobs or [])]
assert [(t.token, t.logprob) for t in slp] == [(t.token, t.logprob) for t in lps]
rtools = [{"type": "function", "name": "get_weather", "parameters": weather[0]["function"]["parameters"]}]
fr = client.responses.create(model=model, input=ask, tools=rtools, tool_choice="required", max_output_tokens=300)
calls = [o for o in fr.output if o.type == "function_call"]
show("responses: tool_choice=required", [c.model_dump() for c in calls])
assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
fo = client.responses.create(model=model, previous_response_id=fr.id, tools=rtools, max_output_tokens=4,
                             input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C"}])
assert fo.usage.input_tokens > fr.usage.input_tokens
person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}
js = client.responses.create(model=model, input="A person, as JSON", max_output_tokens=200,
                             text={"format": {"type": "json_schema", "name": "person", "schema": person, "strict": True}})
show("responses: text.format json_schema", js.output_text)
assert js.status == "completed" and set(json.loads(js.output_text)) == {"name", "age"}
for bad_kw in ({"background": True}, {"truncation": "auto"}, {"tools": [{"type": "web_search"}]}):
    try:
        client.responses.create(model=model, input="Hi", **bad_kw)
        raise AssertionError(f"{bad_kw} was accepted")
    except openai.BadRequestError as e:
        show(f"responses {bad_kw} -> BadRequestError", e.body)


def expect(error, title, **kw):
    try:
        client.chat.completions.create(**{"model": model, "messages": messages, "max_tokens": 2, **kw})
    except error as e:
        show(f"{title} -> {type(e).__name__} {e.status_code}", e.body)
        return e
    raise AssertionError(f"{title}: no {error.__name__}")


expect(openai.BadRequestError, "n=9", n=9)
# n choices: greedy ones agree; seeded ones are choice i = the request alone with seed + i.
g = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, n=4)
texts = [c.message.content for c in g.choices]
show("n=4 greedy: choices", texts)
assert [c.index for c in g.choices] == [0, 1, 2, 3] and len(set(texts)) == 1, texts
assert g.usage.completion_tokens == 4 * client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0).usage.completion_tokens
# The choices share one prefill: the first puts the prompt into the prompt
# cache, and every choice starts from it (all of it but the last token cached).
fresh = [{"role": "user", "content": "Name three rivers of Europe, one per line, and nothing else."}]
u = client.chat.completions.create(model=model, messages=fresh, max_tokens=4, temperature=0, n=3).usage
show("n=3 on a fresh prompt: usage", u.model_dump())
assert u.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1, u
s = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1, seed=7, n=3)
texts = [c.message.content for c in s.choices]
alone = [client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1, seed=7 + i)
         .choices[0].message.content for i in range(3)]
show("n=3 seed=7: choices, then each seed alone", [texts, alone])
assert texts == alone and len(set(texts)) > 1, (texts, alone)
parts = ["", "", ""]
for ch in client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1, seed=7, n=3,
                                         stream=True):
    for c in ch.choices:
        parts[c.index] += c.delta.content or ""
show("n=3 seed=7 streamed", parts)
assert parts == texts, (parts, texts)
c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0, n=2)
assert [x.index for x in c.choices] == [0, 1] and c.choices[0].text == c.choices[1].text, c
expect(openai.BadRequestError, "a schema llguidance cannot compile",
       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strange"}}})
expect(openai.BadRequestError, "tool_choice naming no tool", tools=weather,
       tool_choice={"type": "function", "function": {"name": "nope"}})
# Log-probabilities: every token's with its alternatives (greedy: the token is
# the most likely), the same whole and streamed; legacy completions' shape.
lp = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                    logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
show("logprobs=True, top_logprobs=3: logprobs.content",
     [(t.token, round(t.logprob, 4), [(a.token, round(a.logprob, 4)) for a in t.top_logprobs]) for t in content])
assert len(content) == lp.usage.completion_tokens == 6, content
for t in content:
    assert len(t.top_logprobs) == 3 and t.logprob <= 0 and t.bytes is not None, t
    assert abs(t.logprob - max(a.logprob for a in t.top_logprobs)) < 1e-6, t
    assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True), t
streamed = []
for ch in client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3, stream=True):
    if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
        streamed += ch.choices[0].logprobs.content
show("the same streamed: tokens", [t.token for t in streamed])
assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
plain = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
assert plain.choices[0].logprobs is None and plain.choices[0].message.content == lp.choices[0].message.content
lc = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, temperature=0, logprobs=2)
show("completions.create(logprobs=2): logprobs", lc.choices[0].logprobs.model_dump())
lcp = lc.choices[0].logprobs
assert len(lcp.tokens) == len(lcp.token_logprobs) == len(lcp.top_logprobs) == len(lcp.text_offset) == 4
assert lcp.text_offset[0] == 0 and all(1 <= len(d) <= 2 for d in lcp.top_logprobs), lcp
expect(openai.BadRequestError, "top_logprobs=21", logprobs=True, top_logprobs=21)
expect(openai.BadRequestError, "top_logprobs=2 without logprobs", top_logprobs=2)
expect(openai.BadRequestError, "an unknown field (extra_body)", extra_body={"mirostat": 2})
expect(openai.BadRequestError, "temperature=-1", temperature=-1)
# reasoning_effort goes to the template's own variable: Qwen3's enable_thinking
# (none and minimal: off, which closes an empty think block in the prompt).
def prompt_tokens(**kw):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0, **kw)
    return r.usage.prompt_tokens
default, high, none = prompt_tokens(), prompt_tokens(reasoning_effort="high"), prompt_tokens(reasoning_effort="none")
show("prompt tokens: default, reasoning_effort='high', 'none'", [default, high, none])
assert default == high < none, (default, high, none)
e = expect(openai.BadRequestError, "functions and tools together", tools=weather, functions=functions)
assert "functions" in str(e.body), e.body
e = expect(openai.BadRequestError, "reasoning_effort='extreme'", reasoning_effort="extreme")
assert "reasoning_effort" in str(e.body), e.body
e = expect(openai.NotFoundError, "an unknown model", model="nobody/no-such-model")
assert e.body["code"] == "model_not_found", e.body
bad = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    show(f"a wrong API key -> {type(e).__name__} {e.status_code}", e.body)
print("openai client: all checks passed")

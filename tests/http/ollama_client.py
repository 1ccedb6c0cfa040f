"""The `ollama` Python package (from PyPI, unchanged) against a Grove daemon.

Run by tests/tests/http_api.rs: python3 ollama_client.py HOST API_KEY MODEL
Pulls MODEL from the daemon's hub (a local test hub), then lists, shows,
chats, generates, lists what runs, and deletes it. Prints a transcript; any
failed check raises.
"""
import json
import sys

import ollama

host, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = ollama.Client(host=host, headers={"Authorization": f"Bearer {key}"})


def show(title, value):
    print(f"--- {title}")
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    print(value if isinstance(value, str) else json.dumps(value, indent=1, default=str))


# Pull, streamed: ollama's status lines, ending in success.
statuses = [p.status for p in client.pull(model, stream=True)]
show("pull(stream=True): statuses", sorted(set(statuses), key=statuses.index))
assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
assert any(s.startswith("pulling ") and s != "pulling manifest" for s in statuses)

listed = client.list()
show("list()", listed)
assert any(m.model == model and m.size > 0 for m in listed.models)

info = client.show(model)
show("show(): details, capabilities", {"details": info.details.model_dump(), "capabilities": info.capabilities})
assert info.template and info.modelinfo["general.parameter_count"] > 0

messages = [{"role": "user", "content": "Why is the sky blue?"}]
r = client.chat(model=model, messages=messages, options={"num_predict": 8, "temperature": 0})
show("chat(num_predict=8, temperature=0)", r)
assert r.done and r.done_reason == "length" and r.eval_count == 8 and r.message.role == "assistant"
assert r.total_duration > 0 and r.prompt_eval_count > 0
parts = list(client.chat(model=model, messages=messages, stream=True, options={"num_predict": 8, "temperature": 0}))
show(f"chat(stream=True): {len(parts)} lines, last", parts[-1])
assert "".join(p.message.content for p in parts) == r.message.content
assert parts[-1].done and not parts[0].done

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
history = messages + [
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "22 C", "tool_name": "get_weather"},
]
t = client.chat(model=model, messages=history, tools=tools, options={"num_predict": 4})
show("chat(tools, a tool result in the history): prompt_eval_count", t.prompt_eval_count)
assert t.prompt_eval_count > r.prompt_eval_count

g = client.generate(model=model, prompt="Why is the sky blue?", options={"num_predict": 8, "temperature": 0})
show("generate(num_predict=8)", g)
assert g.done and g.eval_count == 8 and g.response
assert g.response == r.message.content  # the same chat template, the same greedy tokens
raw = list(client.generate(model=model, prompt="Once upon a time", raw=True, stream=True, options={"num_predict": 5}))
show(f"generate(raw=True, stream=True): {len(raw)} lines", "".join(p.response for p in raw))
assert raw[-1].done and raw[-1].eval_count == 5

running = client.ps()
show("ps()", running)
assert any(m.model == model and m.context_length > 0 for m in running.models)

person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}
j = client.chat(model=model, messages=messages, format=person, options={"num_predict": 200})
show("chat(format=SCHEMA)", j.message.content)
p = json.loads(j.message.content)
assert j.done_reason == "stop" and set(p) == {"name", "age"} and 0 <= p["age"] <= 120
j = client.generate(model=model, prompt="JSON please", format="json", options={"num_predict": 300})
show("generate(format='json'): done_reason", j.done_reason)
if j.done_reason == "stop":
    assert isinstance(json.loads(j.response), (dict, list))
try:
    client.chat(model=model, messages=messages, format={"type": "strange"})
    raise AssertionError("a bad schema was accepted")
except ollama.ResponseError as e:
    show("chat(format={'type': 'strange'}) -> ResponseError", f"{e.status_code} {e.error}")
    assert e.status_code == 400
# Load hints (Open WebUI and ChatOllama send them) are taken and change nothing;
# an option that would change the output and is not implemented is refused by name.
hints = {"num_gpu": 1, "num_thread": 2, "num_batch": 64, "num_keep": 4, "use_mmap": True, "numa": False, "low_vram": False, "main_gpu": 0,
         "penalize_newline": False}
j = client.chat(model=model, messages=messages, options={"num_predict": 8, "temperature": 0, **hints})
k = client.chat(model=model, messages=messages, options={"num_predict": 8, "temperature": 0})
show("chat(options=load hints): same reply as without", j.message.content == k.message.content)
assert j.message.content == k.message.content
try:
    client.chat(model=model, messages=messages, options={"penalize_newline": True})
    raise AssertionError("penalize_newline was accepted")
except ollama.ResponseError as e:
    show("chat(options={'penalize_newline': True}) -> ResponseError", f"{e.status_code} {e.error}")
    assert e.status_code == 400 and "penalize_newline" in e.error
# A think level is a reasoning effort: on Qwen3's template, thinking on, as think=True.
counts = [client.chat(model=model, messages=messages, think=t, options={"num_predict": 1}).prompt_eval_count
          for t in ("low", True, False)]
show("prompt_eval_count: think='low', True, False", counts)
assert counts[0] == counts[1] < counts[2], counts
try:
    client.chat(model=model, messages=messages, think="max")
    raise AssertionError("think='max' was accepted")
except ollama.ResponseError as e:
    show("chat(think='max') -> ResponseError", f"{e.status_code} {e.error}")
    assert e.status_code == 400 and "think" in e.error
# Log-probabilities, whole and streamed alike (greedy: each token the most likely).
lw = client.chat(model=model, messages=messages, logprobs=True, top_logprobs=2, options={"num_predict": 5, "temperature": 0})
show("chat(logprobs=True, top_logprobs=2): logprobs", [(x.token, round(x.logprob, 4)) for x in lw.logprobs])
assert len(lw.logprobs) == lw.eval_count == 5
assert all(len(x.top_logprobs) == 2 and abs(x.logprob - x.top_logprobs[0].logprob) < 1e-6 for x in lw.logprobs)
ls = [x for p in client.chat(model=model, messages=messages, logprobs=True, top_logprobs=2, stream=True,
                             options={"num_predict": 5, "temperature": 0}) for x in (p.logprobs or [])]
assert [(x.token, x.logprob) for x in ls] == [(x.token, x.logprob) for x in lw.logprobs]
lg = client.generate(model=model, prompt="Why is the sky blue?", logprobs=True, options={"num_predict": 3})
show("generate(logprobs=True): logprobs", [(x.token, round(x.logprob, 4)) for x in lg.logprobs])
assert len(lg.logprobs) == 3 and all(not x.top_logprobs for x in lg.logprobs)
try:
    client.chat(model="nobody/no-such-model", messages=messages)
    raise AssertionError("an unknown model was accepted")
except ollama.ResponseError as e:
    show("chat(an unknown model) -> ResponseError", f"{e.status_code} {e.error}")
    assert e.status_code == 404

show("delete()", client.delete(model))
assert not any(m.model == model for m in client.list().models)
print("ollama client: all checks passed")

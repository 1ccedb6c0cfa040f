"""The `anthropic` Python package (from PyPI, unchanged) against a Grove daemon.

Run by tests/tests/http_api.rs: python3 anthropic_client.py BASE_URL API_KEY MODEL
(the key goes as x-api-key, as the SDK sends it). Prints a transcript of what
the client sent and got; any failed check raises.
"""
import json
import sys

import anthropic

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
messages = [{"role": "user", "content": "What is the capital of France?"}]


def show(title, value):
    print(f"--- {title}")
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    print(value if isinstance(value, str) else json.dumps(value, indent=1, default=str))


# Whole, greedy (Grove's default without a temperature): repeatable; the
# length ending is max_tokens.
r = client.messages.create(model=model, max_tokens=10, messages=messages)
show("messages.create(max_tokens=10)", r)
assert r.type == "message" and r.role == "assistant" and r.stop_reason == "max_tokens"
assert r.usage.output_tokens == 10 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 0
text = "".join(b.text for b in r.content if b.type == "text")
assert text

# Streamed through the SDK's helper: the same text, the same final message.
with client.messages.stream(model=model, max_tokens=10, messages=messages) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
show("messages.stream(): text, stop_reason, usage", [streamed, final.stop_reason, final.usage.model_dump()])
assert streamed == text and final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
events = [e.type for e in client.messages.create(model=model, max_tokens=3, messages=messages, stream=True)]
show("stream=True: event types", events)
assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
assert "content_block_start" in events and "content_block_stop" in events

# A system prompt (string or blocks with cache_control) lengthens the prompt alike;
# metadata only labels.
def prompt_len(**kw):
    u = client.messages.create(model=model, max_tokens=1, messages=messages, **kw).usage
    return u.input_tokens + u.cache_read_input_tokens
plain, with_system = prompt_len(), prompt_len(system="Answer in one word.")
blocks = prompt_len(system=[{"type": "text", "text": "Answer in one word.", "cache_control": {"type": "ephemeral"}}],
                    metadata={"user_id": "grove-test"})
show("prompt tokens: plain, system, system as blocks", [plain, with_system, blocks])
assert plain < with_system == blocks

# Labels, routing and hints are taken and change nothing.
same = client.messages.create(model=model, max_tokens=10, messages=messages, service_tier="auto", speed="standard",
                              inference_geo="eu", cache_control={"type": "ephemeral"},
                              diagnostics={"previous_message_id": None})
assert "".join(b.text for b in same.content if b.type == "text") == text
# output_config: effort as the template's reasoning effort (Qwen3: thinking on,
# its default), format as a JSON schema the reply follows.
assert prompt_len(output_config={"effort": "low"}) == plain
person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
j = client.messages.create(model=model, max_tokens=200, messages=messages,
                           output_config={"format": {"type": "json_schema", "schema": person}})
show("output_config.format json_schema", j)
assert j.stop_reason == "end_turn" and set(json.loads(j.content[-1].text)) == {"name", "age"}

# A stop sequence from the greedy text: stop_reason stop_sequence, and which.
stop = text[3:6]
if stop.strip():
    s = client.messages.create(model=model, max_tokens=10, messages=messages, stop_sequences=[stop])
    show(f"stop_sequences=[{stop!r}]", s)
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop
    assert stop not in "".join(b.text for b in s.content if b.type == "text")

# Tools: a forced call (tool_choice any) comes back as a tool_use block whose
# input follows the schema, whole and streamed; its result goes back.
weather = [{"name": "get_weather", "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                             "required": ["city"], "additionalProperties": False}}]
t = client.messages.create(model=model, max_tokens=300, messages=messages, tools=weather,
                           tool_choice={"type": "any"})
show("tools, tool_choice any", t)
use = [b for b in t.content if b.type == "tool_use"]
assert t.stop_reason == "tool_use" and use and use[0].name == "get_weather" and use[0].input["city"] in ("Paris", "Rome")
with client.messages.stream(model=model, max_tokens=300, messages=messages, tools=weather,
                            tool_choice={"type": "tool", "name": "get_weather"}) as s:
    final = s.get_final_message()
show("streamed tool_choice tool: content", final)
assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
assert final.content[-1].input == [b for b in final.content if b.type == "tool_use"][0].input
history = messages + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": use[0].id, "name": "get_weather", "input": use[0].input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "22 C and sunny"},
                                 {"type": "text", "text": "Thanks. And tomorrow?"}]},
]
h = client.messages.create(model=model, max_tokens=4, messages=history, tools=weather)
show("a tool result in the history: usage", h.usage)
assert h.usage.input_tokens + h.usage.cache_read_input_tokens > plain

# thinking goes to the template's switch (Qwen3: off closes an empty think block).
on = prompt_len(thinking={"type": "enabled", "budget_tokens": 1024})
off = prompt_len(thinking={"type": "disabled"})
show("prompt tokens: thinking enabled, disabled", [on, off])
assert on == plain < off


def expect(error, title, **kw):
    try:
        client.messages.create(**{"model": model, "max_tokens": 2, "messages": messages, **kw})
    except error as e:
        show(f"{title} -> {type(e).__name__} {e.status_code}", e.body)
        return e
    raise AssertionError(f"{title}: no {error.__name__}")


e = expect(anthropic.BadRequestError, "an image block",
           messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
assert e.body["error"]["type"] == "invalid_request_error" and "image" in e.body["error"]["message"]
expect(anthropic.BadRequestError, "a server tool", tools=[{"type": "web_search_20250305", "name": "web_search"}])
expect(anthropic.BadRequestError, "a container", container="c-1")
expect(anthropic.BadRequestError, "output_config.effort='extreme'", output_config={"effort": "extreme"})
expect(anthropic.BadRequestError, "an unknown field", extra_body={"mirostat": 2})
e = expect(anthropic.NotFoundError, "an unknown model", model="nobody/no-such-model")
assert e.body["error"]["type"] == "not_found_error", e.body
bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
try:
    bad.messages.create(model=model, max_tokens=2, messages=messages)
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    show(f"a wrong API key -> {type(e).__name__} {e.status_code}", e.body)
# The key as a bearer token works too (auth_token).
ok = anthropic.Anthropic(base_url=base, auth_token=key, max_retries=0)
assert ok.messages.create(model=model, max_tokens=1, messages=messages).usage.output_tokens == 1
print("anthropic client: all checks passed")

"""LangChain (`langchain-openai`, `langchain-ollama`) and `instructor`, from PyPI
and unchanged, against a Grove daemon.

Run by tests/tests/http_api.rs: python3 frameworks_client.py BASE_URL API_KEY MODEL
Prints a transcript; any failed check raises.
"""
import json
import sys
from typing import Literal

import instructor
import openai
from langchain_ollama import ChatOllama, OllamaEmbeddings
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
ask = "What is the capital of France?"


def show(title, value):
    print(f"--- {title}")
    print(value if isinstance(value, str) else json.dumps(value, indent=1, default=str))


class Weather(BaseModel):
    """Weather in a city."""
    city: Literal["Paris", "Rome"]


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


# LangChain's ChatOpenAI: invoke, stream, a forced tool call, structured output.
llm = ChatOpenAI(base_url=f"{base}/v1", api_key=key, model=model, temperature=0, max_tokens=8, max_retries=0)
m = llm.invoke(ask)
show("ChatOpenAI.invoke", {"content": m.content, "usage": m.usage_metadata})
assert m.content and m.usage_metadata["output_tokens"] == 8
streamed = "".join(c.content for c in llm.stream(ask))
assert streamed == m.content, (streamed, m.content)
long = ChatOpenAI(base_url=f"{base}/v1", api_key=key, model=model, temperature=0, max_tokens=300, max_retries=0)
t = long.bind_tools([Weather], tool_choice="Weather").invoke(ask)
show("ChatOpenAI.bind_tools(tool_choice=Weather)", t.tool_calls)
assert t.tool_calls[0]["name"] == "Weather" and t.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
p = long.with_structured_output(Person, method="json_schema").invoke("A person, as JSON")
show("ChatOpenAI.with_structured_output(Person, json_schema)", p.model_dump())
assert isinstance(p, Person)

# LangChain's ChatOllama: invoke, stream, structured output (format = schema).
headers = {"Authorization": f"Bearer {key}"}
chat = ChatOllama(base_url=base, model=model, temperature=0, num_predict=8, client_kwargs={"headers": headers})
o = chat.invoke(ask)
show("ChatOllama.invoke", {"content": o.content, "usage": o.usage_metadata})
assert o.content and o.usage_metadata["output_tokens"] == 8
assert "".join(c.content for c in chat.stream(ask)) == o.content
so = ChatOllama(base_url=base, model=model, temperature=0, num_predict=200, client_kwargs={"headers": headers})
po = so.with_structured_output(Person, method="json_schema").invoke("A person, as JSON")
show("ChatOllama.with_structured_output(Person)", po.model_dump())
assert isinstance(po, Person)

# LangChain's embeddings, OpenAI's (no tiktoken: it would download its tables)
# and ollama's: the same vectors both ways, a query equal to its document.
oe = OpenAIEmbeddings(base_url=f"{base}/v1", api_key=key, model=model, check_embedding_ctx_length=False, max_retries=0)
docs = oe.embed_documents(["Paris", "Rome"])
assert len(docs) == 2 and abs(sum(v * v for v in docs[0]) - 1) < 1e-3
ol = OllamaEmbeddings(base_url=base, model=model, client_kwargs={"headers": headers})
docs_o = ol.embed_documents(["Paris", "Rome"])
assert max(abs(a - b) for a, b in zip(docs[1], docs_o[1])) < 1e-5
assert max(abs(a - b) for a, b in zip(ol.embed_query("Paris"), docs_o[0])) < 1e-6
show("OpenAIEmbeddings / OllamaEmbeddings", {"dims": len(docs[0])})

# instructor over the openai client: a pydantic model back (tool mode, then JSON schema mode).
for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
    ic = instructor.from_openai(openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0), mode=mode)
    person = ic.chat.completions.create(model=model, response_model=Person, max_tokens=300, max_retries=1,
                                        messages=[{"role": "user", "content": "A person, as JSON"}])
    show(f"instructor {mode}", person.model_dump())
    assert isinstance(person, Person)
print("frameworks: all checks passed")

// The npm `openai` and `ollama` packages, unchanged, against a Grove daemon.
// Run by tests/tests/http_api.rs: node node_client.cjs BASE_URL API_KEY MODEL
// with NODE_PATH at the packages make test installs. Any failed check exits 1.
const assert = require('node:assert/strict');
const openaiModule = require('openai');
const OpenAI = openaiModule.OpenAI ?? openaiModule.default ?? openaiModule;
const { Ollama } = require('ollama');

const [base, key, model] = process.argv.slice(2);
const messages = [{ role: 'user', content: 'What is the capital of France?' }];
const show = (title, value) => console.log(`--- ${title}\n${JSON.stringify(value, null, 1)}`);

async function main() {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
  show('openai: chat.completions.create', r.choices[0]);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  let streamed = '';
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, stream: true });
  for await (const c of stream) streamed += c.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r.choices[0].message.content);
  const lp = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  assert.equal(lp.choices[0].logprobs.content.length, 3);
  const rr = await client.responses.create({ model, input: messages[0].content, max_output_tokens: 8 });
  show('openai: responses.create', { status: rr.status, output_text: rr.output_text });
  assert.equal(rr.output_text, r.choices[0].message.content);
  await assert.rejects(client.chat.completions.create({ model, messages, temperature: -1 }), OpenAI.BadRequestError);
  // Embeddings (a decoder embeds with its last token, normalized): the SDK's
  // default base64 decoded, and the same vectors from ollama's embed.
  const e = await client.embeddings.create({ model, input: ['Paris', 'Rome'] });
  assert.equal(e.data.length, 2);
  assert.ok(Math.abs(Math.hypot(...e.data[0].embedding) - 1) < 1e-4);

  const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${key}` } });
  const options = { num_predict: 8, temperature: 0 };
  const o = await ollama.chat({ model, messages, options });
  show('ollama: chat', { content: o.message.content, eval_count: o.eval_count, done_reason: o.done_reason });
  assert.equal(o.eval_count, 8);
  let os = '';
  for await (const part of await ollama.chat({ model, messages, options, stream: true })) os += part.message.content;
  assert.equal(os, o.message.content);
  const g = await ollama.generate({ model, prompt: 'Once upon a time', raw: true, options: { num_predict: 4 } });
  assert.equal(g.eval_count, 4);
  const oe = await ollama.embed({ model, input: ['Paris', 'Rome'] });
  assert.equal(oe.embeddings.length, 2);
  oe.embeddings[1].forEach((v, i) => assert.ok(Math.abs(v - e.data[1].embedding[i]) < 1e-5));
  show('embeddings', { openai: e.data[0].embedding.length, ollama: oe.embeddings[0].length });
  const tags = await ollama.list();
  assert.ok(tags.models.some((m) => m.model === model));
  console.log('node clients: all checks passed');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

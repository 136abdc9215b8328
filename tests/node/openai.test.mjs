// posttrainllm serve driven by the official openai npm client (pinned in package.json): chat and
// completions, streamed and not, usage with cached tokens, stop strings, errors; at temperature 0
// the replies equal `posttrainllm chat` and `posttrainllm sample` on the same prompts.
// Usage: node openai.test.mjs BINARY MODEL_DIR   (exit 77 = skipped: node_modules absent)
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
if (!fs.existsSync(path.join(here, 'node_modules', 'openai'))) {
  console.log('SKIP: the openai client is not installed (scripts/setup.sh runs npm ci in tests/node)');
  process.exit(77);
}
const { default: OpenAI } = await import('openai');
const { chatmlCopy, startServer } = await import('./harness.mjs');

const [binary, modelDir] = process.argv.slice(2);
const KEY = 'test-key';
const model = chatmlCopy(modelDir);
const modelId = path.basename(model);
let server;
let client;

before(async () => {
  server = await startServer(binary, model, ['-np', '3', '-t', '2', '--ctx-size', '1536', '--api-key', KEY]);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  const code = await server.stop();
  fs.rmSync(model, { recursive: true, force: true });
  assert.equal(code, 0, `the server exits 0 on SIGTERM\n${server.stderr()}`);
});

function cli(args) {
  return execFileSync(binary, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
}

// Long enough that a resent conversation adopts a block and still prefills more than 16 rows, as a
// cold prefill of it does (the scheduler adopts only what gives a cold prefill's bits).
const user = 'And God said, Let there be light: and there was light. And God saw the light, that it was good: ' +
  'and God divided the light from the darkness. And God called the light Day, and the darkness he called Night.';

test('chat at temperature 0 equals posttrainllm chat', async () => {
  const r = await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: user }], temperature: 0, max_tokens: 24,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  const turns = path.join(os.tmpdir(), `ptllm-turns-${process.pid}.txt`);
  fs.writeFileSync(turns, user + '\n');
  const out = JSON.parse(cli(['chat', model, '-f', turns, '--json', '--temp', '0', '-n', '24', '-c', '512']).trim());
  fs.rmSync(turns);
  assert.equal(r.choices[0].message.content, out.text);
  assert.equal(r.usage.prompt_tokens, out.prompt_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('completion at temperature 0 equals posttrainllm sample', async () => {
  const prompt = 'In the beginning God created';
  const r = await client.completions.create({ model: modelId, prompt, temperature: 0, max_tokens: 20 });
  const out = JSON.parse(cli(['sample', model, '-p', prompt, '--json', '--temp', '0', '-n', '20', '-c', '512']).trim());
  assert.equal(r.choices[0].text, out.text);
  assert.equal(r.usage.prompt_tokens, out.prompt_tokens);
});

test('streamed chat adds up to the reply, with usage and cached tokens', async () => {
  const body = { model: modelId, messages: [{ role: 'user', content: user }], temperature: 0, max_tokens: 24 };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, 'the resent conversation is served from the pool');
});

test('streamed completion and a stop string', async () => {
  const prompt = 'And the earth was without form';
  const full = await client.completions.create({ model: modelId, prompt, temperature: 0, max_tokens: 30 });
  const text = full.choices[0].text;
  assert.ok(text.length > 12);
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
  const stream = await client.completions.create({ model: modelId, prompt, temperature: 0, max_tokens: 30, stop, stream: true });
  let got = '';
  let finish = null;
  for await (const chunk of stream) {
    got += chunk.choices[0]?.text ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(got, text.slice(0, text.indexOf(stop)));
  assert.equal(finish, 'stop');
});

test('several concurrent streams each get their own reply', async () => {
  const prompts = ['In the beginning', 'And God saw the light', 'Blessed are the meek', 'The LORD is my shepherd', 'And it came to pass'];
  const alone = [];
  for (const p of prompts)
    alone.push((await client.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: p }], temperature: 0, max_tokens: 16 })).choices[0].message.content);
  const together = await Promise.all(prompts.map(async (p) => {
    const s = await client.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: p }], temperature: 0, max_tokens: 16, stream: true });
    let t = '';
    for await (const c of s) t += c.choices[0]?.delta?.content ?? '';
    return t;
  }));
  assert.deepEqual(together, alone);
});

test('errors are OpenAI errors', async () => {
  await assert.rejects(client.chat.completions.create({ model: modelId, messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /at least one message/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  // Another model's name is served as this model (agent configurations send their own).
  const other = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
  assert.equal(other.model, modelId);
  const wrong = new OpenAI({ baseURL: server.baseURL, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const long = 'light and darkness '.repeat(400);
  await assert.rejects(client.completions.create({ model: modelId, prompt: long }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
});

test('models lists the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [modelId]);
});

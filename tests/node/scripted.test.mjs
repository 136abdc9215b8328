// An agent's tool loop through the official openai npm client, on a scripted model
// (tests/scripted_model.h): turn 1 answers with a tool call, turn 2, with the tool's result in the
// conversation, with the final answer, both exactly as scripted, streamed or not.
// Usage: node scripted.test.mjs BINARY SCRIPTED_MODEL_BINARY TEMPLATE   (exit 77 = skipped)
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
const { startServer } = await import('./harness.mjs');

const [binary, scriptedModel, template] = process.argv.slice(2);
const toolCall = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const answer = 'It is sunny in Paris, 18 degrees: no coat needed.';
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-scripted-'));
let server;
let client;

before(async () => {
  // " sun" is one token, and only the tool's result has it: it selects the second script.
  const out = execFileSync(scriptedModel, [dir, '--template', template, '--prompt-tail', '<|im_start|>assistant\n',
    '--script', toolCall, '--script-after', ' sun', answer], { encoding: 'utf8' });
  assert.equal(JSON.parse(out).script_ids.length, 2);
  server = await startServer(binary, dir, ['-np', '2', '-t', '1', '--ctx-size', '1024']);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  const code = await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(code, 0, `the server exits 0 on SIGTERM\n${server.stderr()}`);
});

const user = { role: 'user', content: 'What is the weather in Paris?' };
const call = {
  role: 'assistant',
  content: '',
  tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }],
};
const result = { role: 'tool', tool_call_id: 'call_1', content: '{"sky": "full sun", "celsius": 18}' };

test('turn 1 writes the tool call, turn 2 the answer', async () => {
  const model = path.basename(dir);
  const first = await client.chat.completions.create({ model, messages: [user], tools, temperature: 0 });
  assert.equal(first.choices[0].message.content, toolCall);
  assert.equal(first.choices[0].finish_reason, 'stop');
  const second = await client.chat.completions.create({
    model, messages: [user, call, result], tools, temperature: 0,
  });
  assert.equal(second.choices[0].message.content, answer);
  assert.equal(second.choices[0].finish_reason, 'stop');
});

test('streamed, the chunks add up to the script', async () => {
  const stream = await client.chat.completions.create({
    model: path.basename(dir), messages: [user], tools, temperature: 0, stream: true,
  });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, toolCall);
  assert.equal(finish, 'stop');
});

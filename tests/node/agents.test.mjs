// Agents on posttrainllm serve, through the real clients (pinned in package.json): the openai
// client's tool loop on chat completions (streamed and not), the OpenAI Agents SDK running an Agent
// with a function tool over the Responses API and over Chat Completions, and the Anthropic SDK's
// messages with tools (streamed and not). The model is a scripted one (tests/scripted_model.h): it
// answers a prompt with a tool call, and once the tool's result is in the prompt, with the answer,
// so every call and reply is known exactly.
// Usage: node agents.test.mjs BINARY SCRIPTED_MODEL_BINARY TEMPLATE_FILE  (exit 77: clients absent)
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
for (const pkg of ['openai', '@openai/agents', '@anthropic-ai/sdk', 'zod']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg))) {
    console.log(`SKIP: ${pkg} is not installed (scripts/setup.sh runs npm ci in tests/node)`);
    process.exit(77);
  }
}
const { default: OpenAI } = await import('openai');
const { default: Anthropic } = await import('@anthropic-ai/sdk');
const agents = await import('@openai/agents');
const { z } = await import('zod');
const { startServer } = await import('./harness.mjs');

const [binary, scriptedBinary, templateFile] = process.argv.slice(2);
// Qwen2.5's template (Hermes calls); the tool's result holds " warm", which selects the answer.
const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>';
const ANSWER = 'It is warm in Paris today.';
const ARGS = { city: 'Paris', unit: 'celsius' };
const TOOL_RESULT = 'It is warm, 24 C';

const modelDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-agent-'));
execFileSync(scriptedBinary, [modelDir, '--template', templateFile, '--prompt-tail', '<|im_start|>assistant\n',
  '--script', CALL, '--script-after', ' warm', ANSWER], { stdio: ['ignore', 'ignore', 'inherit'] });
const KEY = 'agent-key';
const MODEL = 'gpt-4o-mini';  // the name agent configs carry (--alias)
let server;
let openai;

before(async () => {
  server = await startServer(binary, modelDir, ['-np', '2', '-t', '2', '--ctx-size', '8192', '--api-key', KEY, '--alias', MODEL]);
  openai = new OpenAI({ baseURL: server.baseURL, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  const code = await server.stop();
  fs.rmSync(modelDir, { recursive: true, force: true });
  assert.equal(code, 0, `the server exits 0 on SIGTERM\n${server.stderr()}`);
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] },
  },
};

test('chat completions: the call, streamed and not, and a tool loop that reuses the KV', async () => {
  const messages = [{ role: 'system', content: 'You are a weather agent.' }, { role: 'user', content: 'Weather in Paris?' }];
  const r = await openai.chat.completions.create({ model: MODEL, messages, tools: [weatherTool] });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, null);
  assert.equal(m.tool_calls.length, 1);
  assert.match(m.tool_calls[0].id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), ARGS);

  // Streamed: the deltas add up to the same call; no marker text in content.
  const stream = await openai.chat.completions.create({ messages, tools: [weatherTool], stream: true, model: MODEL });
  const calls = [];
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) {
      if (!calls[tc.index]) calls[tc.index] = { id: tc.id, name: tc.function?.name, arguments: '' };
      calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(content, '');
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), ARGS);

  // The loop: the call and its result go back; the answer uses the tool's value. Each turn's prefill
  // is the new tokens (the history is in the pool).
  const history = [...messages, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: TOOL_RESULT }];
  const done = await openai.chat.completions.create({ messages: history, tools: [weatherTool], model: MODEL });
  assert.equal(done.choices[0].message.content, ANSWER);
  assert.equal(done.choices[0].finish_reason, 'stop');
  const prompt = done.usage.prompt_tokens;
  const cached = done.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0 && prompt - cached < 128, `turn 2: ${cached} of ${prompt} prompt tokens cached`);
  console.log(`tool loop: turn 2 prompt ${prompt} tokens, ${cached} cached`);

  // Bad history: a 400 naming the field, and the server goes on.
  const bad = [...messages, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function',
    function: { name: 'get_weather', arguments: '{city: Paris' } }] }];
  await assert.rejects(openai.chat.completions.create({ messages: bad, tools: [weatherTool], model: MODEL }),
    (e) => e.status === 400 && /tool_calls\[0\]\.function\.arguments/.test(e.message));
  // tool_choice required: a call although the model would answer (its arguments follow the schema).
  const forced = await openai.chat.completions.create({ messages, tools: [weatherTool], model: MODEL, tool_choice: 'required',
    parallel_tool_calls: false, max_tokens: 200 });
  assert.equal(forced.choices[0].finish_reason, 'tool_calls', JSON.stringify(forced.choices[0]));
  const fc = forced.choices[0].message.tool_calls[0];
  assert.equal(fc.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(fc.function.arguments).city, 'string', fc.function.arguments);
  // tool_choice none: the reply is text.
  const none = await openai.chat.completions.create({ messages, tools: [weatherTool], model: MODEL, tool_choice: 'none' });
  assert.equal(none.choices[0].message.content, CALL);
  assert.equal(none.choices[0].finish_reason, 'stop');
});

test('a ten-step tool loop prefills only what each turn adds', async () => {
  const messages = [{ role: 'system', content: 'You are a weather agent.' }, { role: 'user', content: 'Weather in Paris?' }];
  const perTurn = [];
  for (let step = 1; step <= 10; ++step) {
    const r = await openai.chat.completions.create({ model: MODEL, messages, tools: [weatherTool], temperature: 0 });
    const m = r.choices[0].message;
    perTurn.push([r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens]);
    if (step > 1) {
      const [prompt, cached] = perTurn.at(-1);
      const added = prompt - perTurn.at(-2)[0];
      // Besides the new text, only what lies past the last whole block on the prefill-chunk grid is
      // recomputed (the scheduler adopts a prefix where a cold prefill would give the same bits:
      // whole 64-token blocks, chunks of --prefill-chunk 256).
      assert.ok(prompt - cached < added + 256 + 64, `turn ${step}: ${cached} of ${prompt} cached, ${added} added`);
    }
    if (step < 10) {
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      messages.push(m, { role: 'tool', tool_call_id: m.tool_calls[0].id,
        content: step === 9 ? TOOL_RESULT : `No data yet (${step}).` });
    } else {
      assert.equal(m.content, ANSWER);
    }
  }
  console.log(`ten-step loop (prompt, cached) per turn: ${JSON.stringify(perTurn)}`);
});

for (const api of ['responses', 'chat_completions']) {
  test(`OpenAI Agents SDK: an Agent with a function tool over ${api}`, async () => {
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: KEY, maxRetries: 0 });
    agents.setDefaultOpenAIClient(client);
    agents.setTracingDisabled(true);
    agents.setOpenAIAPI(api);
    const seen = [];
    const getWeather = agents.tool({
      name: 'get_weather', description: 'The weather in a city',
      parameters: z.object({ city: z.string(), unit: z.string() }),
      execute: async (args) => { seen.push(args); return TOOL_RESULT; },
    });
    const agent = new agents.Agent({ name: 'weather', instructions: 'Answer with the weather.', tools: [getWeather], model: MODEL });
    const result = await agents.run(agent, 'Weather in Paris?');
    assert.deepEqual(seen, [ARGS]);
    assert.equal(result.finalOutput, ANSWER);
    // Streamed too.
    const streamed = await agents.run(agent, 'Weather in Paris?', { stream: true });
    let text = '';
    for await (const ev of streamed.toTextStream()) text += ev;
    await streamed.completed;
    assert.equal(text, ANSWER);
    assert.equal(seen.length, 2);
  });
}

test('Responses API: previous_response_id carries the conversation', async () => {
  const first = await openai.responses.create({ model: MODEL, input: 'Weather in Paris?', tools: [{ type: 'function',
    name: 'get_weather', parameters: weatherTool.function.parameters }] });
  const call = first.output.find((o) => o.type === 'function_call');
  assert.deepEqual(JSON.parse(call.arguments), ARGS);
  const second = await openai.responses.create({ model: MODEL, previous_response_id: first.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: TOOL_RESULT }] });
  assert.equal(second.output_text, ANSWER);
  assert.ok(second.usage.input_tokens_details.cached_tokens > 0);
  await assert.rejects(openai.responses.create({ model: MODEL, previous_response_id: 'resp_nope', input: 'x' }),
    (e) => e.status === 400 && /previous_response_id/.test(e.message));
});

test('Anthropic SDK: messages with tools, streamed and not', async () => {
  const anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${server.port}`, apiKey: KEY, maxRetries: 0 });
  const tools = [{ name: 'get_weather', description: 'The weather in a city', input_schema: weatherTool.function.parameters }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await anthropic.messages.create({ model: MODEL, max_tokens: 256, system: 'You are a weather agent.', messages, tools });
  assert.equal(r.stop_reason, 'tool_use');
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, ARGS);
  const s = anthropic.messages.stream({ model: MODEL, max_tokens: 256, system: 'You are a weather agent.', messages, tools });
  const streamed = await s.finalMessage();
  assert.equal(streamed.stop_reason, 'tool_use');
  assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, ARGS);
  const loop = [...messages, { role: 'assistant', content: r.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: TOOL_RESULT }] }];
  const answer = await anthropic.messages.create({ model: MODEL, max_tokens: 256, system: 'You are a weather agent.', messages: loop, tools });
  assert.equal(answer.stop_reason, 'end_turn');
  assert.equal(answer.content[0].text, ANSWER);
  assert.ok(answer.usage.cache_read_input_tokens > 0);
  const s2 = anthropic.messages.stream({ model: MODEL, max_tokens: 256, system: 'You are a weather agent.', messages: loop, tools });
  let text = '';
  s2.on('text', (t) => { text += t; });
  await s2.finalMessage();
  assert.equal(text, ANSWER);
  await assert.rejects(anthropic.messages.create({ model: MODEL, max_tokens: 8, messages, tools, thinking: { type: 'enabled', budget_tokens: 100 } }),
    (e) => e.status === 400 && /thinking/.test(e.message));
});

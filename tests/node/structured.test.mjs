// Structured output through posttrainllm serve, checked by a real validator (ajv) and real clients:
// every schema of tests/data/json_schemas through response_format json_schema at temperature 1 with
// kjv-tiny (a model that knows nothing of JSON: a valid output is the grammar's doing), the openai
// client's parse helper with a zod schema, an @openai/agents Agent with a structured output type
// (Responses API), and the Anthropic SDK's forced tool input.
// Usage: node structured.test.mjs BINARY MODEL_DIR SCHEMA_DIR TEMPLATE_FILE [--seeds N] [--model DIR]...
// (exit 77: the npm packages are absent). Every reply that ends by "stop" must parse and validate;
// a reply cut by max_tokens ("length") is counted apart.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test, after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
for (const pkg of ['openai', '@openai/agents', '@anthropic-ai/sdk', 'zod', 'ajv', 'ajv-formats']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg))) {
    console.log(`SKIP: ${pkg} is not installed (scripts/setup-dev.sh runs npm ci in tests/node)`);
    process.exit(77);
  }
}
const { default: OpenAI } = await import('openai');
const { zodResponseFormat } = await import('openai/helpers/zod');
const { default: Anthropic } = await import('@anthropic-ai/sdk');
const agents = await import('@openai/agents');
const { z } = await import('zod');
const { default: Ajv2020 } = await import('ajv/dist/2020.js');
const { default: addFormats } = await import('ajv-formats');
const { startServer } = await import('./harness.mjs');

const argv = process.argv.slice(2);
const [binary, modelDir, schemaDir, templateFile] = argv;
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const SEEDS = Number(opt('--seeds', '1'));
const MAX_TOKENS = Number(opt('--max-tokens', '256'));

// The corpus (tests/data/json_schemas): {"schema": ...} files in generated/ and real/.
const schemas = ['generated', 'real'].flatMap((sub) => fs.readdirSync(path.join(schemaDir, sub))
  .filter((f) => f.endsWith('.json')).sort()
  .map((f) => ({ name: `${sub}/${f}`, schema: JSON.parse(fs.readFileSync(path.join(schemaDir, sub, f), 'utf8')).schema })));

let server;
let openai;
before(async () => {
  server = await startServer(binary, modelDir, ['-np', '2', '-t', '2', '--ctx-size', '4096', '--chat-template', templateFile]);
  openai = new OpenAI({ baseURL: server.baseURL, apiKey: 'none', maxRetries: 0 });
});
after(async () => {
  const code = await server.stop();
  assert.equal(code, 0, `the server exits 0 on SIGTERM\n${server.stderr()}`);
});

function validator(schema) {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  return ajv.compile(schema);
}

test(`every corpus schema x ${SEEDS} seed(s): replies that stop parse and validate`, async () => {
  assert.ok(schemas.length > 0, `no schemas in ${schemaDir}`);
  let stopped = 0, cut = 0;
  const failures = [];
  const t0 = Date.now();
  // Two requests at a time (the server's two slots).
  const jobs = [];
  for (const { name, schema } of schemas) for (let seed = 1; seed <= SEEDS; ++seed) jobs.push({ name, schema, seed });
  const run = async ({ name, schema, seed }) => {
    const r = await openai.chat.completions.create({
      messages: [{ role: 'user', content: 'Answer in JSON.' }], temperature: 1, seed, max_tokens: MAX_TOKENS,
      response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } },
    });
    const c = r.choices[0];
    if (c.finish_reason !== 'stop') {
      ++cut;
      return;
    }
    ++stopped;
    let value;
    try {
      value = JSON.parse(c.message.content);
    } catch (e) {
      failures.push(`${name} seed ${seed}: not JSON: ${c.message.content}`);
      return;
    }
    const validate = validator(schema);
    if (!validate(value)) failures.push(`${name} seed ${seed}: ${JSON.stringify(validate.errors)}: ${c.message.content}`);
  };
  for (let i = 0; i < jobs.length; i += 2) await Promise.all(jobs.slice(i, i + 2).map(run));
  console.log(`schemas ${schemas.length}, seeds ${SEEDS}: ${stopped} stopped (all checked), ${cut} cut by max_tokens ` +
              `${MAX_TOKENS}, ${failures.length} invalid, ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  assert.deepEqual(failures, []);
  assert.ok(stopped >= jobs.length / 2, `most replies end by stop (${stopped} of ${jobs.length})`);
});

test('the openai client parses a zod response format', async () => {
  const Verse = z.object({ book: z.enum(['Genesis', 'Exodus']), chapter: z.number().int(), canonical: z.boolean() });
  let parsed = 0;
  for (let seed = 1; seed <= 4; ++seed) {
    const r = await openai.chat.completions.parse({
      model: 'any', messages: [{ role: 'user', content: 'A verse.' }], temperature: 1, seed, max_tokens: 600,
      response_format: zodResponseFormat(Verse, 'verse'),
    });
    const m = r.choices[0].message;
    assert.ok(m.parsed, `parsed: ${m.content}`);
    assert.ok(['Genesis', 'Exodus'].includes(m.parsed.book));
    assert.equal(typeof m.parsed.canonical, 'boolean');
    ++parsed;
  }
  assert.equal(parsed, 4);
});

test('an @openai/agents Agent with a structured output type', async () => {
  const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'none', maxRetries: 0 });
  agents.setDefaultOpenAIClient(client);
  agents.setOpenAIAPI('responses');
  agents.setTracingDisabled(true);
  const agent = new agents.Agent({
    name: 'judge', instructions: 'Judge the verse.', model: 'any',
    modelSettings: { temperature: 1, maxTokens: 600 },
    outputType: z.object({ verdict: z.enum(['good', 'bad']), score: z.number().int() }),
  });
  const result = await agents.run(agent, 'In the beginning God created the heaven and the earth.');
  assert.ok(['good', 'bad'].includes(result.finalOutput.verdict), JSON.stringify(result.finalOutput));
  assert.ok(Number.isInteger(result.finalOutput.score));
});

test('the Anthropic SDK: a forced tool call whose input validates', async () => {
  const anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${server.port}`, apiKey: 'none', maxRetries: 0 });
  const input_schema = {
    type: 'object', properties: { city: { enum: ['Paris', 'Rome'] }, days: { type: 'integer', minimum: 1, maximum: 5 } },
    required: ['city', 'days'], additionalProperties: false,
  };
  const validate = validator(input_schema);
  for (let seed = 1; seed <= 3; ++seed) {
    const m = await anthropic.messages.create({
      model: 'any', max_tokens: 600, temperature: 1, messages: [{ role: 'user', content: 'Weather?' }],
      tools: [{ name: 'get_weather', description: 'Weather', input_schema }],
      tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use && use.name === 'get_weather', JSON.stringify(m.content));
    assert.ok(validate(use.input), JSON.stringify(validate.errors));
  }
});

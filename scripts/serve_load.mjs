// The load and soak workloads of `posttrainllm serve` (docs/server.md); the code and the openai client
// live in tests/node (npm ci there first). Examples:
//   node scripts/serve_load.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
//   node scripts/serve_load.mjs --binary build/posttrainllm --model ../shared/models/kjv-small --soak
await import('../tests/node/serve_load.mjs');

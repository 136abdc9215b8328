// Starts `posttrainllm serve` on a free loopback port for the client tests and the load script,
// on a copy of a model directory whose tokenizer_config.json gets a ChatML chat template (the
// shipped KJV models have none).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const CHATML =
  "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// A temporary copy of `modelDir` (weights linked, not copied) with the ChatML template.
export function chatmlCopy(modelDir) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-serve-'));
  for (const f of fs.readdirSync(modelDir)) {
    const src = path.resolve(modelDir, f);
    if (f === 'tokenizer_config.json') continue;
    fs.symlinkSync(src, path.join(dir, f));
  }
  const cfgPath = path.join(modelDir, 'tokenizer_config.json');
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
  cfg.chat_template = CHATML;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 2));
  return dir;
}

// Spawns the server and resolves when it prints its port: { proc, port, baseURL, stderr(), stop() }.
export function startServer(binary, modelDir, args = []) {
  const proc = spawn(binary, ['serve', modelDir, '--port', '0', ...args], { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const onExit = (code) => reject(new Error(`server exited (${code}) before listening:\n${log}`));
    proc.on('exit', onExit);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.port) {
        proc.port = Number(m[1]);
        proc.off('exit', onExit);
        resolve({
          proc,
          port: proc.port,
          baseURL: `http://127.0.0.1:${proc.port}/v1`,
          stderr: () => log,
          // SIGTERM; resolves with the exit code.
          stop: () => new Promise((res) => {
            if (proc.exitCode !== null) return res(proc.exitCode);
            proc.once('exit', (code) => res(code));
            proc.kill('SIGTERM');
          }),
        });
      }
    });
  });
}

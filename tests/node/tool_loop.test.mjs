// The Vercel AI SDK's default OpenAI provider (Responses API) through ringgate on translated
// routes: a two-step tool loop (`generateText` with a tool, `stopWhen: stepCountIs(2)`), where
// step 2 sends the assistant's output items as `item_reference`s. The upstream is the project's
// mock (`ringgate mock`) behind an openai-compatible (Chat) and an anthropic provider; every
// test runs against a gateway at each shard count in SHARDS (at two, step 2 may land on another
// shard than step 1). A failing test's error carries its gateway's log. Binary from
// RINGGATE_BIN (default: target/debug/ringgate).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, tool, stepCountIs } from 'ai';
import { z } from 'zod';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.RINGGATE_BIN || join(root, 'target', 'debug', 'ringgate');
// The shard counts each test runs at (as tests/common in the Rust tests).
const SHARDS = [1, 2];
const procs = [];
let dir;
// shard count -> { addr, log() }
const gateways = new Map();

function start(args, env) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, args, {
      env: { ...process.env, XDG_DATA_HOME: dir, ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    procs.push(p);
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`no listening line: ${seen}`)), 20000);
    p.stderr.on('data', (d) => {
      seen += d.toString();
      // Anchored on the whitespace after the port: stderr arrives in chunks, and a chunk may end
      // in the middle of the port number.
      const m = seen.match(/listening on http:\/\/([0-9.]+:[0-9]+)(?=\s)/);
      if (m) {
        clearTimeout(timer);
        resolve({ addr: m[1], log: () => seen });
      }
    });
    p.on('exit', (code) => reject(new Error(`exited ${code}: ${seen}`)));
  });
}

// Run `f(addr)` against the gateway at `shards`; a failure carries that gateway's log.
async function against(shards, f) {
  const gw = gateways.get(shards);
  try {
    await f(gw.addr);
  } catch (e) {
    e.message += `\n--- gateway log (shards = ${shards}):\n${gw.log()}`;
    throw e;
  }
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rg-node-'));
  const mock = (await start(['mock', '--listen', '127.0.0.1:0', '--profile', 'instant'])).addr;
  for (const shards of SHARDS) {
    const cfg = join(dir, `ringgate-${shards}.toml`);
    writeFileSync(cfg, `
[server]
listen = "127.0.0.1:0"
shards = ${shards}

[[provider]]
name = "compat"
kind = "openai-compatible"
base_url = "http://${mock}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://${mock}"

[[model]]
name = "gpt-on-compat"
provider = "compat"
upstream_model = "llama-3"

[[model]]
name = "gpt-on-anthropic"
provider = "an"
upstream_model = "claude-native"
`);
    gateways.set(shards, await start(['--config', cfg]));
  }
});

after(() => {
  for (const p of procs) {
    p.removeAllListeners('exit');
    p.kill('SIGTERM');
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

for (const [shards, model] of SHARDS.flatMap((n) => [[n, 'gpt-on-compat'], [n, 'gpt-on-anthropic']])) {
  test(`two-step tool loop, Responses mode, translated (${model}, shards = ${shards})`, () => against(shards, async (gateway) => {
    const sent = [];
    const openai = createOpenAI({
      baseURL: `http://${gateway}/v1`,
      apiKey: 'sk-node-test',
      fetch: async (url, init) => {
        sent.push({ url: String(url), body: JSON.parse(init.body) });
        return fetch(url, init);
      },
    });
    const calls = [];
    const result = await generateText({
      model: openai(model), // the default provider: the Responses API
      prompt: 'What is the weather in Paris?',
      tools: {
        weather: tool({
          description: 'The weather in a city',
          inputSchema: z.object({ location: z.string(), unit: z.string().optional() }),
          execute: async ({ location }) => {
            calls.push(location);
            return { location, temperature: 20, unit: 'celsius' };
          },
        }),
      },
      stopWhen: stepCountIs(2),
    });
    assert.equal(result.steps.length, 2);
    assert.deepEqual(calls, ['Paris, France']);
    assert.equal(result.steps[0].finishReason, 'tool-calls');
    assert.equal(result.steps[0].toolCalls[0].toolName, 'weather');
    assert.equal(result.steps[1].finishReason, 'stop');
    assert.ok(result.text.length > 0, 'a final text');
    assert.notEqual(result.text, 'Let me check.');
    // both steps went to the Responses endpoint; step 2 referenced step 1's items by id
    assert.equal(sent.length, 2);
    for (const s of sent) assert.match(s.url, /\/v1\/responses$/);
    const refs = sent[1].body.input.filter((i) => i.type === 'item_reference');
    assert.ok(refs.length >= 1, `step 2 sends item references: ${JSON.stringify(sent[1].body.input)}`);
    assert.ok(sent[1].body.input.some((i) => i.type === 'function_call_output'));
  }));
}

for (const shards of SHARDS) {
  test(`an unknown item_reference is a 400 naming the field (shards = ${shards})`, () => against(shards, async (gateway) => {
    const r = await fetch(`http://${gateway}/v1/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-node-test' },
      body: JSON.stringify({
        model: 'gpt-on-compat',
        input: [{ role: 'user', content: 'x' }, { type: 'item_reference', id: 'fc_never' }],
      }),
    });
    assert.equal(r.status, 400);
    const e = (await r.json()).error;
    assert.equal(e.type, 'invalid_request_error');
    assert.equal(e.param, 'input[1].id');
  }));
}

// The official MCP TypeScript SDK (`@modelcontextprotocol/sdk`: Client over
// StreamableHTTPClientTransport) through ringgate's /mcp, against two real MCP servers (the
// Python SDK's FastMCP, tests/mcp/mcp_server.py, run by MCP_PYTHON: default .venv-mcp1), at each
// shard count in SHARDS: federated `server__tool` names, a restricted key's list and its hidden
// call (-32602, the server's counter stays 0), and a session whose requests spread over shards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.RINGGATE_BIN || join(root, 'target', 'debug', 'ringgate');
const PYTHON = process.env.MCP_PYTHON || join(root, '.venv-mcp1', 'bin', 'python');
const SERVER = join(root, 'tests', 'mcp', 'mcp_server.py');
const SHARDS = [1, 2];
const KEYS = { RG_NODE_FULL: 'sk-node-mcp-full-000000000001', RG_NODE_LIMITED: 'sk-node-mcp-limited-00000002' };
const procs = [];
let dir;
const gateways = new Map();
const servers = {};

function startGateway(cfg) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['--config', cfg], {
      env: { ...process.env, XDG_DATA_HOME: dir, ...KEYS },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    procs.push(p);
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`no listening line: ${seen}`)), 20000);
    p.stderr.on('data', (d) => {
      seen += d.toString();
      const m = seen.match(/listening on http:\/\/([0-9.]+:[0-9]+)(?=\s)/);
      if (m) {
        clearTimeout(timer);
        resolve({ addr: m[1], log: () => seen });
      }
    });
    p.on('exit', (code) => reject(new Error(`exited ${code}: ${seen}`)));
  });
}

function startServer(name) {
  return new Promise((resolve, reject) => {
    const p = spawn(PYTHON, [SERVER, name, '0'], { stdio: ['ignore', 'pipe', 'ignore'] });
    procs.push(p);
    const timer = setTimeout(() => reject(new Error(`mcp server ${name} did not start`)), 60000);
    createInterface({ input: p.stdout }).on('line', (line) => {
      const m = line.match(/^PORT (\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ port: Number(m[1]) });
      }
    });
    p.on('exit', (code) => reject(new Error(`mcp server ${name} exited ${code}`)));
  });
}

async function calls(server) {
  for (let i = 0; ; i++) {
    try {
      const r = await fetch(`http://127.0.0.1:${server.port}/calls`);
      return await r.json();
    } catch (e) {
      if (i > 100) throw e;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

async function connect(addr, key) {
  const transport = new StreamableHTTPClientTransport(new URL(`http://${addr}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  const client = new Client({ name: 'ringgate-node-test', version: '1.0.0' });
  await client.connect(transport);
  return client;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rg-node-mcp-'));
  servers.alpha = await startServer('alpha');
  servers.beta = await startServer('beta');
  await calls(servers.alpha);
  await calls(servers.beta);
  for (const shards of SHARDS) {
    const cfg = join(dir, `ringgate-${shards}.toml`);
    writeFileSync(cfg, `
[server]
listen = "127.0.0.1:0"
shards = ${shards}

[[key]]
name = "full"
key_env = "RG_NODE_FULL"

[[key]]
name = "limited"
key_env = "RG_NODE_LIMITED"
mcp_tools = ["beta__echo", "alpha__a*"]

[[mcp_server]]
name = "alpha"
url = "http://127.0.0.1:${servers.alpha.port}/mcp"

[[mcp_server]]
name = "beta"
url = "http://127.0.0.1:${servers.beta.port}/mcp"
`);
    gateways.set(shards, await startGateway(cfg));
  }
});

after(() => {
  for (const p of procs) {
    p.removeAllListeners('exit');
    p.kill('SIGTERM');
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function against(shards, f) {
  const gw = gateways.get(shards);
  try {
    await f(gw.addr);
  } catch (e) {
    e.message += `\n--- gateway log (shards = ${shards}):\n${gw.log()}`;
    throw e;
  }
}

for (const shards of SHARDS) {
  test(`federated tools with the TypeScript SDK (shards = ${shards})`, () => against(shards, async (gw) => {
    const client = await connect(gw, KEYS.RG_NODE_FULL);
    try {
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name).sort();
      for (const p of ['alpha', 'beta']) {
        for (const t of ['add', 'echo', 'secret']) assert.ok(names.includes(`${p}__${t}`), names.join());
      }
      // a session's calls come on new connections: at two shards they land on both
      for (let i = 0; i < 6; i++) {
        const r = await client.callTool({ name: i % 2 ? 'beta__add' : 'alpha__add', arguments: { a: i, b: 1 } });
        assert.equal(r.content[0].text, String(i + 1));
      }
    } finally {
      await client.close();
    }
  }));

  test(`restricted key with the TypeScript SDK (shards = ${shards})`, () => against(shards, async (gw) => {
    const before = (await calls(servers.alpha)).secret ?? 0;
    const client = await connect(gw, KEYS.RG_NODE_LIMITED);
    try {
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), ['alpha__add', 'beta__echo']);
      const r = await client.callTool({ name: 'beta__echo', arguments: { text: 'ts' } });
      assert.equal(r.content[0].text, 'beta:ts');
      await assert.rejects(
        client.callTool({ name: 'alpha__secret', arguments: {} }),
        (e) => e.code === -32602,
      );
    } finally {
      await client.close();
    }
    assert.equal((await calls(servers.alpha)).secret ?? 0, before);
  }));
}

// The status page (`GET /admin/` on the admin listener) in a real headless browser: Debian's
// chromium driven by playwright-core. The page loads without the token and shows nothing but
// the token form; a wrong token is refused; with the right one it shows a key created through
// the admin API (with its budget) and a model's two deployments with their breaker state.
// Every request the page makes is watched: the token goes only in an `Authorization: Bearer`
// header, never in a URL, and no cookie is set. Runs against a gateway at each shard count.
// With RG_STATUS_SCREENSHOT=<path> it also writes a screenshot (docs/status-page.png).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.RINGGATE_BIN || join(root, 'target', 'debug', 'ringgate');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHARDS = [1, 2];
const TOKEN = 'status-page-token-5d4c3b2a1f0e';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const procs = [];
let dir;

function start(args, env) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, args, {
      env: { ...process.env, XDG_DATA_HOME: dir, ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    procs.push(p);
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`no listening lines: ${seen}`)), 20000);
    p.stderr.on('data', (d) => {
      seen += d.toString();
      const admin = seen.match(/admin listening on http:\/\/([0-9.]+:[0-9]+)(?=\s)/);
      if (admin) {
        clearTimeout(timer);
        resolve({ admin: admin[1], log: () => seen });
      }
    });
    p.on('exit', (code) => reject(new Error(`exited ${code}: ${seen}`)));
  });
}

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rg-status-page-'));
  if (!existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} not found: apt-get install chromium (.ci/run does)`);
  }
});

after(() => {
  for (const p of procs) p.kill();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function admin(addr, method, path, body) {
  const r = await fetch(`http://${addr}${path}`, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
  return JSON.parse(text);
}

for (const shards of SHARDS) {
  test(`status page in headless chromium (${shards} shard(s))`, { timeout: 120000 }, async () => {
    const cfg = join(dir, `gw-${shards}.toml`);
    writeFileSync(cfg, `
[server]
listen = "127.0.0.1:0"
shards = ${shards}

[admin]
listen = "127.0.0.1:0"

[[provider]]
name = "sim-a"
kind = "mock"

[[provider]]
name = "sim-b"
kind = "mock"

[[model]]
name = "page-model"
deployments = [
  { provider = "sim-a", upstream_model = "alpha" },
  { provider = "sim-b", upstream_model = "beta" },
]
`);
    const gw = await start(['--config', cfg], { RINGGATE_ADMIN_TOKEN: TOKEN });
    await admin(gw.admin, 'POST', '/admin/keys',
      { name: 'page-key', budget_usd: 2.5, budget_period: 'day' });

    const profile = mkdtempSync(join(dir, 'chromium-'));
    const ctx = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM, headless: true, args: FLAGS,
      viewport: { width: 1280, height: 900 },
    });
    try {
      const page = ctx.pages()[0] || await ctx.newPage();
      const seen = [];
      page.on('request', (r) => seen.push({ url: r.url(), auth: r.headers().authorization }));
      const errors = [];
      page.on('pageerror', (e) => errors.push(String(e)));
      const resp = await page.goto(`http://${gw.admin}/admin/`);
      assert.equal(resp.status(), 200);
      assert.match(resp.headers()['content-type'], /text\/html/);
      assert.match(resp.headers()['content-security-policy'], /default-src 'none'/);
      // it asks for the token, and shows nothing else yet
      assert.ok(await page.isVisible('#token'));
      assert.ok(await page.isHidden('#app'));

      // a wrong token is refused
      await page.fill('#token', 'not-the-token-at-all');
      await page.click('#connect');
      await page.waitForFunction(() => document.getElementById('error').textContent.includes('refused'));
      assert.ok(await page.isHidden('#app'));

      // the right one: the key and the model's deployments appear
      await page.fill('#token', TOKEN);
      await page.click('#connect');
      await page.waitForFunction(() => document.getElementById('keys').textContent.includes('page-key'),
        null, { timeout: 30000 });
      await page.waitForFunction(() => document.getElementById('models').textContent.includes('sim-b/beta'),
        null, { timeout: 30000 });
      const models = await page.textContent('#models');
      assert.match(models, /page-model/);
      assert.match(models, /sim-a\/alpha/);
      assert.match(models, /closed/);
      const keys = await page.textContent('#keys');
      assert.match(keys, /\$2\.5000 \/ day/);
      assert.match(await page.textContent('#memory'), /admission budget/);
      // a second refresh computes rates
      await page.waitForFunction(() => /\/s$/.test(document.querySelector('#traffic .tile b').textContent),
        null, { timeout: 30000 });

      // the token only ever went as a Bearer header, never in a URL; no cookie
      assert.ok(seen.some((r) => r.url.endsWith('/admin/keys?limit=1000') && r.auth === `Bearer ${TOKEN}`));
      assert.ok(seen.every((r) => !r.url.includes(TOKEN)), JSON.stringify(seen));
      assert.deepEqual(await ctx.cookies(), []);
      // no request left the admin listener (the page is self-contained)
      assert.ok(seen.every((r) => r.url.startsWith(`http://${gw.admin}/`)), JSON.stringify(seen));
      assert.deepEqual(errors, []);

      if (process.env.RG_STATUS_SCREENSHOT && shards === 1) {
        await page.screenshot({ path: process.env.RG_STATUS_SCREENSHOT, fullPage: true });
      }
    } catch (e) {
      e.message += `\n--- gateway log:\n${gw.log()}`;
      throw e;
    } finally {
      await ctx.close();
    }
  });
}

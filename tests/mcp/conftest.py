"""Fixtures for the MCP gateway suite: real MCP servers (the official Python SDK's FastMCP /
MCPServer over Streamable HTTP, `mcp_server.py`) and a ringgate gateway in front of them, all
on 127.0.0.1 port 0, the gateway at 1 and at 2 shards. Clients are the official SDK of the
venv running the suite: `mcp` 1.x (`streamablehttp_client` + `ClientSession`) or 2.x
(`streamable_http_client` + `ClientSession` over httpx2); `connect` hides the difference.

Every process is stopped by the fixture that started it (by its own Popen handle)."""

import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("RINGGATE_BIN") or os.path.join(ROOT, "target", "debug", "ringgate")
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcp_server.py")
MAIN_RE = re.compile(r" listening on http://([0-9.:]+)")
ADMIN_RE = re.compile(r"admin listening on http://([0-9.:]+)")
SDK_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
ADMIN_TOKEN = "mcp-admin-token-0123456789abcdef"

KEYS = {
    "RG_MCP_FULL": "sk-mcp-full-0001",
    "RG_MCP_LIMITED": "sk-mcp-limited-0002",
    "RG_MCP_RPM": "sk-mcp-rpm-0003",
}
UPSTREAM_TOKENS = {"RG_ALPHA_TOKEN": "alpha-upstream-secret", "RG_BETA_TOKEN": "beta-upstream-secret"}

if SDK_MAJOR >= 2:
    import httpx2 as httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError as McpError
else:
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    from mcp.shared.exceptions import McpError

LOGS = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, lines in LOGS:
            if lines:
                report.sections.append((f"log: {name}", "".join(lines[-200:])))


def _drain(pipe, lines):
    for line in pipe:
        lines.append(line)


class McpServer:
    """One `mcp_server.py` process; `kill()` and `start()` keep its port."""

    def __init__(self, name, json_response=False, uds=None):
        self.name, self.port, self.proc = name, 0, None
        self.json = json_response
        self.uds = uds  # also served on this Unix socket path
        self.start()

    def start(self):
        args = [sys.executable, SERVER, self.name, str(self.port)] + (["--json"] if self.json else [])
        args += ["--uds", self.uds] if self.uds else []
        deadline = time.time() + 60
        while True:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline()
            if line.startswith("PORT "):
                break
            self.proc.wait()
            if time.time() > deadline:
                raise RuntimeError(f"mcp server {self.name} did not start: {self.proc.stderr.read()}")
            time.sleep(0.5)  # the old port may still be held for a moment after a kill
        self.port = int(line.split()[1])
        lines = []
        LOGS.append((f"mcp server {self.name} pid {self.proc.pid}", lines))
        threading.Thread(target=_drain, args=(self.proc.stderr, lines), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        # ready when it answers HTTP
        while time.time() < deadline:
            try:
                self.get("/calls")
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"mcp server {self.name} does not answer")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def calls(self):
        return self.get("/calls")

    def seen(self):
        return self.get("/seen")


def server_block(s, extra=""):
    return f"""
[[mcp_server]]
name = "{s.name}"
url = "http://127.0.0.1:{s.port}/mcp"
timeout_ms = 4000
{extra}
"""


def gateway_config(shards, servers, state, access_log, extra=""):
    alpha, beta = servers
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}
state_dir = "{state}"

[admin]
listen = "127.0.0.1:0"

[log]
access = "{access_log}"

[reload]
allow_empty = true

[[key]]
name = "full"
key_env = "RG_MCP_FULL"

[[key]]
name = "limited"
key_env = "RG_MCP_LIMITED"
mcp_tools = ["alpha__echo", "alpha__add", "beta__b*"]

[[key]]
name = "rpm"
key_env = "RG_MCP_RPM"
rpm = 4
{server_block(alpha, 'bearer_env = "RG_ALPHA_TOKEN"')}
{server_block(beta, 'bearer_env = "RG_BETA_TOKEN"' + chr(10) + 'headers = { "X-Tenant" = "acme" }')}
{extra}"""


class Gateway:
    def __init__(self, cfg_text, state):
        self.state = state
        self.path = os.path.join(state, "ringgate.toml")
        self.write(cfg_text)
        env = dict(os.environ, RINGGATE_ADMIN_TOKEN=ADMIN_TOKEN, XDG_DATA_HOME=state, **KEYS, **UPSTREAM_TOKENS)
        self.proc = subprocess.Popen([BIN, "--config", self.path], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True, env=env)
        lines = []
        self.main = self.admin = None
        deadline = time.time() + 30
        while time.time() < deadline and (self.main is None or self.admin is None):
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if m := ADMIN_RE.search(line):
                self.admin = "http://" + m.group(1)
            elif m := MAIN_RE.search(line):
                self.main = "http://" + m.group(1)
        if self.main is None or self.admin is None:
            self.proc.kill()
            raise RuntimeError("ringgate did not start: " + "".join(lines))
        LOGS.append((f"ringgate pid {self.proc.pid}", lines))
        threading.Thread(target=_drain, args=(self.proc.stderr, lines), daemon=True).start()
        self.url = self.main + "/mcp"

    def write(self, text):
        with open(self.path, "w") as f:
            f.write(text)

    def admin_call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.admin + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metrics(self):
        req = urllib.request.Request(self.admin + "/metrics")
        req.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read().decode()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=[1, 2], scope="module", ids=lambda n: f"{n}shard" + "s" * (n > 1))
def shards(request):
    return request.param


@pytest.fixture(scope="module")
def servers():
    alpha = McpServer("alpha")
    beta = McpServer("beta", json_response=True)
    yield alpha, beta
    for s in (alpha, beta):
        s.kill()


@pytest.fixture(scope="module")
def gateway(servers, shards):
    state = tempfile.mkdtemp(prefix="rg-mcp-")
    log = os.path.join(state, "access.log")
    gw = Gateway(gateway_config(shards, servers, state, log), state)
    gw.access_log = log
    gw.servers = servers
    gw.shards = shards
    yield gw
    gw.stop()


@contextlib.asynccontextmanager
async def connect(url, key=None, headers=None, timeout=30):
    """An initialised official-SDK ClientSession on `url`, authenticating with `key`."""
    h = dict(headers or {})
    if key:
        h["Authorization"] = f"Bearer {key}"
    if SDK_MAJOR >= 2:
        client = httpx.AsyncClient(headers=h, timeout=httpx.Timeout(timeout, read=timeout))
        async with client:
            async with streamable_http_client(url, http_client=client) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    yield s
    else:
        async with streamablehttp_client(url, headers=h, timeout=timeout) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                yield s


def raw(url, body, key=None, headers=None, method="POST"):
    """One plain HTTP request to the gateway: (status, headers, body bytes)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}},
}


def raw_session(url, key):
    status, headers, _ = raw(url, INIT, key)
    assert status == 200, status
    return headers["mcp-session-id"]

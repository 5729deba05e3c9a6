"""Fixtures: start `ringgate mock` and `ringgate` (the release or debug binary) on 127.0.0.1
port 0, under each I/O driver and at each shard count (`shards`: 1 and 2; a gateway fixture
writes `shards = {shards}` into its config), and hand the tests their base URLs.

A spawned process's stderr is read to its end and kept: a passing test's gateway log is not
shown, a failing test's report has what every running process logged during that test."""

import os
import re
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("RINGGATE_BIN") or os.path.join(ROOT, "target", "debug", "ringgate")
LISTEN_RE = re.compile(r"listening on http://([0-9.:]+)")

# The shard counts every gateway fixture runs at (as tests/common in the Rust tests): one, and
# two so that connections, and the state a request finds, spread over shards.
SHARDS = [1, 2]


def one_shard(why):
    """Mark a test that needs exactly one shard; `why` says why (shown in its id). Sparingly:
    state that is wrong at two shards is a bug to fix, not a reason to test one."""
    return pytest.mark.parametrize("shards", [1], indirect=True, ids=[f"1shard-only({why})"])


# (name, lines) of every process spawned: its stderr, read to the end by a thread (which also
# keeps the process from blocking on a full pipe).
LOGS = []


def drain(pipe, lines):
    for line in pipe:
        lines.append(line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.rg_log_marks = {id(lines): len(lines) for _, lines in LOGS}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report gets what each process logged while the test ran."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        marks = getattr(item, "rg_log_marks", {})
        for name, lines in LOGS:
            new = lines[marks.get(id(lines), 0):]
            if new:
                report.sections.append((f"ringgate log: {name}", "".join(new)))


def spawn(args, env=None):
    """Start a ringgate process and wait for its 'listening on' line; return (proc, addr)."""
    full_env = dict(os.environ)
    # the binary keeps state under $XDG_DATA_HOME/ringgate by default: one fresh dir per process
    full_env["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="rg-sdk-state-")
    full_env.update(env or {})
    proc = subprocess.Popen(
        [BIN, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=full_env
    )
    deadline = time.time() + 20
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = LISTEN_RE.search(line)
        if m:
            LOGS.append((f"pid {proc.pid}: {' '.join(args)}", lines))
            threading.Thread(target=drain, args=(proc.stderr, lines), daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError("ringgate did not start: " + "".join(lines))


def stop(proc):
    LOGS[:] = [(n, lines) for n, lines in LOGS if not n.startswith(f"pid {proc.pid}:")]
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


def serve_config(cfg, env):
    """Run the gateway on a config text; yield its base URL; stop it afterwards."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(cfg)
        path = f.name
    proc, addr = spawn(["--config", path], env)
    try:
        yield f"http://{addr}"
    finally:
        stop(proc)
        os.unlink(path)


@pytest.fixture(params=["io_uring", "epoll"], scope="module")
def driver(request):
    return request.param


@pytest.fixture(params=SHARDS, scope="module", ids=lambda n: f"{n}shard" + "s" * (n > 1))
def shards(request):
    return request.param


@pytest.fixture(scope="module")
def mock(driver):
    proc, addr = spawn(["mock", "--listen", "127.0.0.1:0", "--profile", "instant"],
                       {"RINGGATE_DRIVER": driver})
    yield addr
    stop(proc)


@pytest.fixture(scope="module")
def gateway(mock, driver, shards):
    """The issue's contract config, pointed at the mock, listening on port 0."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"
api_key_env = "LOCAL_API_KEY"

[[model]]
name = "gpt-4o-mini"
provider = "local"
upstream_model = "gpt-4o-mini"
"""
    yield from serve_config(cfg, {"RINGGATE_DRIVER": driver, "LOCAL_API_KEY": "sk-test"})


@pytest.fixture(scope="module")
def embedded():
    """The bare `ringgate` (embedded default) on a free port."""
    proc, addr = spawn(["--listen", "127.0.0.1:0"])
    yield f"http://{addr}"
    stop(proc)


@pytest.fixture(scope="module")
def multi(mock, driver, shards):
    """One gateway with every provider kind pointed at the same mock, so each (client SDK ×
    upstream dialect) pair can be driven through it."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "oa"
kind = "openai"
base_url = "http://{mock}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{mock}"
api_key_env = "RG_TEST_ANTHROPIC_KEY"

[[provider]]
name = "gm"
kind = "gemini"
base_url = "http://{mock}"

[[provider]]
name = "compat"
kind = "openai-compatible"
base_url = "http://{mock}/v1"

[[provider]]
name = "az"
kind = "azure"
base_url = "http://{mock}"
api_key_env = "RG_TEST_AZURE_KEY"
api_version = "2024-10-21"

[[model]]
name = "gpt-4o-mini"
provider = "oa"

[[model]]
name = "gpt-on-azure"
provider = "az"
upstream_model = "my-deployment"

[[model]]
name = "claude-on-azure"
provider = "az"
upstream_model = "my-deployment"

[[model]]
name = "claude-on-openai"
provider = "oa"
upstream_model = "gpt-4o-mini"

[[model]]
name = "gpt-on-anthropic"
provider = "an"
upstream_model = "claude-native"

[[model]]
name = "claude-native"
provider = "an"

[[model]]
name = "gpt-on-gemini"
provider = "gm"
upstream_model = "gemini-2.0-flash"

[[model]]
name = "claude-on-compat"
provider = "compat"
upstream_model = "llama-3"
"""
    yield from serve_config(cfg, {"RINGGATE_DRIVER": driver, "RG_TEST_ANTHROPIC_KEY": "sk-ant-test",
                                  "RG_TEST_AZURE_KEY": "az-test"})

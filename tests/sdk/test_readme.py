"""The README's quick start, as written: its `curl` block and its openai / anthropic / google-genai
snippets are taken out of README.md and run against the bare `ringgate` (the built-in default:
model `mock`, no config), with only `127.0.0.1:8080` / `localhost:8080` replaced by the test
gateway's address. So the `base_url` each snippet states is the one that works, and a README edit
that breaks a snippet fails here."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, spawn, stop

README = os.path.join(ROOT, "README.md")
MOCK_WORDS = ["the", "gate", "ring", "fast", "core"]  # the mock provider's fixed answer begins so
CTOR = {"openai": "OpenAI(", "anthropic": "anthropic.Anthropic(", "google-genai": "genai.Client("}


def blocks(lang):
    text = open(README, encoding="utf-8").read()
    return re.findall(r"^```" + lang + r"\n(.*?)^```$", text, re.S | re.M)


def snippet(sdk):
    found = [b for b in blocks("python") if CTOR[sdk] in b]
    assert len(found) == 1, f"README.md: one ```python snippet with {CTOR[sdk]}, found {len(found)}"
    return found[0]


def curl_commands():
    """Each command of the README's curl block (continuation lines joined)."""
    for b in blocks("sh"):
        cmds = [c.strip() for c in b.replace("\\\n", " ").splitlines() if c.strip()]
        if cmds and all(c.startswith("curl ") for c in cmds):
            return cmds
    raise AssertionError("README.md has no ```sh block of curl commands")


def words(text):
    return re.findall(r"[a-z]+", text)


@pytest.fixture(scope="module")
def bare(driver, shards):
    """`ringgate` with no config (what `cargo run --release` starts), on a free port."""
    saved = os.environ.pop("RINGGATE_CONFIG", None)
    try:
        proc, addr = spawn(["--listen", "127.0.0.1:0", "--shards", str(shards)],
                           {"RINGGATE_DRIVER": driver})
    finally:
        if saved is not None:
            os.environ["RINGGATE_CONFIG"] = saved
    yield addr
    stop(proc)


def test_readme_base_urls_are_the_ones_the_sdk_tests_use():
    """The table's base_url per SDK is the form tests/sdk uses (`/v1` for openai only), and each
    snippet states the same one."""
    text = open(README, encoding="utf-8").read()
    table = dict(re.findall(r"^\| `([a-z-]+)`[^|]*\| `(http://[^`]+)`", text, re.M))
    assert table == {
        "openai": "http://127.0.0.1:8080/v1",
        "anthropic": "http://127.0.0.1:8080",
        "google-genai": "http://127.0.0.1:8080",
    }, table
    for sdk, url in table.items():
        assert f'"{url}"' in snippet(sdk), (sdk, url)


@pytest.mark.parametrize("sdk", list(CTOR))
def test_readme_sdk_snippet_runs(bare, sdk):
    code = snippet(sdk).replace("127.0.0.1:8080", bare)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert lines and all(words(l)[:5] == MOCK_WORDS for l in lines), r.stdout


def test_readme_curl_block_runs(bare):
    cmds = curl_commands()
    assert len(cmds) >= 4, cmds
    for cmd in cmds:
        # -f: an HTTP error status fails the command
        run = cmd.replace("localhost:8080", bare).replace("curl ", "curl -f --max-time 30 ", 1)
        r = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (cmd, r.stderr)
        if '"stream":true' in cmd:
            assert r.stdout.startswith("data: ") and "data: [DONE]" in r.stdout, r.stdout[-300:]
            text = "".join(re.findall(r'"content":"([^"]*)"', r.stdout))
        else:
            text = r.stdout.split('"text":"', 1)[-1] if '"text":"' in r.stdout else \
                r.stdout.split('"content":"', 1)[-1]
        assert words(text)[:5] == MOCK_WORDS, (cmd, r.stdout[:500])

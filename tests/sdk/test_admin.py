"""The key admin API with the official `openai` SDK: a key made through the admin listener works
at once, a patched allow-list is enforced, a revoked key gets AuthenticationError."""

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import BIN, stop

TOKEN = "rg-sdk-admin-token-0f1e2d3c4b5a69788796a5b4"
ADMIN_RE = re.compile(r"admin listening on http://([0-9.:]+)")
MAIN_RE = re.compile(r" listening on http://([0-9.:]+)")


@pytest.fixture(scope="module")
def admin_gw(driver):
    state = tempfile.mkdtemp(prefix="rg-sdk-admin-")
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = 2
state_dir = "{state}"

[admin]
listen = "127.0.0.1:0"

[[provider]]
name = "mock"
kind = "mock"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

[[model]]
name = "other-model"
provider = "mock"
"""
    path = os.path.join(state, "ringgate.toml")
    with open(path, "w") as f:
        f.write(cfg)
    env = dict(os.environ, RINGGATE_DRIVER=driver, RINGGATE_ADMIN_TOKEN=TOKEN)
    proc = subprocess.Popen([BIN, "--config", path], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    main = admin = None
    deadline = time.time() + 20
    while time.time() < deadline and admin is None:
        line = proc.stderr.readline()
        if not line:
            break
        m = ADMIN_RE.search(line)
        if m:
            admin = m.group(1)
            continue
        m = MAIN_RE.search(line)
        if m:
            main = m.group(1)
    if admin is None:
        proc.kill()
        raise RuntimeError("ringgate did not start")
    yield f"http://{main}", f"http://{admin}"
    stop(proc)


def call(admin, method, path, body=None, token=TOKEN):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(admin + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def client(main, key):
    return openai.OpenAI(base_url=main + "/v1", api_key=key, max_retries=0, timeout=10)


def chat(c, model="gpt-4o-mini"):
    return c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def test_admin_needs_the_token(admin_gw):
    _, admin = admin_gw
    status, body = call(admin, "GET", "/admin/keys", token=None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_key_made_at_runtime_works_at_once_then_patch_and_revoke(admin_gw):
    main, admin = admin_gw
    status, made = call(admin, "POST", "/admin/keys",
                        {"name": "sdk-team", "models": ["gpt-4o-mini"], "rpm": 1000})
    assert status == 201, made
    secret = made["key"]
    assert secret.startswith("rg-")
    c = client(main, secret)
    for _ in range(4):  # fresh connections may land on either shard
        assert chat(c).choices[0].message.content
    status, listed = call(admin, "GET", "/admin/keys")
    assert status == 200 and secret not in json.dumps(listed)
    assert [k["name"] for k in listed["keys"]] == ["sdk-team"]
    with pytest.raises(openai.PermissionDeniedError):
        chat(c, model="other-model")
    status, _ = call(admin, "PATCH", "/admin/keys/sdk-team", {"models": ["other-model"]})
    assert status == 200
    assert chat(c, model="other-model").choices[0].message.content
    status, _ = call(admin, "DELETE", "/admin/keys/sdk-team")
    assert status == 200
    with pytest.raises(openai.AuthenticationError):
        chat(c, model="other-model")
    with pytest.raises(openai.AuthenticationError):
        chat(client(main, "rg-made-up"))


def test_listing_pages_walk_every_key_once(admin_gw):
    main, admin = admin_gw
    names = [f"page-{i:03d}" for i in range(250)]
    secrets = {}
    for n in names:
        status, made = call(admin, "POST", "/admin/keys", {"name": n})
        assert status == 201, made
        secrets[n] = made["key"]
    seen, after, pages = [], None, 0
    while True:
        status, page = call(admin, "GET", "/admin/keys?limit=100" + (f"&after={after}" if after else ""))
        assert status == 200, page
        seen += [k["name"] for k in page["keys"]]
        pages += 1
        if not page["has_more"]:
            assert page["next_after"] is None
            break
        after = page["next_after"]
        assert after == page["keys"][-1]["name"]
    assert len(seen) == len(set(seen)), "each key once"
    assert [n for n in seen if n.startswith("page-")] == names and pages == 3
    status, page = call(admin, "GET", "/admin/keys")
    assert status == 200 and len(page["keys"]) == 100 and page["has_more"]
    for bad in ["limit=0", "limit=1001", "after=nobody"]:
        status, body = call(admin, "GET", "/admin/keys?" + bad)
        assert status == 400 and body["error"]["message"], bad
    # a key from the middle of the walk works through the SDK (fresh connections: either shard)
    c = client(main, secrets["page-125"])
    for _ in range(4):
        assert chat(c).choices[0].message.content
    for n in names:
        assert call(admin, "DELETE", f"/admin/keys/{n}")[0] == 200

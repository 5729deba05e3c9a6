"""The MCP gateway (issue 25) with the official MCP SDK as client (1.x or 2.x: whichever this
venv has, see conftest) against two real FastMCP servers, at 1 and 2 shards."""

import asyncio
import json
import os
import re
import tempfile
import time

import pytest

from conftest import (KEYS, SDK_MAJOR, UPSTREAM_TOKENS, Gateway, McpError, McpServer, connect,
                      gateway_config, raw, raw_session, server_block, INIT)

FULL, LIMITED, RPM = KEYS["RG_MCP_FULL"], KEYS["RG_MCP_LIMITED"], KEYS["RG_MCP_RPM"]
TOOLS = ["echo", "add", "big", "slow", "secret"]


def run(coro):
    return asyncio.run(coro)


def is_error(result):
    # 1.x names fields as the protocol does, 2.x in snake case
    return getattr(result, "isError", None) or getattr(result, "is_error", False)


def schema(tool):
    return getattr(tool, "inputSchema", None) or tool.input_schema


def text(result):
    assert not is_error(result), result
    return result.content[0].text


def test_two_servers_are_federated_with_prefixed_names(gateway):
    async def go():
        async with connect(gateway.url, FULL) as s:
            listed = await s.list_tools()
            names = sorted(t.name for t in listed.tools)
            assert names == sorted(f"{p}__{t}" for p in ("alpha", "beta") for t in TOOLS)
            add = next(t for t in listed.tools if t.name == "beta__add")
            # input schemas unchanged
            assert set(schema(add)["properties"]) == {"a", "b"}
            assert text(await s.call_tool("alpha__echo", {"text": "hi"})) == "alpha:hi"
            assert text(await s.call_tool("beta__echo", {"text": "yo"})) == "beta:yo"
            assert text(await s.call_tool("beta__add", {"a": 2, "b": 40})) == "42"

    run(go())


def test_restricted_key_lists_exactly_its_tools_and_hidden_calls_never_reach_a_server(gateway):
    alpha, beta = gateway.servers
    before = (alpha.calls().get("secret", 0), beta.calls().get("slow", 0), beta.calls().get("echo", 0))

    async def go():
        async with connect(gateway.url, LIMITED) as s:
            names = sorted(t.name for t in (await s.list_tools()).tools)
            assert names == ["alpha__add", "alpha__echo", "beta__big"]
            assert text(await s.call_tool("alpha__add", {"a": 1, "b": 2})) == "3"
            for hidden in ["alpha__secret", "beta__slow", "beta__echo", "gamma__echo", "nonsense", ""]:
                with pytest.raises(McpError) as e:
                    await s.call_tool(hidden, {"seconds": 0, "text": "x"})
                assert e.value.error.code == -32602, hidden

    run(go())
    after = (alpha.calls().get("secret", 0), beta.calls().get("slow", 0), beta.calls().get("echo", 0))
    assert after == before


def test_upstream_sees_its_configured_bearer_never_the_clients_key(gateway):
    alpha, beta = gateway.servers

    async def go():
        async with connect(gateway.url, FULL, headers={"X-Tenant": "evil"}) as s:
            await s.call_tool("alpha__echo", {"text": "a"})
            await s.call_tool("beta__echo", {"text": "b"})

    run(go())
    for server, token, tenant in ((alpha, UPSTREAM_TOKENS["RG_ALPHA_TOKEN"], None),
                                  (beta, UPSTREAM_TOKENS["RG_BETA_TOKEN"], "acme")):
        seen = server.seen()
        assert seen, server.name
        for h in seen:
            assert h["authorization"] == f"Bearer {token}", h
            assert h["x-tenant"] == tenant, h
        blob = json.dumps(seen)
        for key in KEYS.values():
            assert key not in blob


def test_no_key_is_401_foreign_origin_403_and_rpm_429(gateway):
    status, _, body = raw(gateway.url, INIT)
    assert status == 401, body
    status, _, body = raw(gateway.url, INIT, "sk-not-a-key")
    assert status == 401, body
    status, _, _ = raw(gateway.url, INIT, FULL, {"Origin": "https://evil.example"})
    assert status == 403
    # rpm = 4: the initialize and three calls fit, the next call is refused with 429
    sid = raw_session(gateway.url, RPM)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "alpha__add", "arguments": {"a": 1, "b": 1}}}
    h = {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
    statuses = [raw(gateway.url, call, RPM, h)[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    status, headers, _ = raw(gateway.url, call, RPM, h)
    assert status == 429
    assert int(headers["retry-after"]) >= 1


def test_sdk_without_a_key_cannot_connect(gateway):
    async def go():
        async with connect(gateway.url, None, timeout=10) as s:
            await s.list_tools()

    with pytest.raises(BaseException):
        run(asyncio.wait_for(go(), 60))


def test_sessions_are_per_key_and_end_with_delete(gateway):
    sid = raw_session(gateway.url, FULL)
    ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    h = {"Mcp-Session-Id": sid}
    assert raw(gateway.url, ping, FULL, h)[0] == 200
    # another key does not find it
    assert raw(gateway.url, ping, LIMITED, h)[0] == 404
    assert raw(gateway.url, ping, FULL)[0] == 400
    assert raw(gateway.url, None, FULL, h, method="DELETE")[0] == 200
    assert raw(gateway.url, ping, FULL, h)[0] == 404
    assert raw(gateway.url, None, FULL, h, method="GET")[0] == 405


def test_a_one_mib_tool_result_passes(gateway):
    async def go():
        async with connect(gateway.url, FULL) as s:
            for tool in ("alpha__big", "beta__big"):
                r = await s.call_tool(tool, {"n": 1 << 20})
                assert len(text(r)) == 1 << 20

    run(go())


def test_many_concurrent_sessions(gateway):
    """100 sessions open at once, 10 calls each over both servers. The test servers are
    single-process Python: calls in flight are capped (the sessions are all open throughout)."""
    sessions, calls = 100, 10
    opened = 0
    all_open = asyncio.Event()

    async def one(i, in_flight):
        nonlocal opened
        async with connect(gateway.url, FULL, timeout=120) as s:
            opened += 1
            if opened == sessions:
                all_open.set()
            await asyncio.wait_for(all_open.wait(), 300)
            for j in range(calls):
                server = ("alpha", "beta")[(i + j) % 2]
                async with in_flight:
                    r = await s.call_tool(f"{server}__add", {"a": i, "b": j})
                assert text(r) == str(i + j)
        return calls

    async def go():
        in_flight = asyncio.Semaphore(8)
        return await asyncio.gather(*(one(i, in_flight) for i in range(sessions)))

    assert sum(run(go())) == sessions * calls


def test_access_log_and_metrics_name_server_tool_and_result(gateway):
    async def go():
        async with connect(gateway.url, LIMITED) as s:
            await s.call_tool("alpha__echo", {"text": "logged"})
            with pytest.raises(McpError):
                await s.call_tool("alpha__secret", {})

    run(go())
    deadline = time.time() + 30
    lines = []
    while time.time() < deadline:
        with open(gateway.access_log) as f:
            lines = [json.loads(l) for l in f if '"mcp_method"' in l]
        ok = [l for l in lines if l.get("mcp_tool") == "echo" and l["key"] == "limited"]
        denied = [l for l in lines if l.get("mcp_tool") == "alpha__secret"]
        if ok and denied:
            break
        time.sleep(0.5)
    assert ok and denied, lines[-5:]
    assert ok[-1]["mcp_server"] == "alpha" and ok[-1]["mcp_result"] == "ok"
    assert ok[-1]["endpoint"] == "mcp" and ok[-1]["request_id"]
    assert ok[-1]["latency_ms"] is not None
    assert denied[-1]["mcp_server"] is None and denied[-1]["mcp_result"] == "denied"
    m = gateway.metrics()
    ok_n = re.search(r'ringgate_mcp_requests_total\{server="alpha",method="tools/call",result="ok"\} (\d+)', m)
    assert ok_n and int(ok_n.group(1)) >= 1, m
    assert re.search(r'ringgate_mcp_requests_total\{server="-",method="tools/call",result="denied"\} [1-9]', m)
    assert 'ringgate_mcp_request_duration_seconds_count{server="alpha"}' in m
    assert re.search(r"ringgate_mcp_sessions \d+", m)


def test_admin_api_sets_and_clears_mcp_tools(gateway):
    status, made = gateway.admin_call("POST", "/admin/keys", {"name": "runtime-mcp", "mcp_tools": ["beta__echo"]})
    assert status in (200, 201), made
    assert made["mcp_tools"] == ["beta__echo"]
    secret = made["key"]

    async def names():
        async with connect(gateway.url, secret) as s:
            return sorted(t.name for t in (await s.list_tools()).tools)

    assert run(names()) == ["beta__echo"]
    status, patched = gateway.admin_call("PATCH", "/admin/keys/runtime-mcp", {"mcp_tools": None})
    assert status == 200 and patched["mcp_tools"] is None, patched
    assert len(run(names())) == 2 * len(TOOLS)
    status, patched = gateway.admin_call("PATCH", "/admin/keys/runtime-mcp", {"mcp_tools": []})
    assert status == 200 and patched["mcp_tools"] == []
    assert run(names()) == []
    status, bad = gateway.admin_call("PATCH", "/admin/keys/runtime-mcp", {"mcp_tools": "x"})
    assert status == 400, bad


def test_a_key_changed_at_runtime_applies_to_the_open_session(gateway):
    status, made = gateway.admin_call("POST", "/admin/keys", {"name": "shrinking"})
    assert status in (200, 201), made

    async def go():
        async with connect(gateway.url, made["key"]) as s:
            assert text(await s.call_tool("alpha__echo", {"text": "1"})) == "alpha:1"
            status, _ = gateway.admin_call("PATCH", "/admin/keys/shrinking", {"mcp_tools": ["beta__*"]})
            assert status == 200
            deadline = time.time() + 30
            while True:
                try:
                    await s.call_tool("alpha__echo", {"text": "2"})
                except McpError as e:
                    assert e.error.code == -32602
                    break
                assert time.time() < deadline, "the new allow-list never applied"
                await asyncio.sleep(0.2)
            assert text(await s.call_tool("beta__echo", {"text": "3"})) == "beta:3"

    run(go())


def test_a_killed_server_fails_fast_the_other_works_and_a_restart_recovers(gateway):
    alpha, _ = gateway.servers

    async def go():
        async with connect(gateway.url, FULL) as s:
            assert text(await s.call_tool("alpha__echo", {"text": "up"})) == "alpha:up"
            alpha.kill()
            t0 = time.monotonic()
            with pytest.raises(McpError) as e:
                await s.call_tool("alpha__echo", {"text": "down"})
            # within the server's timeout_ms (4000) plus a loaded box's slack
            assert time.monotonic() - t0 < 4 + 10
            assert "alpha" in e.value.error.message
            assert text(await s.call_tool("beta__echo", {"text": "still"})) == "beta:still"
            # tools/list with one server down lists the other's
            names = {t.name for t in (await s.list_tools()).tools}
            assert names == {f"beta__{t}" for t in TOOLS}
            alpha.start()
            # same client session: the gateway opens a new upstream session on the new process
            assert text(await s.call_tool("alpha__echo", {"text": "back"})) == "alpha:back"

    try:
        run(go())
    finally:
        if alpha.proc.poll() is not None:
            alpha.start()


def test_a_slow_server_errors_within_its_timeout(gateway):
    async def go():
        async with connect(gateway.url, FULL) as s:
            t0 = time.monotonic()
            with pytest.raises(McpError) as e:
                await s.call_tool("alpha__slow", {"seconds": 30})
            took = time.monotonic() - t0
            assert 3.5 < took < 4 + 10, took
            assert "timed out" in e.value.error.message
            assert text(await s.call_tool("alpha__echo", {"text": "after"})) == "alpha:after"

    run(go())


def test_reload_adds_and_removes_a_server_without_dropping_sessions(gateway):
    gamma = McpServer("gamma")
    original = open(gateway.path).read()
    try:
        async def go():
            async with connect(gateway.url, FULL) as s:
                assert text(await s.call_tool("alpha__echo", {"text": "pre"})) == "alpha:pre"
                gateway.write(original + server_block(gamma))
                status, report = gateway.admin_call("POST", "/admin/reload")
                assert status == 200, report
                deadline = time.time() + 30
                while True:
                    names = {t.name for t in (await s.list_tools()).tools}
                    if "gamma__echo" in names:
                        break
                    assert time.time() < deadline, names
                    await asyncio.sleep(0.2)
                assert text(await s.call_tool("gamma__echo", {"text": "new"})) == "gamma:new"
                # the open session kept its other servers
                assert text(await s.call_tool("alpha__echo", {"text": "kept"})) == "alpha:kept"
                gateway.write(original)
                status, report = gateway.admin_call("POST", "/admin/reload")
                assert status == 200, report
                deadline = time.time() + 30
                while True:
                    try:
                        await s.call_tool("gamma__echo", {"text": "gone"})
                    except McpError as e:
                        assert e.error.code == -32602
                        break
                    assert time.time() < deadline
                    await asyncio.sleep(0.2)
                assert text(await s.call_tool("beta__echo", {"text": "kept"})) == "beta:kept"

        run(go())
    finally:
        gateway.write(original)
        gamma.kill()


def test_a_server_on_a_unix_socket_is_federated(servers, shards):
    """`url = "unix:/path.sock:/mcp"`: a co-located MCP server reached over its Unix socket
    (the server also listens on TCP only for the test's own /calls reads)."""
    state = tempfile.mkdtemp(prefix="rg-mcp-uds-")
    path = os.path.join(state, "gamma.sock")
    gamma = McpServer("gamma", uds=path)
    block = f'\n[[mcp_server]]\nname = "gamma"\nurl = "unix:{path}:/mcp"\ntimeout_ms = 4000\n'
    gw = Gateway(gateway_config(shards, servers, state, os.path.join(state, "access.log"), block),
                 state)
    try:
        async def go():
            async with connect(gw.url, FULL) as s:
                names = {t.name for t in (await s.list_tools()).tools}
                assert {f"gamma__{t}" for t in TOOLS} <= names, names
                assert text(await s.call_tool("gamma__echo", {"text": "uds"})) == "gamma:uds"
                assert text(await s.call_tool("gamma__add", {"a": 20, "b": 22})) == "42"

        run(go())
        assert gamma.calls().get("echo") == 1, gamma.calls()
    finally:
        gw.stop()
        gamma.kill()

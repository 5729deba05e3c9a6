"""A real MCP server for the gateway's tests: the official Python SDK's FastMCP (1.x) or
MCPServer (2.x) over Streamable HTTP, on a socket bound here (port 0 = any; `PORT n` is printed).

Tools: echo, add, big (n bytes of text), slow (sleeps), secret. It records what the gateway
sent it: tool calls by name (`GET /calls`) and the Authorization / X-Tenant / Mcp-Session-Id
header of every /mcp request (`GET /seen`), so tests can check what reached the server."""

import asyncio
import json
import os
import socket
import sys

import uvicorn
from starlette.responses import JSONResponse

try:
    from mcp.server.fastmcp import FastMCP as Server  # 1.x

    V1 = True
except ModuleNotFoundError:
    from mcp.server.mcpserver import MCPServer as Server  # 2.x

    V1 = False

name = sys.argv[1]
port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
json_response = "--json" in sys.argv

CALLS = {}
SEEN = []

# The SDK's DNS-rebinding guard for a server on 127.0.0.1 allows `localhost:<port>` hosts; a
# client over a Unix socket sends `Host: localhost` (no port, as curl --unix-socket does), so a
# server also on a socket (`--uds`) allows that too, as its operator would configure it.
security = None
if "--uds" in sys.argv:
    from mcp.server.transport_security import TransportSecuritySettings

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "localhost"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )

if V1:
    srv = Server(name, json_response=json_response, transport_security=security)
else:
    srv = Server(name)


def counted(fn):
    def wrap(*a, **k):
        CALLS[fn.__name__] = CALLS.get(fn.__name__, 0) + 1
        return fn(*a, **k)

    wrap.__name__ = fn.__name__
    wrap.__doc__ = fn.__doc__
    wrap.__annotations__ = fn.__annotations__
    return wrap


@srv.tool()
def echo(text: str) -> str:
    """Echo the text back, prefixed with the server's name."""
    CALLS["echo"] = CALLS.get("echo", 0) + 1
    return f"{name}:{text}"


@srv.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS["add"] = CALLS.get("add", 0) + 1
    return a + b


@srv.tool()
def big(n: int) -> str:
    """n bytes of text."""
    CALLS["big"] = CALLS.get("big", 0) + 1
    return "x" * n


@srv.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    CALLS["slow"] = CALLS.get("slow", 0) + 1
    await asyncio.sleep(seconds)
    return "slept"


@srv.tool()
def secret() -> str:
    """A tool a restricted key must never reach."""
    CALLS["secret"] = CALLS.get("secret", 0) + 1
    return "the secret"


@srv.custom_route("/calls", methods=["GET"])
async def calls(request):
    return JSONResponse(CALLS)


@srv.custom_route("/seen", methods=["GET"])
async def seen(request):
    return JSONResponse(SEEN)


if V1:
    app = srv.streamable_http_app()
else:
    app = srv.streamable_http_app(json_response=json_response, transport_security=security)


async def recording(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith("/mcp"):
        h = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        SEEN.append({k: h.get(k) for k in ("authorization", "x-tenant", "mcp-session-id")})
    await app(scope, receive, send)


sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sockets = [sock]
if "--uds" in sys.argv:
    # also on a Unix socket (`--uds PATH`): the same app, for a gateway's `url = "unix:…"`
    path = sys.argv[sys.argv.index("--uds") + 1]
    if os.path.exists(path):
        os.unlink(path)
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(path)
    sockets.append(uds)
print(f"PORT {sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(recording, log_level="warning", lifespan="on", timeout_keep_alive=120)
uvicorn.Server(config).run(sockets=sockets)

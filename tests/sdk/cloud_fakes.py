"""Fake cloud endpoints on 127.0.0.1 port 0 for the Bedrock and Vertex tests (not a test file).

- `Bedrock`: a Converse / ConverseStream upstream that recomputes every request's SigV4
  signature with botocore's `SigV4Auth` (service `bedrock`) over the request as received and
  answers 403 on any mismatch, unknown key, wrong session token or expired credentials; a
  Bearer request must carry the configured Bedrock API key. Streams are AWS event-stream frames
  (CRCs from zlib) written in pieces cut at random byte offsets.
- `Sts`: AssumeRole (its signature checked with botocore, service `sts`) and
  AssumeRoleWithWebIdentity (the token file's token), issuing fresh short-lived keys.
- `Creds`: a container-credentials endpoint (checks its authorization token) and IMDSv2.
- `Vertex`: the token endpoint (verifies the RS256 JWT assertion with the service account's
  public key, `cryptography`) and the Vertex upstream (Gemini `generateContent` /
  `streamGenerateContent?alt=sse`, Anthropic `rawPredict` / `streamRawPredict`), which refuses
  any token it did not issue or that expired.
"""

import base64
import json
import random
import struct
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


class Server:
    """A ThreadingHTTPServer on port 0 whose handler calls `self.handle(h)`."""

    def __init__(self):
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                outer.dispatch(self)

            do_GET = do_POST
            do_PUT = do_POST

        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.url = f"http://{self.addr}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def dispatch(self, h):
        n = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(n) if n else b""
        try:
            self.handle(h, body)
        except BrokenPipeError:
            pass

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(h, status, body, ctype="application/json", extra=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    h.send_response(status)
    h.send_header("content-type", ctype)
    h.send_header("content-length", str(len(body)))
    for k, v in (extra or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(body)


# ----------------------------------------------------------------------- SigV4 with botocore


def check_sigv4(h, body, keys, service, region):
    """None when the request's SigV4 signature is what botocore computes, else why not.
    `keys`: access key id → (secret, session token or None, expiry unix seconds or None)."""
    auth = h.headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return "not SigV4"
    parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
    akid, date, reg, svc, term = parts["Credential"].split("/")
    if (reg, svc, term) != (region, service, "aws4_request"):
        return f"scope {reg}/{svc}/{term}"
    if akid not in keys:
        return f"unknown access key {akid}"
    secret, token, expires = keys[akid]
    if expires is not None and time.time() > expires:
        return "expired credentials"
    if token != h.headers.get("x-amz-security-token"):
        return "wrong session token"
    amz_date = h.headers["x-amz-date"]
    if amz_date[:8] != date:
        return "date mismatch"
    signed = parts["SignedHeaders"].split(";")
    headers = {n: h.headers[n] for n in signed}
    req = AWSRequest(method=h.command, url=f"http://{h.headers['host']}{h.path}", data=body,
                     headers=headers)
    req.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(akid, secret, token), service, region)
    cr = signer.canonical_request(req)
    want = signer.signature(signer.string_to_sign(req, cr), req)
    if want != parts["Signature"]:
        return "signature mismatch"
    return None


# ----------------------------------------------------------------------- event stream


def frame(headers, payload):
    hb = b""
    for k, v in headers.items():
        kb, vb = k.encode(), v.encode()
        hb += bytes([len(kb)]) + kb + b"\x07" + struct.pack(">H", len(vb)) + vb
    total = 12 + len(hb) + len(payload) + 4
    prelude = struct.pack(">II", total, len(hb))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    msg = prelude + hb + payload
    return msg + struct.pack(">I", zlib.crc32(msg))


def event(kind, payload):
    return frame({":event-type": kind, ":content-type": "application/json",
                  ":message-type": "event"}, json.dumps(payload).encode())


def write_chunked_pieces(h, data, rng):
    """`data` as chunked-encoding chunks cut at random byte offsets, flushed one by one."""
    at = 0
    while at < len(data):
        n = rng.randint(1, 40)
        piece = data[at:at + n]
        at += n
        h.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
        h.wfile.flush()
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def wants_tool(req):
    """A request offering tools whose last user turn is not a tool result."""
    if not req.get("toolConfig"):
        return False
    last = req["messages"][-1]["content"]
    return not any("toolResult" in b for b in last)


class Bedrock(Server):
    def __init__(self, keys=None, bearer=None, region="us-east-1"):
        self.keys = keys if keys is not None else {}
        self.bearer = bearer
        self.region = region
        self.requests = []  # (path, akid or "bearer", parsed body)
        self.refused = []
        self.rng = random.Random(7)
        super().__init__()

    def handle(self, h, body):
        auth = h.headers.get("authorization", "")
        if auth.startswith("Bearer "):
            why = None if self.bearer and auth == f"Bearer {self.bearer}" else "bad bearer key"
            who = "bearer"
        else:
            why = check_sigv4(h, body, self.keys, "bedrock", self.region)
            who = auth.split("Credential=")[1].split("/")[0] if "Credential=" in auth else "?"
        if why:
            with self.lock:
                self.refused.append(why)
            return reply(h, 403, {"message": f"refused: {why}"},
                         extra={"x-amzn-ErrorType": "AccessDeniedException"})
        req = json.loads(body)
        with self.lock:
            self.requests.append((h.path, who, req))
        model = urllib.parse.unquote(h.path.split("/")[2])
        if model == "throttled":
            return reply(h, 429, {"message": "Too many requests, please wait."},
                         extra={"x-amzn-ErrorType": "ThrottlingException"})
        tool = wants_tool(req)
        if h.path.endswith("/converse"):
            if tool:
                name = req["toolConfig"]["tools"][0]["toolSpec"]["name"]
                content = [{"text": "Let me check."},
                           {"toolUse": {"toolUseId": "tooluse_1", "name": name,
                                        "input": {"city": "Paris"}}}]
                stop = "tool_use"
            else:
                content = [{"text": "Hello from Bedrock"}]
                stop = "end_turn"
            return reply(h, 200, {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": stop,
                "usage": {"inputTokens": 11, "outputTokens": 5, "totalTokens": 16},
                "metrics": {"latencyMs": 3}})
        frames = [event("messageStart", {"role": "assistant", "p": "abcd"})]
        if tool:
            name = req["toolConfig"]["tools"][0]["toolSpec"]["name"]
            frames.append(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Checking"}}))
            frames.append(event("contentBlockStop", {"contentBlockIndex": 0}))
            frames.append(event("contentBlockStart", {"contentBlockIndex": 1, "start": {
                "toolUse": {"toolUseId": "tooluse_1", "name": name}}}))
            for piece in ['{"ci', 'ty": "Pa', 'ris"}']:
                frames.append(event("contentBlockDelta", {"contentBlockIndex": 1,
                                                          "delta": {"toolUse": {"input": piece}}}))
            frames.append(event("contentBlockStop", {"contentBlockIndex": 1}))
            frames.append(event("messageStop", {"stopReason": "tool_use"}))
        else:
            for t in ["Hello", " from", " Bedrock"]:
                frames.append(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}}))
            frames.append(event("contentBlockStop", {"contentBlockIndex": 0}))
            frames.append(event("messageStop", {"stopReason": "end_turn"}))
        frames.append(event("metadata", {"usage": {"inputTokens": 11, "outputTokens": 5,
                                                   "totalTokens": 16}, "metrics": {"latencyMs": 3}}))
        h.send_response(200)
        h.send_header("content-type", "application/vnd.amazon.eventstream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        with self.lock:
            rng = random.Random(self.rng.random())
        write_chunked_pieces(h, b"".join(frames), rng)


class Issuer:
    """Fresh short-lived AWS keys, registered with the fake upstream that checks them."""

    def __init__(self, keys, lifetime=3600):
        self.keys = keys
        self.lifetime = lifetime
        self.issued = 0
        self.lock = threading.Lock()

    def issue(self):
        with self.lock:
            self.issued += 1
            n = self.issued
        akid = f"ASIATEST{n:08d}"
        secret, token = f"secret-{n}-{random.random()}", f"token-{n}"
        exp = int(time.time()) + self.lifetime
        self.keys[akid] = (secret, token, exp)
        iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
        return akid, secret, token, iso


class Sts(Server):
    def __init__(self, issuer, callers, web_token=None, region="us-east-1"):
        self.issuer, self.callers, self.web_token, self.region = issuer, callers, web_token, region
        self.calls = []
        super().__init__()

    def handle(self, h, body):
        form = dict(urllib.parse.parse_qsl(body.decode()))
        action = form.get("Action")
        if action == "AssumeRole":
            why = check_sigv4(h, body, self.callers, "sts", self.region)
        elif action == "AssumeRoleWithWebIdentity":
            why = None if form.get("WebIdentityToken") == self.web_token else "bad web identity token"
        else:
            why = f"unknown action {action}"
        self.calls.append((action, form.get("RoleArn"), why))
        if why:
            return reply(h, 403, f"<ErrorResponse><Error><Code>AccessDenied</Code><Message>{why}</Message></Error></ErrorResponse>", "text/xml")
        akid, secret, token, iso = self.issuer.issue()
        r = f"{action}Result"
        xml = (f"<{action}Response><{r}><Credentials><AccessKeyId>{akid}</AccessKeyId>"
               f"<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>"
               f"<Expiration>{iso}</Expiration></Credentials></{r}></{action}Response>")
        reply(h, 200, xml, "text/xml")


class Creds(Server):
    """Container credentials (`/creds`, authorization token checked) and IMDSv2."""

    def __init__(self, issuer, auth_token="container-secret"):
        self.issuer, self.auth_token = issuer, auth_token
        self.served = 0
        self.imds_tokens = set()
        super().__init__()

    def creds_json(self):
        akid, secret, token, iso = self.issuer.issue()
        self.served += 1
        return {"AccessKeyId": akid, "SecretAccessKey": secret, "Token": token, "Expiration": iso}

    def handle(self, h, body):
        if h.path == "/creds":
            if h.headers.get("authorization") != self.auth_token:
                return reply(h, 401, {"message": "no"})
            return reply(h, 200, self.creds_json())
        if h.path == "/latest/api/token" and h.command == "PUT":
            t = f"imds-{random.random()}"
            self.imds_tokens.add(t)
            return reply(h, 200, t, "text/plain")
        if h.headers.get("x-aws-ec2-metadata-token") not in self.imds_tokens:
            return reply(h, 401, "", "text/plain")
        if h.path == "/latest/meta-data/iam/security-credentials/":
            return reply(h, 200, "gateway-role", "text/plain")
        if h.path == "/latest/meta-data/iam/security-credentials/gateway-role":
            return reply(h, 200, dict(self.creds_json(), Code="Success"))
        reply(h, 404, "", "text/plain")


# ----------------------------------------------------------------------- Vertex


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class Vertex(Server):
    """The token endpoint (`/token`) and the Vertex API, on one server."""

    def __init__(self, public_key, email, project, location, lifetime=3600):
        self.public_key, self.email = public_key, email
        self.prefix = f"/v1/projects/{project}/locations/{location}/publishers/"
        self.lifetime = lifetime
        self.tokens = {}  # token → expiry
        self.token_calls = 0
        self.refused = []
        self.calls = []  # (path, token, body)
        super().__init__()

    def verify_assertion(self, jwt):
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        head, claims, sig = jwt.split(".")
        self.public_key.verify(b64url_decode(sig), f"{head}.{claims}".encode(),
                               padding.PKCS1v15(), hashes.SHA256())
        h, c = json.loads(b64url_decode(head)), json.loads(b64url_decode(claims))
        assert h["alg"] == "RS256", h
        assert c["iss"] == self.email and c["aud"] == f"{self.url}/token", c
        assert c["scope"] == "https://www.googleapis.com/auth/cloud-platform", c
        assert c["iat"] <= time.time() + 60 < c["exp"] + 60, c

    def handle(self, h, body):
        if h.path == "/token":
            form = dict(urllib.parse.parse_qsl(body.decode()))
            try:
                assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
                self.verify_assertion(form["assertion"])
            except Exception as e:  # noqa: BLE001 - any failure is a refusal
                self.refused.append(f"assertion: {e!r}")
                return reply(h, 400, {"error": "invalid_grant"})
            with self.lock:
                self.token_calls += 1
                tok = f"ya29.test-{self.token_calls}"
                self.tokens[tok] = time.time() + self.lifetime
            return reply(h, 200, {"access_token": tok, "expires_in": self.lifetime,
                                  "token_type": "Bearer"})
        auth = h.headers.get("authorization", "")
        tok = auth.removeprefix("Bearer ")
        exp = self.tokens.get(tok)
        if exp is None or time.time() > exp:
            self.refused.append(f"token {tok[:16]}")
            return reply(h, 401, {"error": {"code": 401, "message": "invalid token",
                                            "status": "UNAUTHENTICATED"}})
        req = json.loads(body)
        with self.lock:
            self.calls.append((h.path, tok, req))
        if not h.path.startswith(self.prefix):
            return reply(h, 404, {"error": {"code": 404, "message": "no such path", "status": "NOT_FOUND"}})
        rest = h.path[len(self.prefix):]
        if rest.startswith("anthropic/"):
            return self.anthropic(h, rest, req)
        return self.gemini(h, rest, req)

    def gemini(self, h, rest, req):
        tool = bool(req.get("tools")) and not any(
            "functionResponse" in p for p in req["contents"][-1]["parts"])
        if tool:
            name = req["tools"][0]["functionDeclarations"][0]["name"]
            parts = [{"functionCall": {"name": name, "args": {"city": "Paris"}}}]
        else:
            parts = [{"text": "Hello from Vertex Gemini"}]
        usage = {"promptTokenCount": 4, "candidatesTokenCount": 5, "totalTokenCount": 9}
        if ":streamGenerateContent" in rest:
            assert rest.endswith("?alt=sse"), rest
            h.send_response(200)
            h.send_header("content-type", "text/event-stream")
            h.send_header("transfer-encoding", "chunked")
            h.end_headers()
            chunks = []
            if not tool:
                for t in ["Hello", " from Vertex", " Gemini"]:
                    chunks.append({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}}]})
                chunks[-1]["candidates"][0]["finishReason"] = "STOP"
            else:
                chunks.append({"candidates": [{"content": {"role": "model", "parts": parts},
                                               "finishReason": "STOP"}]})
            chunks[-1]["usageMetadata"] = usage
            data = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
            return write_chunked_pieces(h, data, random.Random(3))
        assert rest.endswith(":generateContent"), rest
        reply(h, 200, {"candidates": [{"content": {"role": "model", "parts": parts},
                                       "finishReason": "STOP", "index": 0}],
                       "usageMetadata": usage, "modelVersion": "gemini-2.5-flash"})

    def anthropic(self, h, rest, req):
        if req.get("anthropic_version") != "vertex-2023-10-16" or "model" in req:
            return reply(h, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": "vertex body shape"}})
        tool = bool(req.get("tools")) and not (
            isinstance(req["messages"][-1]["content"], list)
            and any(b.get("type") == "tool_result" for b in req["messages"][-1]["content"]))
        model = rest.split("/")[2].split(":")[0]
        if tool:
            name = req["tools"][0]["name"]
            content = [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {"city": "Paris"}}]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": "Hello from Vertex Claude"}]
            stop = "end_turn"
        if rest.endswith(":rawPredict"):
            return reply(h, 200, {"id": "msg_1", "type": "message", "role": "assistant",
                                  "model": model, "content": content, "stop_reason": stop,
                                  "stop_sequence": None,
                                  "usage": {"input_tokens": 6, "output_tokens": 7}})
        assert rest.endswith(":streamRawPredict"), rest
        evs = [("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 6, "output_tokens": 1}}})]
        if tool:
            evs.append(("content_block_start", {"type": "content_block_start", "index": 0,
                        "content_block": {"type": "tool_use", "id": "toolu_1", "name": content[0]["name"], "input": {}}}))
            for p in ['{"city"', ': "Paris"}']:
                evs.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": p}}))
        else:
            evs.append(("content_block_start", {"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}))
            for t in ["Hello", " from Vertex", " Claude"]:
                evs.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": t}}))
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        evs.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop,
                    "stop_sequence": None}, "usage": {"output_tokens": 7}}))
        evs.append(("message_stop", {"type": "message_stop"}))
        data = b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in evs)
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        write_chunked_pieces(h, data, random.Random(5))

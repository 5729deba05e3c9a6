"""The OpenAI surface beyond chat through the gateway, with the official openai SDK: a large
file upload and a transcription streamed (not buffered) to a fake OpenAI upstream that hashes
what arrives (the file part's bytes, the multipart unchanged), the gateway's RSS bounded while
it passes; file retrieve/list/content (binary, streamed back byte-exact)/delete; batches
create/retrieve/list/cancel by id; speech audio streamed back byte-exact; image generation and
edits, moderations; an answer that breaks before its first byte is a whole 502; a body over
`max_upload` refused with 413 before it is sent; a request
naming no model with several OpenAI-style providers and no `files_provider`.

`RG_UPLOAD_MIB` sets the upload size (default 64; the 300 MiB run is in bench-results/)."""

import hashlib
import http.server
import io
import json
import os
import socket
import tempfile
import threading
import time

import httpx
import openai
import pytest

from conftest import spawn, stop

UPLOAD_MIB = int(os.environ.get("RG_UPLOAD_MIB", "64"))
KEY = "sk-surface-test"


class Upstream:
    """A fake OpenAI API on 127.0.0.1:0. Request bodies are read in pieces and hashed as they
    arrive (never held whole); a multipart body's file part is hashed on its own."""

    def __init__(self):
        self.seen = []  # (method, path, facts) per request
        self.files = {}
        self.content = os.urandom(3 << 20)
        self.speech = os.urandom((1 << 20) + 17)
        up = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def body_pieces(self):
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b""):
                                pass
                            return
                        left = size
                        while left:
                            piece = self.rfile.read(min(left, 1 << 20))
                            left -= len(piece)
                            yield piece
                        self.rfile.readline()
                n = int(self.headers.get("content-length", "0"))
                while n:
                    piece = self.rfile.read(min(n, 1 << 20))
                    if not piece:
                        raise IOError("short body")
                    n -= len(piece)
                    yield piece

            def facts(self):
                """Hash the body as it arrives: the whole of it, and the last part's payload
                (a file) when it is multipart: the bytes between its part headers and the
                closing delimiter."""
                ct = self.headers.get("content-type", "")
                whole, part = hashlib.sha256(), hashlib.sha256()
                head, total, hold = b"", 0, b""
                tail = b""
                if "boundary=" in ct:
                    tail = b"\r\n--" + ct.split("boundary=")[1].strip('"').encode() + b"--\r\n"
                started = False
                fields = {}
                for piece in self.body_pieces():
                    whole.update(piece)
                    total += len(piece)
                    if not tail:
                        continue
                    if not started:
                        head += piece
                        i = head.rfind(b"filename=")
                        j = head.find(b"\r\n\r\n", i) if i >= 0 else -1
                        if j < 0:
                            continue
                        started = True
                        for blk in head[:i].split(b"Content-Disposition: form-data; name=\"")[1:]:
                            name, _, rest = blk.partition(b"\"")
                            if b"\r\n\r\n" in rest:
                                value = rest.split(b"\r\n\r\n", 1)[1].split(b"\r\n--")[0]
                                fields[name.decode()] = value.decode()
                        piece = head[j + 4:]
                    hold += piece
                    if len(hold) > len(tail):
                        part.update(hold[: len(hold) - len(tail)])
                        hold = hold[len(hold) - len(tail):]
                return {
                    "sha256": whole.hexdigest(),
                    "len": total,
                    "file_sha256": part.hexdigest() if started and hold == tail else None,
                    "fields": fields,
                    "content_type": ct,
                    "auth": self.headers.get("authorization"),
                }

            def answer(self, status, obj=None, raw=None, ct="application/json", chunked=False):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", ct)
                if chunked:
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(data), 100_000):
                        c = data[i:i + 100_000]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def handle_any(self, method):
                f = self.facts()
                path = self.path
                up.seen.append((method, path, f))
                if f["auth"] != f"Bearer {KEY}":
                    return self.answer(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
                base = path.split("?")[0]
                if (method, base) == ("POST", "/v1/files"):
                    fid = f"file-{len(up.files)}x{f['file_sha256'][:8] if f['file_sha256'] else 'none'}"
                    up.files[fid] = f
                    return self.answer(200, {"id": fid, "object": "file", "bytes": f["len"],
                                             "created_at": 1, "filename": "big.bin",
                                             "purpose": f["fields"].get("purpose", ""),
                                             "status": "processed"})
                if (method, base) == ("GET", "/v1/files"):
                    return self.answer(200, {"object": "list", "has_more": False, "data": [
                        {"id": k, "object": "file", "bytes": 1, "created_at": 1, "filename": "x",
                         "purpose": "batch", "status": "processed"} for k in up.files]})
                if base == "/v1/files/file-broken/content":
                    # a head, then the connection closes before a body byte
                    self.send_response(200)
                    self.send_header("content-type", "application/octet-stream")
                    self.send_header("content-length", "1000")
                    self.end_headers()
                    self.close_connection = True
                    return
                if base.startswith("/v1/files/") and base.endswith("/content"):
                    return self.answer(200, raw=up.content, ct="application/octet-stream", chunked=True)
                if base.startswith("/v1/files/"):
                    fid = base.rsplit("/", 1)[1]
                    if fid not in up.files:
                        return self.answer(404, {"error": {"message": f"No such File object: {fid}", "type": "invalid_request_error"}})
                    if method == "DELETE":
                        del up.files[fid]
                        return self.answer(200, {"id": fid, "object": "file", "deleted": True})
                    return self.answer(200, {"id": fid, "object": "file", "bytes": 1, "created_at": 1,
                                             "filename": "big.bin", "purpose": "batch", "status": "processed"})
                if base.startswith("/v1/batches"):
                    parts = base.split("/")
                    batch = {"id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions",
                             "input_file_id": "file-0", "completion_window": "24h",
                             "status": "validating", "created_at": 1}
                    if method == "GET" and base == "/v1/batches":
                        return self.answer(200, {"object": "list", "data": [batch], "has_more": False})
                    if base.endswith("/cancel"):
                        batch["status"] = "cancelling"
                    if method == "POST" and base == "/v1/batches":
                        batch["input_file_id"] = json.loads(up.last_json)["input_file_id"]
                    elif parts[-1] != "batch_1" and parts[-2] != "batch_1":
                        return self.answer(404, {"error": {"message": "no such batch", "type": "invalid_request_error"}})
                    return self.answer(200, batch)
                if base == "/v1/audio/transcriptions":
                    return self.answer(200, {"text": f"model={f['fields'].get('model')} sha={f['file_sha256']}"})
                if base == "/v1/audio/speech":
                    return self.answer(200, raw=up.speech, ct="audio/mpeg", chunked=True)
                if base == "/v1/images/edits":
                    return self.answer(200, {"created": 1, "data": [{"b64_json": f["file_sha256"]}]})
                if base == "/v1/images/generations":
                    return self.answer(200, {"created": 1, "data": [{"url": "http://x/" + json.loads(up.last_json)["model"]}]})
                if base == "/v1/rerank":
                    req = json.loads(up.last_json)
                    return self.answer(200, {"model": req["model"], "results": [
                        {"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(req["documents"]))]})
                if base == "/v1/moderations":
                    return self.answer(200, {"id": "modr-1", "model": json.loads(up.last_json).get("model", "default"),
                                             "results": [{"flagged": False, "categories": {}, "category_scores": {}}]})
                return self.answer(404, {"error": {"message": "no route", "type": "invalid_request_error"}})

            def do_GET(self):
                self.handle_any("GET")

            def do_DELETE(self):
                self.handle_any("DELETE")

            def do_POST(self):
                ct = self.headers.get("content-type", "")
                if ct.startswith("application/json"):
                    n = int(self.headers.get("content-length", "0"))
                    up.last_json = self.rfile.read(n)
                    if "content-length" in self.headers:
                        self.headers.replace_header("content-length", "0")
                self.handle_any("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def last(self, path):
        return [s for s in self.seen if s[1].split("?")[0] == path][-1]

    def stop(self):
        self.server.shutdown()


def config(shards, up, extra=""):
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[admission]
memory_budget = "64MiB"
max_upload = "{UPLOAD_MIB + 16}MiB"

[[provider]]
name = "oa"
kind = "openai"
base_url = "{up.url}/v1"
api_key_env = "RG_SURFACE_KEY"

[[model]]
name = "whisper"
provider = "oa"
upstream_model = "whisper-1"

[[model]]
name = "whisper-1"
provider = "oa"

[[model]]
name = "tts-1"
provider = "oa"

[[model]]
name = "gpt-image-1"
provider = "oa"

[[model]]
name = "omni-moderation-latest"
provider = "oa"
{extra}
"""


def start(cfg, driver):
    f = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    f.write(cfg)
    f.close()
    env = {"RINGGATE_DRIVER": driver, "RG_SURFACE_KEY": KEY, "RG_SURFACE_VKEY": "vk-surface"}
    proc, addr = spawn(["--config", f.name], env)
    return proc, f"http://{addr}", f.name


@pytest.fixture(scope="module")
def surface(driver, shards):
    up = Upstream()
    proc, base, path = start(config(shards, up), driver)
    yield proc, base, up
    stop(proc)
    os.unlink(path)
    up.stop()


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class Pattern(io.RawIOBase):
    """`size` bytes of a repeating pseudo-random pattern, read in pieces (the test process
    never holds the whole file either), hashed as they are read."""

    def __init__(self, size):
        self.size, self.at = size, 0
        self.block = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB
        self.name = "big.jsonl"

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.size - self.at, len(self.block))
        off = self.at % len(self.block)
        chunk = (self.block[off:] + self.block[:off])[:n]
        b[:n] = chunk
        self.at += n
        return n

    def digest(self):
        h = hashlib.sha256()
        full, rest = divmod(self.size, len(self.block))
        for _ in range(full):
            h.update(self.block)
        h.update(self.block[:rest])
        return h.hexdigest()


def test_large_upload_streams_with_rss_bounded(surface):
    proc, base, up = surface
    size = UPLOAD_MIB << 20
    src = Pattern(size)
    before = rss_kib(proc.pid, "VmRSS")
    # the SDK sends a file object as one multipart part (httpx streams it)
    f = client(base).files.create(file=("big.jsonl", io.BufferedReader(src, 1 << 20)), purpose="batch")
    peak = rss_kib(proc.pid, "VmHWM")
    _, _, facts = up.last("/v1/files")
    assert facts["file_sha256"] == src.digest(), "the file's bytes arrived changed"
    assert facts["fields"]["purpose"] == "batch"
    assert facts["content_type"].startswith("multipart/form-data; boundary=")
    assert f.id.startswith("file-") and f.bytes == facts["len"] > size
    # a buffering gateway holds the whole body at least once: its peak grows by >= the file
    grew = (peak - before) >> 10
    print(f"upload {UPLOAD_MIB} MiB: RSS before {before >> 10} MiB, peak {peak >> 10} MiB")
    assert grew < UPLOAD_MIB // 2, f"gateway RSS grew by {grew} MiB during a {UPLOAD_MIB} MiB upload"
    # and the id comes back to the provider that issued it
    c = client(base)
    assert c.files.retrieve(f.id).id == f.id
    assert f.id in [x.id for x in c.files.list(purpose="batch")]
    got = c.files.content(f.id).read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(up.content).digest()
    assert c.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(f.id)


def test_transcription_multipart_routed_by_its_model_field(surface):
    _, base, up = surface
    audio = os.urandom(5 << 20) + b"\r\n--not-a-boundary\r\n"
    t = client(base).audio.transcriptions.create(model="whisper", file=("a.wav", audio, "audio/wav"))
    # the upstream got the deployment's model name and the audio intact
    assert t.text == f"model=whisper-1 sha={hashlib.sha256(audio).hexdigest()}"
    # with no model rewrite the multipart reaches the upstream byte for byte
    boundary = "rg-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode() + audio + f"\r\n--{boundary}--\r\n".encode()
    r = httpx.post(f"{base}/v1/audio/transcriptions", content=body, timeout=60,
                   headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 200, r.text
    _, _, facts = up.last("/v1/audio/transcriptions")
    assert facts["sha256"] == hashlib.sha256(body).hexdigest() and facts["len"] == len(body)
    # the same body sent chunked arrives the same (re-framed, bytes unchanged)
    r = httpx.post(f"{base}/v1/audio/translations", content=iter([body[:1000], body[1000:]]),
                   timeout=60, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    _, _, facts = up.last("/v1/audio/translations")
    assert facts["sha256"] == hashlib.sha256(body).hexdigest()
    # a model the gateway does not route, and one after the file, are refused in OpenAI's shape
    with pytest.raises(openai.NotFoundError):
        client(base).audio.transcriptions.create(model="nope", file=("a.wav", b"x"))
    late = body.replace(b"name=\"model\"\r\n\r\nwhisper-1", b"name=\"prompt\"\r\n\r\nhi")
    late = late.replace(f"--{boundary}--".encode(), f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}--".encode())
    r = httpx.post(f"{base}/v1/audio/transcriptions", content=late, timeout=60,
                   headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]


def test_speech_images_moderations(surface):
    _, base, up = surface
    c = client(base)
    with c.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input="hi") as r:
        audio = b"".join(r.iter_bytes())
    assert audio == up.speech
    img = c.images.generate(model="gpt-image-1", prompt="a cat")
    assert img.data[0].url == "http://x/gpt-image-1"
    png = os.urandom(200_000)
    e = c.images.edit(model="gpt-image-1", image=("a.png", png, "image/png"), prompt="hat")
    assert e.data[0].b64_json == hashlib.sha256(png).hexdigest()
    m = c.moderations.create(model="omni-moderation-latest", input="hello")
    assert m.model == "omni-moderation-latest"
    # OpenAI serves no rerank: a model only on an openai provider is refused before sending
    n = len(up.seen)
    r = httpx.post(f"{base}/v1/rerank", json={"model": "whisper-1", "query": "q", "documents": ["a"]})
    assert r.status_code == 400 and "openai-compatible" in r.json()["error"]["message"], r.text
    assert len(up.seen) == n


def test_batches_by_id(surface):
    _, base, up = surface
    c = client(base)
    f = c.files.create(file=("in.jsonl", b'{"custom_id":"1"}\n'), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert (b.id, b.input_file_id) == ("batch_1", f.id)
    assert c.batches.retrieve("batch_1").status == "validating"
    assert [x.id for x in c.batches.list()] == ["batch_1"]
    assert c.batches.cancel("batch_1").status == "cancelling"
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_2")
    # an id that could change the upstream line is refused before anything is sent
    n = len(up.seen)
    r = httpx.get(f"{base}/v1/files/a%2F..%2Fb")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("invalid id")
    assert len(up.seen) == n


def test_an_answer_broken_before_its_first_byte_is_a_502(surface):
    """The upstream sends a head, then closes before a body byte: nothing went to the client
    yet, so it gets a whole 502 in OpenAI's shape naming its request id (not a closed
    connection), and the gateway keeps serving that connection."""
    _, base, _ = surface
    with httpx.Client(base_url=base, timeout=60) as h:
        r = h.get("/v1/files/file-broken/content")
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert "incomplete response" in err["message"], err
        assert r.headers["x-request-id"] in err["message"], (r.headers, err)
        assert h.get("/v1/files").status_code == 200


def test_over_max_upload_is_413_before_the_body(surface):
    _, base, up = surface
    host, port = base.removeprefix("http://").split(":")
    n = len(up.seen)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall((f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                   f"Content-Length: {(UPLOAD_MIB + 17) << 20}\r\nExpect: 100-continue\r\n\r\n").encode())
        got = s.recv(4096)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert b"over the" in got and len(up.seen) == n


def test_files_provider_and_keys(driver, shards):
    up = Upstream()
    extra = f"""
[[provider]]
name = "second"
kind = "openai-compatible"
base_url = "{up.url}/v1"
api_key_env = "RG_SURFACE_KEY"

[[model]]
name = "reranker"
provider = "second"
upstream_model = "bge-reranker"
"""
    proc, base, path = start(config(shards, up, extra), driver)
    try:
        r = httpx.get(f"{base}/v1/files")
        assert r.status_code == 400 and "files_provider" in r.json()["error"]["message"]
    finally:
        stop(proc)
        os.unlink(path)
    keyed = extra + """
[routing]
files_provider = "oa"

[[key]]
name = "surface-team"
key_env = "RG_SURFACE_VKEY"
models = ["whisper", "reranker"]
"""
    proc, base, path = start(config(shards, up, keyed), driver)
    try:
        # the gateway's keys and model allow-lists apply as on every endpoint
        assert httpx.get(f"{base}/v1/files").status_code == 401
        vk = {"authorization": "Bearer vk-surface"}
        assert httpx.get(f"{base}/v1/files", headers=vk).status_code == 200
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="vk-surface", max_retries=0)
        assert c.audio.transcriptions.create(model="whisper", file=("a.wav", b"abc")).text.startswith("model=whisper-1")
        with pytest.raises(openai.PermissionDeniedError):
            c.audio.speech.create(model="tts-1", voice="alloy", input="x")
        # rerank goes to the engine kind, with the deployment's model name
        r = httpx.post(f"{base}/v1/rerank", headers=vk,
                       json={"model": "reranker", "query": "q", "documents": ["a", "b"]})
        assert r.status_code == 200 and r.json()["model"] == "bge-reranker", r.text
        assert len(r.json()["results"]) == 2
    finally:
        stop(proc)
        os.unlink(path)
        up.stop()

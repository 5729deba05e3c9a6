"""The official `openai` SDK over the gateway's TLS listener (`server.tls_listen`): a test CA
made with the `openssl` CLI, trusted through `http_client=httpx.Client(verify=<ca.pem>)`;
non-stream and stream; plain HTTP sent to the TLS port gets a clean 400 and the gateway keeps
serving both listeners."""

import os
import re
import subprocess
import tempfile
import time

import httpx
import openai
import pytest

from conftest import BIN, stop

# The contract form `httpx.Client(verify=<ca.pem path>)` is what users write; httpx 0.28 warns.
pytestmark = pytest.mark.filterwarnings("ignore:`verify=<str>` is deprecated:DeprecationWarning")

TLS_RE = re.compile(r"listening on http://([0-9.:]+) and https://([0-9.:]+)")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki():
    """ca.pem + cert.pem/key.pem for 127.0.0.1 and localhost, signed by the CA (extensions
    that Python's strict X.509 verification accepts)."""
    d = tempfile.mkdtemp(prefix="ringgate-tls-sdk-")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ringgate test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "key.pem", "-out", "cert.csr", "-subj", "/CN=localhost", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "cert.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_gateway(mock, driver, pki, shards):
    """The gateway with plain and TLS listeners; the config sits next to the certificate files
    and names them relatively. Yields (plain base URL, https base URL)."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
tls_listen = "127.0.0.1:0"
tls_cert = "cert.pem"
tls_key = "key.pem"
shards = {shards}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
"""
    path = os.path.join(pki, f"ringgate-{driver}.toml")
    with open(path, "w") as f:
        f.write(cfg)
    env = dict(os.environ, RINGGATE_DRIVER=driver)
    proc = subprocess.Popen([BIN, "--config", path], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    deadline, lines, m = time.time() + 20, [], None
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = TLS_RE.search(line)
        if m:
            break
    if not m:
        proc.kill()
        raise RuntimeError("ringgate did not start: " + "".join(lines))
    yield f"http://{m.group(1)}", f"https://{m.group(2)}"
    stop(proc)


def tls_client(base, pki):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10,
                         http_client=httpx.Client(verify=os.path.join(pki, "ca.pem")))


def test_openai_sdk_over_tls_non_stream_and_stream(tls_gateway, pki):
    _, https = tls_gateway
    c = tls_client(https, pki)
    for _ in range(3):  # one kept-alive TLS connection
        r = c.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == 8
    stream = c.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        stream=True)
    content, finish = "", None
    for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop" and len(content.split()) == 20


def test_untrusted_certificate_is_refused_by_the_sdk(tls_gateway):
    _, https = tls_gateway
    c = openai.OpenAI(base_url=https + "/v1", api_key="sk-client", max_retries=0, timeout=10)
    with pytest.raises(openai.APIConnectionError):
        c.models.list()


def test_plain_http_to_the_tls_port_is_refused_and_both_listeners_keep_serving(tls_gateway, pki):
    plain, https = tls_gateway
    wrong = "http://" + https.removeprefix("https://")
    c = openai.OpenAI(base_url=wrong + "/v1", api_key="sk-client", max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="gpt-4o-mini",
                                  messages=[{"role": "user", "content": "hi"}])
    assert "https://" in str(e.value)
    r = tls_client(https, pki).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.usage.completion_tokens == 4
    p = openai.OpenAI(base_url=plain + "/v1", api_key="sk-client", max_retries=0, timeout=10)
    r = p.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.usage.completion_tokens == 4

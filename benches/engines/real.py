#!/usr/bin/env python3
"""S10 on real engines (issue 22): lb = "load" vs weighted vs p2c in front of two real
llama.cpp `llama-server` processes, next to the simulated run (benches/engines/engines.py).

    eval "$(.ci/llama-engine env)"
    nice -n 10 benches/engines/real.py [--ringgate BIN] [--step-duration S] [--warmup S]
                                       [--loads 0.5,1,1.5] [--out NAME]

The engines: llama.cpp `0c1e57098` (`.ci/llama-engine`), SmolLM2-135M-Instruct Q4_1, one
thread each (`-t 1 -tb 1`), `-np 2 -c 4096 --no-warmup --metrics`, and a host prompt cache
of `--cache-ram CACHE_MIB` MiB (~2-3 of the prompts besides the two slots' own; the default
8 GiB would hold every prompt of the workload for ever, where a real engine's cache holds part
of its working set), engine A pinned to CPU 0 and B to
CPU 1 when `taskset` is there. The gateway (`engine = "llamacpp"`: its default `/slots`
signal; shards = 1) and the client are not pinned: on a 2-core box they share the engines'
CPUs, as the engines share them with whatever else runs (the load average is recorded).

The workload: every request picks one of PROMPTS shared system prompts (PROMPT_BYTES bytes,
~130 tokens each: on one loaded thread a cold prefill of one takes ~1-2 s, a cached one almost
nothing) plus a unique user turn, streams, MAX_TOKENS output tokens (`ignore_eos`, greedy).
The pair's capacity is measured first (closed loop, 2 requests in flight per engine slot,
warm prompts); then open loop (Poisson arrivals, one connection per request) at each load
level, the three balancers interleaved, each run on freshly started engines and gateway (cold
caches):

  load      lb = "load", max_waiting = MAX_WAITING (sheds with 429 beyond that)
  weighted  lb = "weighted", weights 1:1 (the engines are equal)
  p2c       lb = "p2c" (the default)

Reported per run: TTFT p50/p99 of answered requests (from the intended send time), goodput
(answered with TTFT <= SLO_S, per second), shed 429s, errors, share per engine, and what the
engines themselves report: `llamacpp:prompt_tokens_cached_total` / (cached +
`llamacpp:prompt_tokens_total`) summed over both, read from their `/metrics` once the run has
ended (nothing reads `/metrics` during a run). Results: bench-results/s10-engines-real.{md,json}.
"""

import asyncio
import importlib.machinery
import importlib.util
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LBS = ("load", "weighted", "p2c")
PROMPTS = 8
PROMPT_BYTES = 600
MAX_TOKENS = 8
CACHE_MIB = 8
MAX_WAITING = 2
SLO_S = 2.0
ALIAS = "smollm2"


def load_runner():
    """benches/run as a module (its process, result and chart helpers)."""
    path = os.path.join(ROOT, "benches", "run")
    loader = importlib.machinery.SourceFileLoader("bench_run", path)
    spec = importlib.util.spec_from_loader("bench_run", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def system_prompts():
    rng = random.Random(22)
    words = ("policy order refund account shipping invoice warranty support escalate customer "
             "region tier premium standard return label carrier tracking delay damage").split()
    out = []
    for i in range(PROMPTS):
        text = f"You are assistant number {i} of the Acme help desk. "
        while len(text) < PROMPT_BYTES:
            text += rng.choice(words) + " "
        out.append(text[:PROMPT_BYTES])
    return out


def body_of(prompts, rng, tag):
    sysp = rng.choice(prompts)
    user = f"Request {tag}: my order {rng.randrange(10**9)} is late, what now?"
    return json.dumps({"model": ALIAS, "stream": True, "max_tokens": MAX_TOKENS,
                       "ignore_eos": True, "temperature": 0,
                       "messages": [{"role": "system", "content": sysp},
                                    {"role": "user", "content": user}]}).encode()


class Engine:
    def __init__(self, R, name, cpu):
        self.name = name
        self.port = R.free_port()
        server, model = os.environ["LLAMA_SERVER"], os.environ["LLAMA_MODEL"]
        argv = [server, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                "-t", "1", "-tb", "1", "-np", "2", "-c", "4096", "--no-warmup", "--metrics",
                "--alias", ALIAS, "--cache-ram", str(CACHE_MIB)]
        if shutil.which("taskset"):
            argv = ["taskset", "-c", str(cpu)] + argv
        self.proc = R.Proc(f"llama-{name}", argv, port=self.port, ready_timeout=120)
        deadline = time.time() + 120
        while get(self.port, "/health")[0] != 200:
            if time.time() > deadline or not self.proc.alive():
                raise R.HarnessError(f"llama-{name} never healthy: {self.proc.log_tail()}")
            time.sleep(0.05)

    def counters(self):
        page = get(self.port, "/metrics")[1].decode()
        vals = {}
        for m in re.finditer(r"^llamacpp:([a-z_]+) (\S+)$", page, re.M):
            vals[m.group(1)] = float(m.group(2))
        return vals


def get(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                      .encode())
            data = b""
            while True:
                c = s.recv(65536)
                if not c:
                    break
                data += c
    except OSError:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    if m and b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return (int(m.group(1)) if m else 0), body


def gateway_config(port, lb, engines):
    lines = ["[server]", f'listen = "127.0.0.1:{port}"', "shards = 1", "",
             "[upstream]", "first_byte_timeout_ms = 120000", "total_timeout_ms = 120000", ""]
    deps = []
    for e in engines:
        lines += ["[[provider]]", f'name = "{e.name}"', 'kind = "openai-compatible"',
                  'engine = "llamacpp"', f'base_url = "http://127.0.0.1:{e.port}/v1"', ""]
        deps.append(f'{{ provider = "{e.name}", weight = 1 }}')
    lines += ["[[model]]", f'name = "{ALIAS}"', f"deployments = [ {', '.join(deps)} ]",
              f'lb = "{lb}"', "max_attempts = 1"]
    if lb == "load":
        lines.append(f"max_waiting = {MAX_WAITING}")
    return "\n".join(lines) + "\n"


async def one(port, body, due, out):
    now = time.monotonic()
    if due > now:
        await asyncio.sleep(due - now)
    rec = {"status": None, "ttft": None, "total": None, "provider": None}
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n\r\n").encode() + body)
        await w.drain()
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await asyncio.wait_for(r.read(65536), 180)
            if not chunk:
                break
            buf += chunk
        m = re.match(rb"HTTP/1\.1 (\d{3})", buf)
        rec["status"] = int(m.group(1)) if m else None
        pm = re.search(rb"\r\nx-ringgate-provider: ([a-z0-9]+)", buf, re.I)
        rec["provider"] = pm.group(1).decode() if pm else None
        if rec["status"] == 200:
            while True:
                if rec["ttft"] is None and re.search(rb'"content":"[^"]', buf):
                    rec["ttft"] = time.monotonic() - due
                if b"data: [DONE]" in buf:
                    break
                chunk = await asyncio.wait_for(r.read(65536), 180)
                if not chunk:
                    break
                buf += chunk
            rec["total"] = time.monotonic() - due
        w.close()
    except Exception as e:  # noqa: BLE001 (a failed request is a result)
        rec["error"] = type(e).__name__
    out.append(rec)


async def drive(port, rate, warmup, duration, prompts, seed):
    rng = random.Random(seed)
    t0 = time.monotonic() + 0.2
    t, tasks, measured, discard, n = 0.0, [], [], [], 0
    while True:
        t += rng.expovariate(rate)
        if t >= warmup + duration:
            break
        body = body_of(prompts, rng, f"{seed}-{n}")
        tasks.append(asyncio.ensure_future(
            one(port, body, t0 + t, measured if t >= warmup else discard)))
        n += 1
    await asyncio.gather(*tasks)
    return measured


async def closed_loop(port, conc, duration, prompts):
    """Requests answered per second with `conc` in flight (warm prompts)."""
    rng = random.Random(7)
    end = time.monotonic() + duration
    done = []

    async def worker(k):
        i = 0
        while time.monotonic() < end:
            out = []
            await one(port, body_of(prompts, rng, f"cal-{k}-{i}"), time.monotonic(), out)
            if out[0]["status"] == 200:
                done.append(out[0])
            i += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker(k) for k in range(conc)))
    return len(done) / (time.monotonic() - t0)


def start_pair(R, lb):
    engines = [Engine(R, "a", 0), Engine(R, "b", 1)]
    gport = R.free_port()
    cfg = os.path.join(R.tmpdir(), f"s10r-{lb}-{gport}.toml")
    with open(cfg, "w") as f:
        f.write(gateway_config(gport, lb, engines))
    gw = R.Proc(f"ringgate-{lb}", [R.RINGGATE, "--config", cfg], port=gport,
                env=R.GATEWAY_ENV)
    time.sleep(0.5)  # a first poll of both engines (poll_ms = 100)
    return engines, gw


def capacity(R, prompts, duration):
    engines, gw = start_pair(R, "load")
    try:
        # warm every prompt on both engines, then measure
        asyncio.run(closed_loop(gw.port, 4, 5, prompts))
        rps = asyncio.run(closed_loop(gw.port, 8, duration, prompts))
    finally:
        for p in [gw] + [e.proc for e in engines]:
            p.stop()
    return rps


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_one(R, lb, load, cap, opts, prompts, seed):
    engines, gw = start_pair(R, lb)
    rate = cap * load
    warmup, duration = opts["warmup"], opts["step_duration"]
    try:
        res = asyncio.run(drive(gw.port, rate, warmup, duration, prompts, seed))
        stats = [e.counters() for e in engines]
    finally:
        for p in [gw] + [e.proc for e in engines]:
            p.stop()
    ok = [r for r in res if r["status"] == 200 and r["ttft"] is not None]
    ttfts = [r["ttft"] for r in ok]
    cached = sum(s.get("prompt_tokens_cached_total", 0) for s in stats)
    processed = sum(s.get("prompt_tokens_total", 0) for s in stats)
    by = {}
    for r in res:
        if r["provider"]:
            by[r["provider"]] = by.get(r["provider"], 0) + 1
    row = {
        "lb": lb, "load": load, "rate": round(rate, 2), "sent": len(res), "ok": len(ok),
        "shed": sum(1 for r in res if r["status"] == 429),
        "errors": sum(1 for r in res if r["status"] not in (200, 429)),
        "ttft_p50_ms": None if not ttfts else round(pct(ttfts, 50) * 1000, 1),
        "ttft_p99_ms": None if not ttfts else round(pct(ttfts, 99) * 1000, 1),
        "goodput_rps": round(sum(1 for t in ttfts if t <= SLO_S) / duration, 2),
        "answered_rps": round(len(ok) / duration, 2),
        "share_a": round(by.get("a", 0) / max(1, sum(by.values())), 3),
        "engine_cached_tokens": int(cached), "engine_processed_tokens": int(processed),
        "engine_cache_hit_rate": round(cached / (cached + processed), 3)
        if cached + processed else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    R.log(f"s10-real {lb:8s} {int(load * 100):3d}% {rate:5.2f} rps: ok {row['ok']} shed "
          f"{row['shed']} err {row['errors']} ttft p50 {row['ttft_p50_ms']} p99 "
          f"{row['ttft_p99_ms']} ms goodput {row['goodput_rps']}/s engine hits "
          f"{row['engine_cache_hit_rate']} share a {row['share_a']} load {row['loadavg_1m']}")
    return row


def llama_version():
    try:
        out = subprocess.run([os.environ["LLAMA_SERVER"], "--version"], capture_output=True,
                             text=True, timeout=30)
        text = (out.stdout + out.stderr).strip().splitlines()
        return "; ".join(line for line in text if "version" in line or "built" in line)
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv):
    opts = {"step_duration": 20, "warmup": 4, "loads": (0.5, 1.0, 1.5), "out": "s10-engines-real",
            "ringgate": None, "cal": 12}
    it = iter(argv)
    for a in it:
        if a == "--ringgate":
            opts["ringgate"] = os.path.abspath(next(it))
        elif a == "--step-duration":
            opts["step_duration"] = float(next(it))
        elif a == "--warmup":
            opts["warmup"] = float(next(it))
        elif a == "--loads":
            opts["loads"] = tuple(float(x) for x in next(it).split(","))
        elif a == "--out":
            opts["out"] = next(it)
        elif a == "--calibrate":
            opts["cal"] = float(next(it))
        else:
            raise SystemExit(f"unknown option {a!r}: see the module doc")
    if not (os.environ.get("LLAMA_SERVER") and os.environ.get("LLAMA_MODEL")):
        raise SystemExit('LLAMA_SERVER / LLAMA_MODEL: eval "$(.ci/llama-engine env)"')
    R = load_runner()
    if opts["ringgate"]:
        R.RINGGATE = opts["ringgate"]
    elif not os.path.exists(R.RINGGATE):
        R.RINGGATE = os.path.join(R.TARGET_DIR, "debug", "ringgate")
    prompts = system_prompts()
    env = R.environment(None)
    env["command"] = "benches/engines/real.py " + " ".join(argv)
    env["nice"] = os.nice(0)
    env["llama_server"] = llama_version()
    env["placement"] = ("engine A CPU 0, engine B CPU 1 (taskset), one thread each; gateway "
                        "(shards = 1) and client unpinned")
    env["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    try:
        cap = capacity(R, prompts, opts["cal"])
        R.log(f"s10-real capacity {cap:.2f} req/s (closed loop, 8 in flight, warm prompts)")
        rows = []
        for i, load in enumerate(opts["loads"]):
            order = LBS[i % 3:] + LBS[:i % 3]
            for lb in order:
                rows.append(run_one(R, lb, load, cap, opts, prompts, seed=2200 + i))
    finally:
        R.cleanup()
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"capacity_rps": round(cap, 2), "slo_ttft_s": SLO_S, "prompts": PROMPTS,
            "prompt_bytes": PROMPT_BYTES, "max_tokens": MAX_TOKENS, "cache_ram_mib": CACHE_MIB,
            "max_waiting": MAX_WAITING, "runs": rows}
    md = render(R, env, data)
    R.write_results(opts["out"], env, data, md, {})
    print(md)
    return 0


def render(R, env, data):
    rows = data["runs"]
    table = R.md_table(
        ["offered", "lb", "rps", "answered/s", f"goodput/s (TTFT ≤ {SLO_S:g} s)", "shed 429",
         "errors", "TTFT p50 ms", "TTFT p99 ms", "share to A", "engines' cached / prompt tokens",
         "load avg"],
        [[f"{int(r['load'] * 100)} %", r["lb"], r["rate"], r["answered_rps"], r["goodput_rps"],
          r["shed"], r["errors"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["share_a"],
          f"{r['engine_cache_hit_rate']} ({r['engine_cached_tokens']} / "
          f"{r['engine_cached_tokens'] + r['engine_processed_tokens']})", r["loadavg_1m"]]
         for r in rows])
    extra = (f"- Engines: two llama-server ({env['llama_server']}), SmolLM2-135M-Instruct Q4_1, "
             f"`-t 1 -tb 1 -np 2 -c 4096 --no-warmup --metrics --cache-ram {CACHE_MIB}`; "
             f"measured capacity {data['capacity_rps']} req/s (closed loop, warm prompts)\n"
             f"- Workload: {PROMPTS} shared system prompts of {PROMPT_BYTES} bytes, unique user "
             f"turns, stream, {MAX_TOKENS} output tokens (`ignore_eos`, greedy), Poisson "
             f"arrivals; TTFT from the intended send time; `load` with max_waiting = "
             f"{MAX_WAITING}\n"
             f"- Gateway: `engine = \"llamacpp\"` (the default `/slots` signal); nice {env['nice']}; "
             f"load average at start {env['loadavg_start']}, at end {env['loadavg_end']} (a "
             f"shared 2-core box: compare the balancers within this run, not with other runs)\n")
    return (R.md_header("S10 on real llama.cpp engines: lb = load vs weighted vs p2c", env, extra)
            + "\n" + table + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""S10 next to inference engines (docs/bench-protocol.md): lb = "load" vs weighted vs p2c.

Used by `benches/run engines`. Two simulated vLLM engines of unequal size and speed
(`ringgate mock --engine vllm`, docs/engine-simulator.md): A 8 slots at 20 ms/token, B 4 slots
at 30 ms/token, each with a 2,048-block prefix cache (~32k tokens). The workload shares system
prompts: every request picks one of 24 system prompts (8,000 bytes ≈ 2,000 tokens each, 48k
tokens in all: more than one engine's cache holds, about what two hold) plus a unique user
turn, streams, 32 output tokens. Open loop (Poisson arrivals, one connection per request) at
50 / 75 / 100 / 125 / 150 % of the pair's estimated capacity, for each balancer in turn
(interleaved per load level), each run on freshly started engines and gateway (cold caches):

  load      lb = "load", max_waiting = 8 (sheds with 429 beyond that)
  weighted  lb = "weighted", weights 2:1 (the engines' slot ratio: an informed static split)
  p2c       lb = "p2c" (the default: peak-EWMA latency x in-flight)

Reported per run: TTFT p50/p99 of answered requests (time to the first content token, from
the intended send time), goodput (answered requests with TTFT <= 1 s, per second), shed 429s,
errors, share of requests per engine, the engines' prefix-cache hit rate.
"""

import asyncio
import json
import os
import random
import re
import time

LBS = ("load", "weighted", "p2c")
LOADS = (0.5, 0.75, 1.0, 1.25, 1.5)
ENGINES = (("a", 8, 20), ("b", 4, 30))  # name, slots, ms per token
CACHE_BLOCKS = 2048
PROMPTS = 24
PROMPT_BYTES = 8000
OUTPUT_TOKENS = 32
SLO_S = 1.0


def capacity():
    """Requests/s the pair sustains (steady state, warm prefixes): slots / service time."""
    total = 0.0
    for _, slots, tpot in ENGINES:
        step = tpot * (1 + 0.06 * (slots - 1)) / 1000
        service = 0.015 + (OUTPUT_TOKENS - 1) * step
        total += slots / service
    return total


def system_prompts():
    rng = random.Random(10)
    words = ("policy order refund account shipping invoice warranty support escalate customer "
             "region tier premium standard return label carrier tracking delay damage").split()
    out = []
    for i in range(PROMPTS):
        text = f"You are assistant #{i} of ACME. "
        while len(text) < PROMPT_BYTES:
            text += rng.choice(words) + " "
        out.append(text[:PROMPT_BYTES])
    return out


def gateway_config(port, lb, engines):
    lines = ["[server]", f'listen = "127.0.0.1:{port}"', "shards = 1", "",
             "[upstream]", "first_byte_timeout_ms = 120000", "total_timeout_ms = 120000", ""]
    deps = []
    for (name, slots, _), port_e in zip(ENGINES, engines):
        lines += ["[[provider]]", f'name = "{name}"', 'kind = "openai-compatible"',
                  'engine = "vllm"', f'base_url = "http://127.0.0.1:{port_e}/v1"', ""]
        deps.append(f'{{ provider = "{name}", weight = {slots // 4} }}')
    lines += ["[[model]]", 'name = "llama-3.1-8b"', f"deployments = [ {', '.join(deps)} ]",
              f'lb = "{lb}"', "max_attempts = 1"]
    if lb == "load":
        lines.append("max_waiting = 8")
    return "\n".join(lines) + "\n"


async def one(port, body, due, out):
    t_due = due
    now = time.monotonic()
    if due > now:
        await asyncio.sleep(due - now)
    rec = {"status": None, "ttft": None, "total": None, "provider": None}
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        w.write(head + body)
        await w.drain()
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await asyncio.wait_for(r.read(65536), 120)
            if not chunk:
                break
            buf += chunk
        m = re.match(rb"HTTP/1\.1 (\d{3})", buf)
        rec["status"] = int(m.group(1)) if m else None
        pm = re.search(rb"\r\nx-ringgate-provider: ([a-z0-9]+)", buf, re.I)
        rec["provider"] = pm.group(1).decode() if pm else None
        if rec["status"] == 200:
            while True:
                if rec["ttft"] is None and re.search(rb'"delta":\{"content":"[^"]', buf):
                    rec["ttft"] = time.monotonic() - t_due
                if b"data: [DONE]" in buf:
                    break
                chunk = await asyncio.wait_for(r.read(65536), 120)
                if not chunk:
                    break
                buf += chunk
            rec["total"] = time.monotonic() - t_due
        w.close()
    except Exception as e:  # noqa: BLE001 (a failed request is a result)
        rec["error"] = type(e).__name__
    out.append(rec)


async def drive(port, rate, warmup, duration, prompts, seed):
    rng = random.Random(seed)
    t0 = time.monotonic() + 0.2
    t, tasks, measured, discard = 0.0, [], [], []
    n = 0
    while t < warmup + duration:
        t += rng.expovariate(rate)
        if t >= warmup + duration:
            break
        sysp = rng.choice(prompts)
        user = f"Request {seed}-{n}: my order {rng.randrange(10**9)} is late, what now? " * 3
        body = json.dumps({"model": "llama-3.1-8b", "stream": True, "max_tokens": OUTPUT_TOKENS,
                           "messages": [{"role": "system", "content": sysp},
                                        {"role": "user", "content": user}]}).encode()
        tasks.append(asyncio.ensure_future(
            one(port, body, t0 + t, measured if t >= warmup else discard)))
        n += 1
    await asyncio.gather(*tasks)
    return measured


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def engine_stats(R, port):
    import socket
    req = f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req)
        while True:
            c = s.recv(65536)
            if not c:
                break
            data += c
    vals = {}
    for m in re.finditer(rb"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.e+]+)$", data, re.M):
        vals[m.group(1).decode()] = float(m.group(2))
    return vals


def run_one(R, lb, load, cap, opts, prompts, seed):
    engines = []
    for name, slots, tpot in ENGINES:
        port = R.free_port()
        engines.append(R.Proc(f"engine-{name}", R.pin(R.HARNESS_CPU, [
            R.RINGGATE, "mock", "--engine", "vllm", "--slots", str(slots), "--tpot-ms",
            str(tpot), "--cache-blocks", str(CACHE_BLOCKS), "--model-name", "llama-3.1-8b",
            "--listen", f"127.0.0.1:{port}"]), port=port))
    gport = R.free_port()
    cfg = os.path.join(R.tmpdir(), f"s10-{lb}-{gport}.toml")
    with open(cfg, "w") as f:
        f.write(gateway_config(gport, lb, [e.port for e in engines]))
    gw = R.Proc(f"ringgate-{lb}", R.pin(R.GW_CPU, [R.RINGGATE, "--config", cfg]), port=gport,
                env=R.GATEWAY_ENV)
    time.sleep(0.3)  # a first poll of both engines (poll_ms = 100)
    rate = cap * load
    warmup, duration = opts.get("warmup", 5), opts.get("step_duration", 20)
    cpu0 = R.proc_cpu_ticks(gw.pid)
    res = asyncio.run(drive(gport, rate, warmup, duration, prompts, seed))
    cpu1 = R.proc_cpu_ticks(gw.pid)
    hits = [engine_stats(R, e.port) for e in engines]
    for p in [gw] + engines:
        p.stop()
    ok = [r for r in res if r["status"] == 200 and r["ttft"] is not None]
    ttfts = [r["ttft"] for r in ok]
    q = sum(h.get("vllm:prefix_cache_queries_total", 0) for h in hits)
    hit = sum(h.get("vllm:prefix_cache_hits_total", 0) for h in hits)
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
        "prefix_hit_rate": round(hit / q, 3) if q else None,
        "gateway_cpu_s": None if cpu0 is None or cpu1 is None
        else round((cpu1 - cpu0) / os.sysconf("SC_CLK_TCK"), 2),
    }
    R.log(f"s10 {lb:8s} {int(load * 100):3d}% {rate:5.1f} rps: ok {row['ok']} shed {row['shed']} "
          f"err {row['errors']} ttft p50 {row['ttft_p50_ms']} p99 {row['ttft_p99_ms']} ms "
          f"goodput {row['goodput_rps']}/s hit {row['prefix_hit_rate']} share a {row['share_a']}")
    return row


def run_s10(R, lg, opts, env):
    cap = capacity()
    prompts = system_prompts()
    loads = LOADS if not opts.get("smoke") else (0.5, 1.5)
    rows = []
    for i, load in enumerate(loads):
        order = LBS[i % 3:] + LBS[:i % 3]
        for lb in order:
            rows.append(run_one(R, lb, load, cap, opts, prompts, seed=1000 + i))
    env = dict(env, placement=f"gateway CPU {R.GW_CPU} (shards = 1); both engine simulators "
               f"and the Python client CPU {R.HARNESS_CPU}")
    data = {"capacity_rps": round(cap, 2), "slo_ttft_s": SLO_S, "engines": ENGINES,
            "cache_blocks": CACHE_BLOCKS, "prompts": PROMPTS, "prompt_bytes": PROMPT_BYTES,
            "output_tokens": OUTPUT_TOKENS, "runs": rows}
    md = render(R, env, data, charts=not opts.get("smoke"))
    if not opts.get("smoke"):
        R.write_results("s10-engines", env, data, md, opts)
    else:
        print(md)
    return 0


def render(R, env, data, charts=True):
    rows = data["runs"]
    table = R.md_table(
        ["offered", "lb", "rps", "answered/s", "goodput/s (TTFT ≤ 1 s)", "shed 429", "errors",
         "TTFT p50 ms", "TTFT p99 ms", "share to A (8 slots)", "prefix hit rate"],
        [[f"{int(r['load'] * 100)} %", r["lb"], r["rate"], r["answered_rps"], r["goodput_rps"],
          r["shed"], r["errors"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["share_a"],
          r["prefix_hit_rate"]] for r in rows])
    figs = []
    for key, title, ylabel, logy in (
            ("ttft_p99_ms", "S10: TTFT p99 vs offered load", "TTFT p99 (ms)", True),
            ("ttft_p50_ms", "S10: TTFT p50 vs offered load", "TTFT p50 (ms)", True),
            ("goodput_rps", "S10: goodput (TTFT <= 1 s) vs offered load", "requests/s", False)):
        series = [(lb, [(r["load"] * 100, r[key]) for r in rows if r["lb"] == lb], False)
                  for lb in LBS]
        name = f"s10-engines-{key.replace('_rps', '').replace('_ms', '')}.svg"
        if charts:
            R.svg_chart(os.path.join(R.RESULTS, name), title, series,
                        "offered load (% of capacity)", ylabel, logy=logy,
                        stamp=R.chart_stamp(env))
        figs.append(f"![{title}]({name})")
    extra = (f"- Engines: A {ENGINES[0][1]} slots at {ENGINES[0][2]} ms/token, B {ENGINES[1][1]} "
             f"slots at {ENGINES[1][2]} ms/token, {CACHE_BLOCKS}-block prefix caches; estimated "
             f"capacity {data['capacity_rps']} req/s\n- Workload: {PROMPTS} shared system prompts "
             f"of {PROMPT_BYTES} bytes, unique user turns, stream, {OUTPUT_TOKENS} output tokens, "
             f"Poisson arrivals; TTFT from the intended send time\n")
    return (R.md_header("S10 next to inference engines: lb = load vs weighted vs p2c", env, extra)
            + "\n" + table + "\n\n" + "\n\n".join(figs) + "\n")

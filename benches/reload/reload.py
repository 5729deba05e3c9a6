"""S9 config hot reload under load (docs/bench-protocol.md).

Used by `benches/run reload`. One gateway (`shards = 1`, CPU 0) with its admin listener, two
`ringgate mock --profile seed` upstreams (CPU 1). Two load generators at once (open loop,
keep-alive pools): chat non-stream and chat stream, on models `steady` (upstream A) and
`remote` (its upstream moves between A and B on every other reload). After a steady period,
RELOADS reloads, alternating SIGHUP and `POST /admin/reload`, each rewriting the file: model
`extra-N` added, `extra-(N-1)` removed, `remote`'s upstream swapped. Each reload is checked
(the new model answers, the old one 404s). The loadgen windows (`--windows-file`): `steady`
(before the first reload), `reload-N` (from the trigger to 1 s after the reload was seen
applied: the streams that straddle it have ended by then) and `between` (the rest after the
first reload). Reported: requests failed (non-2xx, transport errors, cut streams), p99 in the
reload windows against steady.
"""

import hashlib
import json
import os
import signal
import threading
import time
import urllib.request

RELOADS = 10
TOKEN = "s9-bench-admin-token-0f9e8d7c6b5a"
AFTER_MS = 1000


def now_ms():
    return int(time.time() * 1000)


def config(port, admin_port, a, b, step):
    up = b if step % 2 else a
    return f"""# S9 reload step {step}
[server]
listen = "127.0.0.1:{port}"
shards = 1

[admin]
listen = "127.0.0.1:{admin_port}"

[[provider]]
name = "a"
kind = "openai"
base_url = "{a}/v1"

[[provider]]
name = "up"
kind = "openai"
base_url = "{up}/v1"

[[model]]
name = "steady"
provider = "a"
upstream_model = "mock"

[[model]]
name = "remote"
provider = "up"
upstream_model = "mock"

[[model]]
name = "extra-{step}"
provider = "a"
upstream_model = "mock"
"""


def text_hash(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def admin(admin_port, method, path):
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port}{path}", method=method,
                                 headers={"Authorization": f"Bearer {TOKEN}"},
                                 data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def model_status(R, port, model):
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]})
    try:
        return R.http_post(port, "/v1/chat/completions", body.encode())[0]
    except Exception as e:  # noqa: BLE001 (reported as a failed check)
        return str(e)


def run_s9(R, lg, opts, env):
    d = R.tmpdir()
    smoke = bool(opts.get("smoke"))
    rate = opts.get("rate") or (100 if smoke else 400)
    srate = opts.get("stream_rate") or (20 if smoke else 50)
    reloads = 4 if smoke else RELOADS
    steady, gap = (3.0, 1.5) if smoke else (8.0, 2.5)
    duration = 2 + steady + reloads * (gap + 1.5) + 3
    mock_a = R.start_mock("seed", "-s9a")
    mock_b = R.start_mock("seed", "-s9b")
    a, b = R.mock_url(mock_a), R.mock_url(mock_b)
    port, admin_port = R.free_port(), R.free_port()
    path = os.path.join(d, "s9.toml")

    def write(step):
        text = config(port, admin_port, a, b, step)
        with open(path + ".new", "w") as f:
            f.write(text)
        os.replace(path + ".new", path)
        return text

    write(0)
    gw = R.Proc("ringgate-s9", R.pin(R.GW_CPU, [R.RINGGATE, "--config", path]), port=port,
                env=dict(R.GATEWAY_ENV, RINGGATE_ADMIN_TOKEN=TOKEN))
    R.wait_port(admin_port, 10)
    wfile = os.path.join(d, "windows.txt")
    open(wfile, "w").close()
    target = f"http://127.0.0.1:{port}"
    common = ["--duration", duration, "--warmup", 2, "--timeline", 100, "--windows-file",
              wfile, "--timeout-ms", 10000, "--connections", 512]
    results = {}

    def load(key, extra):
        try:
            results[key] = lg.run(target, None, f"s9 {key}", common + extra,
                                  timeout_s=duration + 120)
        except R.HarnessError as e:
            results[key] = {"error": str(e)}

    threads = [threading.Thread(target=load, args=("non-stream", ["--rate", rate, "--model",
                                                                  "steady"])),
               threading.Thread(target=load, args=("stream", ["--rate", srate, "--stream",
                                                              "--model", "remote"]))]
    t_launch = now_ms()
    for t in threads:
        t.start()
    time.sleep(2 + steady)
    windows = [("steady", t_launch + 2000, now_ms())]
    recs = []
    for step in range(1, reloads + 1):
        text = write(step)
        want = text_hash(text)
        how = "SIGHUP" if step % 2 else "admin"
        t0 = now_ms()
        report = None
        if how == "SIGHUP":
            os.kill(gw.p.pid, signal.SIGHUP)
        else:
            report = admin(admin_port, "POST", "/admin/reload")
        applied = None
        while now_ms() - t0 < 10000:
            st, cfg = admin(admin_port, "GET", "/admin/config")
            if st == 200 and cfg.get("hash") == want:
                applied = now_ms()
                break
            time.sleep(0.002)
        new_ok = model_status(R, port, f"extra-{step}")
        old_gone = model_status(R, port, f"extra-{step - 1}")
        rec = {"step": step, "trigger": how, "t_trigger_ms": t0,
               "applied_ms": (applied - t0) if applied else None,
               "new_model_status": new_ok, "removed_model_status": old_gone,
               "report_status": report[0] if report else None}
        recs.append(rec)
        windows.append((f"reload-{step}", t0, (applied or t0) + AFTER_MS))
        R.log(f"s9: reload {step} ({how}): applied in {rec['applied_ms']} ms; "
              f"extra-{step} {new_ok}, extra-{step - 1} {old_gone}")
        time.sleep(gap)
    first = recs[0]["t_trigger_ms"]
    end = t_launch + int((2 + duration) * 1000)
    # `between`: after the first reload, outside every reload window
    spans = sorted((w[1], w[2]) for w in windows[1:])
    cur = first
    for lo, hi in spans:
        if lo > cur:
            windows.append(("between", cur, lo))
        cur = max(cur, hi)
    if cur < end:
        windows.append(("between", cur, end))
    with open(wfile, "w") as f:
        f.write("".join(f"{n} {lo} {hi}\n" for n, lo, hi in windows))
    for t in threads:
        t.join()
    st, running = admin(admin_port, "GET", "/admin/config")
    gw.stop()
    mock_a.stop()
    mock_b.stop()
    for k, v in results.items():
        if "error" in v:
            raise R.HarnessError(f"s9 load generator {k}: {v['error'][-600:]}")
    return summarize(R, opts, env, results, recs, rate, srate, duration, running, smoke)


def _windows(t, prefix):
    return [w for w in (t.get("windows") or []) if w.get("name", "").startswith(prefix)]


def _merged_p99(R, ws):
    """The worst p99 of several windows and the total count (windows are merged per name by
    the load generator only when names repeat; reload windows have their own names)."""
    p99s = [R.pct(w["latency_us"], "p99") for w in ws if R.pct(w["latency_us"], "p99")]
    return (max(p99s) if p99s else None), sum(w["ok"] for w in ws), sum(w["errors"] for w in ws)


def summarize(R, opts, env, results, recs, rate, srate, duration, running, smoke):
    env = dict(env)
    env["placement"] = (f"gateway on CPU {R.GW_CPU} (shards = 1); two seed mocks and 2 load "
                        f"generators on CPU {R.HARNESS_CPU}")
    totals, rows, wrows, nrows = {}, [], [], []
    ok_all = all(r["applied_ms"] is not None and r["new_model_status"] == 200
                 and r["removed_model_status"] == 404 for r in recs)
    for key in ("non-stream", "stream"):
        t = R.tgt(results[key])
        e = t["errors"]
        cut = e.get("incomplete_stream", 0) if key == "stream" else 0
        totals[key] = {"sent": t["scheduled"], "ok": t["completed_ok"], "failed": e["total"],
                       "unfinished": t["unfinished"], "streams_cut": cut, "errors": e}
        if e["total"] or t["unfinished"] or cut:
            ok_all = False
        rows.append([key, f"{rate if key == 'non-stream' else srate:,}", f"{t['scheduled']:,}",
                     f"{t['completed_ok']:,}", e["total"], t["unfinished"],
                     cut if key == "stream" else "-", R.errs_str(t)])
        steady = _windows(t, "steady")
        sp99 = R.pct(steady[0]["latency_us"], "p99") if steady else None
        sp50 = R.pct(steady[0]["latency_us"], "p50") if steady else None
        for label, prefix in (("steady", "steady"), ("between reloads", "between"),
                              ("reload windows (worst)", "reload-")):
            ws = _windows(t, prefix)
            p99, ok, errs = _merged_p99(R, ws)
            wrows.append([key, label, len(ws), f"{ok:,}", errs, R.fms(p99),
                          R.fms(p99 - sp99) if p99 and sp99 and label != "steady" else "-"])
        per = [(w["name"], R.pct(w["latency_us"], "p99")) for w in _windows(t, "reload-")]
        totals[key]["reload_p99_ms"] = {n: (v / 1000 if v else None) for n, v in per}
        # each reload window against the quiet windows next to it (the machine's load drifts
        # over a minute; neighbours share it): between[i] follows reload-(i+1)
        betw = [R.pct(w["latency_us"], "p99") for w in _windows(t, "between")]
        diffs = []
        for i, (name, p99) in enumerate(per):
            near = [b for b in (betw[i - 1] if i > 0 and i - 1 < len(betw) else None,
                                betw[i] if i < len(betw) else None) if b]
            if p99 and near:
                base = sum(near) / len(near)
                diffs.append(p99 - base)
                nrows.append([key, name, R.fms(p99), R.fms(base), R.fms(p99 - base)])
        diffs.sort()
        totals[key]["added_p99_vs_neighbours_ms"] = {
            "median": diffs[len(diffs) // 2] / 1000 if diffs else None,
            "max": diffs[-1] / 1000 if diffs else None}
        totals[key]["steady_p50_ms"] = sp50 / 1000 if sp50 else None
        totals[key]["steady_p99_ms"] = sp99 / 1000 if sp99 else None
    verdict = ("**0 failed requests, 0 streams cut**" if ok_all else
               "**FAILED REQUESTS, CUT STREAMS OR A RELOAD NOT APPLIED** (see tables)")
    applied = [r["applied_ms"] for r in recs if r["applied_ms"] is not None]
    summary = (f"{len(recs)} reloads: sent {sum(t['sent'] for t in totals.values()):,}, failed "
               f"{sum(t['failed'] for t in totals.values())}, streams cut "
               f"{totals['stream']['streams_cut']}; reload seen applied after "
               f"{min(applied) if applied else '-'}–{max(applied) if applied else '-'} ms")
    if smoke:
        R.log(f"s9 smoke: {summary}: " + ("ok" if ok_all else "FAILED"))
        return 0 if ok_all else 1
    md = R.md_header(
        "S9 config hot reload under load", env,
        "- Upstreams: two `ringgate mock --profile seed` (non-stream answers after 50 ms; "
        "streams: first token at 50 ms, output over 500 ms)\n"
        f"- Load (open loop, at the same time): chat non-stream {rate:,} RPS on `steady` and "
        f"chat stream {srate:,} RPS on `remote`, {duration:g} s measured after 2 s warm-up\n"
        f"- {len(recs)} reloads {2.5:g} s apart after a steady period, alternating SIGHUP and "
        "`POST /admin/reload`; each rewrites the file: `extra-N` added, `extra-(N-1)` removed, "
        "`remote` moved to the other mock. Applied = `GET /admin/config` shows the new hash; "
        "then `extra-N` must answer 200 and `extra-(N-1)` 404\n"
        f"- Windows: `reload-N` = trigger → {AFTER_MS} ms after applied (the streams that "
        "straddle the swap end inside it); `between` = the rest after the first reload\n\n"
        f"Result: {verdict}. {summary}.\n\n")
    md += "## Requests\n\n" + R.md_table(
        ["load", "offered RPS", "sent", "ok", "failed", "unfinished", "streams cut",
         "errors by kind"], rows) + "\n"
    md += "\n## p99 around reloads against steady state\n\n" + R.md_table(
        ["load", "window", "windows", "ok", "errors", "p99 ms", "added p99 ms vs steady"],
        wrows) + "\n"
    md += ("\n## Each reload window against its neighbours\n\nThe p99 of each reload window next "
           "to the mean p99 of the `between` windows just before and after it (same minute of "
           "machine load).\n\n") + R.md_table(
        ["load", "window", "p99 ms", "neighbours' p99 ms", "added ms"], nrows) + "\n"
    for key in ("non-stream", "stream"):
        a = totals[key]["added_p99_vs_neighbours_ms"]
        if a["median"] is not None:
            md += (f"\n{key}: added p99 of a reload window against its neighbours: median "
                   f"{a['median']:+.2f} ms, largest {a['max']:+.2f} ms.")
    md += "\n"
    md += "\n## Reloads\n\n" + R.md_table(
        ["step", "trigger", "applied after ms", "new model", "removed model"],
        [[r["step"], r["trigger"], r["applied_ms"], r["new_model_status"],
          r["removed_model_status"]] for r in recs]) + "\n"
    md += ("\nThe stream p99 is the whole stream (~550 ms of upstream time). A reload window "
           "holds a few hundred requests, so its p99 is close to its maximum.\n")
    R.write_results("s9-reload", env, {"totals": totals, "reloads": recs, "summary": summary,
                                       "running_config": running, "loadgen": results}, md, opts)
    return 0 if ok_all else 1

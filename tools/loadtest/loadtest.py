"""A bounded load test of a running OpenAI-compatible server on this machine (loopback only; stdlib only).

    python3 tools/loadtest/loadtest.py --url http://127.0.0.1:8080 [--requests 300] [--clients 16] [--pid PID]

Sends a fixed, seeded mix of requests from concurrent clients: completions and chat, streamed and not, prompts short
and long, max_tokens 1..64, about 10% cancels (the connection is closed mid-stream) and 10% bad requests (invalid
JSON, n=2, max_tokens 0, an unknown model). Every request has a timeout and the whole run a deadline. At the end it
prints requests sent / completed / failed as expected / failed unexpectedly / lost or hung, the server's
`tensorfold_requests_running` and `tensorfold_requests_waiting` after a settle, and the server's RSS before and
after (with --pid). Exits non-zero if any request was lost, hung or failed unexpectedly, or lanes stay busy.
"""

import argparse
import ipaddress
import json
import queue
import random
import socket
import sys
import threading
import time
import urllib.parse
from http.client import HTTPConnection, HTTPException

WORDS = (
    "the of and to in is was for on that with as by at from his her an which be this are have it not were but "
    "all they one had their has more its also two after first new other into some time years over when these "
    "city river music team season school war system water energy garden window market story light morning "
    "function value return class import list string number error file table query server thread memory cache"
).split()

BAD_KINDS = ("invalid_json", "n_2", "max_tokens_0", "unknown_model")


class Server:
    """Where the server is and what every request carries."""

    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            sys.exit(f"--url must be http://HOST:PORT, got {url!r}")
        host = u.hostname
        if host != "localhost":
            try:
                if not ipaddress.ip_address(host).is_loopback:
                    sys.exit(f"refusing {host}: this load test only targets loopback addresses")
            except ValueError:
                sys.exit(f"refusing {host}: give a loopback address (127.0.0.1, ::1 or localhost)")
        self.host, self.port, self.timeout = host, u.port or 80, timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def conn(self):
        return HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get(self, path):
        """GET path: (status, body text), or (None, error) on a transport error."""
        c = self.conn()
        try:
            c.request("GET", path, headers=self.headers)
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        except (OSError, HTTPException) as e:
            return None, f"{type(e).__name__}: {e}"
        finally:
            c.close()

    def post_json(self, path, obj):
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(obj), headers=self.headers)
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        except (OSError, HTTPException) as e:
            return None, f"{type(e).__name__}: {e}"
        finally:
            c.close()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def plan(n, seed, model, long_words):
    """The seeded list of requests: dicts with kind (ok, cancel or a bad kind), path, body (bytes) and stream."""
    rng = random.Random(seed)
    out, bad = [], 0
    for i in range(n):
        r = rng.random()
        chat = rng.random() < 0.25
        stream = rng.random() < 0.5
        n_words = rng.randint(3, 40) if rng.random() < 0.6 else rng.randint(200, long_words)
        text = words(rng, n_words)
        body = {"max_tokens": rng.randint(1, 64), "temperature": rng.choice([0, 0.7, 1.0]), "seed": i}
        if model:
            body["model"] = model
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        kind = "ok"
        if r < 0.10:
            kind = "cancel"
            stream, body["max_tokens"] = True, 64
        elif r < 0.20:
            kind, bad = BAD_KINDS[bad % len(BAD_KINDS)], bad + 1
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        if kind == "n_2":
            body["n"] = 2
        elif kind == "max_tokens_0":
            body["max_tokens"] = 0
        elif kind == "unknown_model":
            body["model"] = "no-such-model-" + str(i)
        raw = json.dumps(body).encode()
        if kind == "invalid_json":
            raw = raw[: len(raw) // 2]
        path = "/v1/chat/completions" if chat else "/v1/completions"
        out.append({"i": i, "kind": kind, "path": path, "body": raw, "stream": stream, "max": body["max_tokens"]})
    return out


def read_sse(resp, deadline, cancel):
    """Reads an SSE body by lines. Returns (outcome, detail); a cancel returns once the first content arrives."""
    finish, tokens, chunks = None, None, 0
    while True:
        if time.monotonic() > deadline:
            return "hung", "the stream passed its deadline"
        line = resp.readline(1 << 20)
        if not line:
            return ("completed", f"{chunks} chunks") if finish else ("unexpected", "the stream ended without [DONE]")
        line = line.decode("utf-8", "replace").rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            if finish is None:
                return "unexpected", "[DONE] without a finish_reason"
            return "completed", f"{chunks} chunks, {tokens} tokens"
        try:
            v = json.loads(data)
        except ValueError:
            return "unexpected", f"a data line is not JSON: {data[:120]}"
        if v.get("error"):
            return "unexpected", f"error event: {v['error']}"
        for c in v.get("choices") or []:
            piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
            if piece:
                chunks += 1
                if cancel:
                    return "cancelled", "closed after the first content chunk"
            finish = c.get("finish_reason") or finish
        if v.get("usage"):
            tokens = v["usage"].get("completion_tokens")


def check_json(text, want_max):
    try:
        v = json.loads(text)
        c = v["choices"][0]
        n = v["usage"]["completion_tokens"]
        got = c.get("text") if "text" in c else c["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return "unexpected", f"malformed reply ({type(e).__name__}): {text[:160]}"
    if not isinstance(got, str) or not 1 <= n <= want_max or c.get("finish_reason") not in ("stop", "length"):
        return "unexpected", f"bad reply: {n} tokens (max {want_max}), finish {c.get('finish_reason')}"
    return "completed", f"{n} tokens"


def send(srv, req, timeout):
    """Runs one planned request; returns (outcome, detail) with outcome in completed, expected, cancelled,
    unexpected, hung or lost."""
    deadline = time.monotonic() + timeout
    c = srv.conn()
    try:
        c.request("POST", req["path"], body=req["body"], headers=srv.headers)
        sock = c.sock
        resp = c.getresponse()
        if req["kind"] in BAD_KINDS:
            body = resp.read().decode("utf-8", "replace")
            ok = 400 <= resp.status < 500 and '"error"' in body
            return ("expected" if ok else "unexpected"), f"HTTP {resp.status}: {body[:160]}"
        if resp.status != 200:
            return "unexpected", f"HTTP {resp.status}: {resp.read().decode('utf-8', 'replace')[:160]}"
        if not req["stream"]:
            return check_json(resp.read().decode("utf-8", "replace"), req["max"])
        out = read_sse(resp, deadline, req["kind"] == "cancel")
        if out[0] == "cancelled" and sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return out
    except socket.timeout:
        return "hung", f"no byte for {srv.timeout} s"
    except (OSError, HTTPException) as e:
        return "lost", f"{type(e).__name__}: {e}"
    finally:
        c.close()


def metrics(srv):
    """running and waiting from /metrics (None where absent)."""
    status, text = srv.get("/metrics")
    got = {"tensorfold_requests_running": None, "tensorfold_requests_waiting": None}
    if status != 200:
        return got
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in got:
            try:
                got[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return got


def rss_kib(pid):
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    ap.add_argument("--deadline", type=float, default=1200.0, help="seconds the whole run may take")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait for lanes to empty at the end")
    ap.add_argument("--long-words", type=int, default=1500, help="words of the longest prompt (capped by context)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pid", type=int, help="server process id, for VmRSS before and after")
    ap.add_argument("--api-key")
    ap.add_argument("--model", help="model name to send (default: the first id of /v1/models)")
    ap.add_argument("--json", help="write every request's outcome here")
    a = ap.parse_args()
    if not 1 <= a.requests <= 10000 or not 1 <= a.clients <= 256:
        sys.exit("--requests must be in [1, 10000] and --clients in [1, 256]")
    srv = Server(a.url, a.api_key, a.timeout)
    status, text = srv.get("/health")
    if status != 200:
        sys.exit(f"the server is not healthy: {status} {text[:200]}")
    model, context = a.model, None
    status, text = srv.get("/v1/models")
    if status == 200:
        try:
            first = json.loads(text)["data"][0]
            model = model or first["id"]
            context = first.get("max_model_len")
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    long_words = a.long_words
    if context:
        # Keep the longest prompt plus 64 tokens inside the context, measured with /tokenize where it exists.
        per_word = 2.0
        status, text = srv.post_json("/tokenize", {"prompt": words(random.Random(1), 200)})
        if status == 200:
            try:
                per_word = max(json.loads(text)["count"] / 200 * 1.2, 0.5)
            except (ValueError, KeyError, TypeError):
                pass
        long_words = max(200, min(long_words, int((context - 64 - 64) / per_word)))
    reqs = plan(a.requests, a.seed, model, long_words)
    rss_before = rss_kib(a.pid)
    print(f"server {a.url}  model {model}  context {context}  requests {a.requests}  clients {a.clients}  "
          f"longest prompt {long_words} words")
    todo = queue.Queue()
    for r in reqs:
        todo.put(r)
    results, lock = [], threading.Lock()
    stop_at = time.monotonic() + a.deadline
    t0 = time.monotonic()

    def worker():
        while time.monotonic() < stop_at:
            try:
                r = todo.get_nowait()
            except queue.Empty:
                return
            t = time.monotonic()
            outcome, detail = send(srv, r, min(a.timeout, max(stop_at - t, 1.0)))
            with lock:
                results.append({"i": r["i"], "kind": r["kind"], "path": r["path"], "stream": r["stream"],
                                "outcome": outcome, "detail": detail, "seconds": round(time.monotonic() - t, 3)})

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(stop_at - time.monotonic(), 0) + a.timeout + 5)
    wall = time.monotonic() - t0
    with lock:
        done = list(results)
    stuck = sum(t.is_alive() for t in threads)
    count = {k: sum(r["outcome"] == k for r in done) for k in
             ("completed", "expected", "cancelled", "unexpected", "hung", "lost")}
    not_sent = len(reqs) - len(done) - stuck
    for r in sorted(done, key=lambda r: r["i"]):
        if r["outcome"] in ("unexpected", "hung", "lost"):
            print(f"  request {r['i']} ({r['kind']}, {r['path']}, stream {r['stream']}): {r['outcome']}: "
                  f"{r['detail']}")
    m = metrics(srv)
    settle_until = time.monotonic() + a.settle
    while any(v not in (0, None) for v in m.values()) and time.monotonic() < settle_until:
        time.sleep(0.25)
        m = metrics(srv)
    rss_after = rss_kib(a.pid)
    lost_hung = count["hung"] + count["lost"] + stuck
    print(f"wall {wall:.1f} s")
    print(f"requests: {len(reqs)} planned, {len(done) + stuck} sent, {count['completed']} completed, "
          f"{count['expected'] + count['cancelled']} failed as expected ({count['expected']} bad requests answered "
          f"4xx, {count['cancelled']} cancelled), {count['unexpected']} failed unexpectedly, {lost_hung} lost or "
          f"hung, {not_sent} not sent (deadline)")
    running, waiting = m["tensorfold_requests_running"], m["tensorfold_requests_waiting"]
    print(f"after settle: tensorfold_requests_running {running}, tensorfold_requests_waiting {waiting}")
    if a.pid is not None:
        fmt = lambda k: "?" if k is None else f"{k / 1024:.1f} MiB"
        print(f"server RSS (pid {a.pid}): before {fmt(rss_before)}, after {fmt(rss_after)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"counts": count, "lost_or_hung": lost_hung, "not_sent": not_sent, "wall_s": wall,
                       "metrics_after": m, "rss_kib": [rss_before, rss_after], "requests": done}, f, indent=1)
    bad = lost_hung or count["unexpected"] or not_sent or running != 0 or waiting != 0
    print("result: FAIL" if bad else "result: PASS")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

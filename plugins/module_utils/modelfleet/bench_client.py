"""The benchmark client: streams requests to an OpenAI-compatible server (vLLM) and records timings.

Closed loop (fixed concurrency) or open loop (Poisson arrivals at a request rate, optionally capped by a
concurrency). Prompts are random token ids (completions, exact input length, no tokenizer needed) or
random words (chat; the input length is then the server's count). Every request asks for
`ignore_eos` and `stream_options.include_usage`, so token counts are the server's.

Truth checks recorded per point: /metrics before and after (reconciliation) and sampled during the point
(waiting/running requests, KV usage); the client's own CPU and event-loop lag; several client processes
(fork) when one core cannot keep up.

HTTP is sse_http's (keep-alive connections, httptools' parser): a streamed answer's events are read from the
transport's callback, not by a task woken per read. Needs httptools (present in every vLLM venv, and in modelfleet's
own venv); uvloop is used where present.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import time

from ansible.module_utils.urls import open_url
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench, fastjson, sse_http

TICK = 0.010
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
          "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def _arun(coro):
    """Run the client's event loop: uvloop's when it is installed (modelfleet's venv has it, and vLLM's, as
    uvicorn's loop), which spends about a fifth less CPU per streamed token than asyncio's
    (benchmarks/bench_side_by_side.py, docs/benchmark.md); asyncio's otherwise (also with a uvloop older than
    0.18, which has no run())."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    run = getattr(uvloop, "run", None)
    return run(coro) if run else asyncio.run(coro)


def default_config() -> dict:
    return {
        "base_url": "http://127.0.0.1:8000", "model": "", "api_key": "", "endpoint": "completions",
        "input_len": 128, "output_len": 128, "vocab_size": 0, "seed": 0, "warmup": 2,
        "processes": 1, "request_timeout_s": 600.0, "metrics_interval_s": 0.5,
        "goodput_ttft_ms": None, "goodput_tpot_ms": None, "max_cpu_fraction": 0.9, "max_lag_p99_ms": 25.0,
        "reconcile_tolerance": bench.RECONCILE_TOLERANCE, "tokenizer": None, "workload": "random", "prefix_len": 0,
        "turns": 3,
        # a reasoning model's thinking, in tokens per request (vLLM's thinking_token_budget; chat endpoint, a
        # server with a reasoning parser): None = the model ends its reasoning itself
        "thinking_budget": None,
        "server_pid": 0, "gpu_telemetry": True,
        # a file whose appearance stops the sending (the requests in flight finish): a load that lasts as long
        # as something else does (a rolling switch through the fleet endpoint)
        "stop_file": None,
        # the servers whose /metrics count a point's tokens: [] = base_url itself; through a fleet endpoint, its
        # replicas (the endpoint answers /metrics from one replica at a time)
        "metrics_urls": [],
    }


def _headers(cfg: dict) -> dict:
    h = {"Content-Type": "application/json"}
    if cfg.get("api_key"):
        h["Authorization"] = f"Bearer {cfg['api_key']}"
    return h


WORKLOADS = ("random", "shared-prefix", "multi-turn")


def make_prompts(cfg: dict, n: int, salt: int) -> list:
    """n prompts of input_len: token-id lists when vocab_size is known (completions), else word strings. The
    shared-prefix workload starts every prompt with the same prefix_len tokens (a system prompt every user of a
    chat service sends; what prefix caching saves), the rest different per prompt. The multi-turn workload gives
    n sessions instead (make_sessions)."""
    rng = random.Random(cfg["seed"] * 1_000_003 + salt)
    workload = cfg.get("workload") or "random"
    if workload not in WORKLOADS:
        raise bench.BenchError(f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    budget = cfg.get("thinking_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise bench.BenchError(f"thinking_budget must be a whole number of tokens >= 0, got {budget!r}")
    if budget is not None and cfg["endpoint"] != "chat":
        raise bench.BenchError("thinking_budget limits a reasoning model's thinking, which only the chat endpoint "
                               "streams apart from the answer; set endpoint to chat")
    shared = min(int(cfg.get("prefix_len") or cfg["input_len"] // 2), cfg["input_len"]) \
        if workload in ("shared-prefix", "multi-turn") else 0
    fixed = random.Random(cfg["seed"] * 7_919 + 1)  # the same prefix in every point of the run
    ids = cfg["endpoint"] == "completions" and cfg.get("vocab_size")
    # token ids: skip the lowest (special and byte tokens) and stay inside the tokenizer's range
    lo, hi = (min(100, cfg["vocab_size"] // 4), cfg["vocab_size"]) if ids else (0, 0)
    prefix = [fixed.randrange(lo, hi) for _dummy in range(shared)] if ids else \
        [fixed.choice(_WORDS) for _dummy in range(shared)]
    if workload == "multi-turn":
        return make_sessions(cfg, n, rng, prefix, bool(ids), lo, hi)
    out = []
    for _dummy in range(n):
        if ids:
            out.append(prefix + [rng.randrange(lo, hi) for _dummy in range(cfg["input_len"] - shared)])
        else:
            out.append(" ".join(prefix + [rng.choice(_WORDS) for _dummy in range(cfg["input_len"] - shared)]))
    return out


def make_sessions(cfg: dict, n: int, rng, prefix: list, ids: bool, lo: int, hi: int) -> list:
    """n multi-turn sessions: each the shared system prompt (`prefix`, the same in every session), then `turns`
    user messages of input_len - len(prefix) tokens each; every turn is sent after the answer to the one before,
    with the whole conversation so far (turn_prompt). The first turn has the shape of a shared-prefix prompt."""
    turns = 3 if cfg.get("turns") is None else cfg["turns"]
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise bench.BenchError(f"turns must be a whole number of at least 1, got {turns!r}")
    user = cfg["input_len"] - len(prefix)
    if user < 1:
        raise bench.BenchError(f"multi-turn: the system prompt (prefix_len {len(prefix)}) leaves no token of "
                               f"input_len {cfg['input_len']} for the user's turns; set a smaller prefix_len")
    out = []
    for _dummy in range(n):
        if ids:
            out.append({"system": prefix, "turns": [[rng.randrange(lo, hi) for _d in range(user)]
                                                    for _t in range(turns)],
                        # token ids of an answer are not streamed: the history holds a stand-in of the same length
                        "replies": [[rng.randrange(lo, hi) for _d in range(cfg["output_len"])]
                                    for _t in range(turns - 1)]})
        else:
            out.append({"system": " ".join(prefix),
                        "turns": [" ".join(rng.choice(_WORDS) for _d in range(user)) for _t in range(turns)]})
    return out


def turn_prompt(cfg: dict, item: dict, k: int, answers: list):
    """What turn k (0-based) of a session sends: the system prompt, each earlier turn and its answer, then turn k.
    Token ids (completions): the earlier answers are the session's stand-ins (`replies`); words: the answers the
    server streamed (`answers`), as chat messages on the chat endpoint, else one text."""
    if "replies" in item:
        ids = list(item["system"])
        for i in range(k):
            ids += item["turns"][i] + item["replies"][i]
        return ids + item["turns"][k]
    if cfg["endpoint"] == "chat":
        msgs = [{"role": "system", "content": item["system"]}] if item["system"] else []
        for i in range(k):
            msgs += [{"role": "user", "content": item["turns"][i]}, {"role": "assistant", "content": answers[i]}]
        return msgs + [{"role": "user", "content": item["turns"][k]}]
    parts = [item["system"]] if item["system"] else []
    for i in range(k):
        parts += [item["turns"][i], answers[i]]
    return " ".join([*parts, item["turns"][k]])


def _payload(cfg: dict, prompt) -> dict:
    body = {"model": cfg["model"], "max_tokens": cfg["output_len"], "stream": True, "ignore_eos": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}
    if cfg.get("thinking_budget") is not None:
        body["thinking_token_budget"] = cfg["thinking_budget"]
    if cfg["endpoint"] == "chat" and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        body["messages"] = prompt  # a conversation (multi-turn)
    elif cfg["endpoint"] == "chat":
        body["messages"] = [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]
    else:
        body["prompt"] = prompt
    return body


def _is_token_step(chunk: dict, chat: bool) -> bool:
    """A chunk that carries a generation step. Completions: any chunk with a choice (its text can be empty
    while a multi-byte character is incomplete). Chat: not the role-only opening delta, which the server
    sends before generating anything."""
    choices = chunk.get("choices") or []
    if not choices:
        return False
    if not chat:
        return True
    d = choices[0].get("delta") or {}
    return any(k in d for k in ("content", "reasoning_content", "reasoning", "tool_calls")) and not (
        d.get("role") and not d.get("content"))


def _on_event(rec: dict, data: bytes, now: float, chat: bool, text: list, keep_text: bool) -> bool:
    """One server-sent event's data into `rec`: a generation step (at `now`), the usage record, or an error.
    True when the stream is over ([DONE] or an error event)."""
    if data == b"[DONE]":
        return True
    chunk = fastjson.loads(data)
    if "error" in chunk:
        err = chunk["error"]
        rec["error"] = str(err.get("message") if isinstance(err, dict) else err)[:200]
        return True
    if _is_token_step(chunk, chat):
        rec["chunk_times"].append(now)
        if chat:
            d = chunk["choices"][0].get("delta") or {}
            if d.get("reasoning") is not None or d.get("reasoning_content") is not None:
                rec["reasoning_steps"] += 1
            if rec["answer_at"] is None and (d.get("content") is not None or d.get("tool_calls")):
                rec["answer_at"] = now
            if keep_text:  # a conversation's history holds the answer, never the reasoning
                text.append(d.get("content") or "")
        elif keep_text:
            text.append(chunk["choices"][0].get("text") or "")
    usage = chunk.get("usage")
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens") or 0
        rec["completion_tokens"] = usage.get("completion_tokens") or 0
        details = usage.get("completion_tokens_details") or {}
        if chat and details.get("reasoning_tokens") is not None:
            rec["server_reasoning_tokens"] = details["reasoning_tokens"]
    return False


class _EventSink:
    """A response's server-sent events into `rec`, fed each piece of the body as the connection receives it (from
    the transport's callback: no task wakes per read). A step is timed when its read arrived; events after the
    stream's end ([DONE], an error event) are ignored. An answer that is not 200 keeps its first bytes for the
    error."""

    __slots__ = ("rec", "chat", "text", "keep_text", "rest", "over", "other")

    def __init__(self, rec: dict, chat: bool, text: list, keep_text: bool):
        self.rec, self.chat, self.text, self.keep_text = rec, chat, text, keep_text
        self.rest, self.over, self.other = b"", False, b""

    def feed(self, status: int, block: bytes) -> None:
        if status != 200:
            if len(self.other) < 1000:
                self.other += block
            return
        if self.over:
            return
        now = time.perf_counter()
        lines = (self.rest + block).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and _on_event(self.rec, line[5:].strip(), now, self.chat, self.text,
                                                       self.keep_text):
                self.over = True
                return

    def finish(self) -> None:
        """The body ended: a last event whose line end never came is still read; then the usage check."""
        line = self.rest.strip()
        if not self.over and line.startswith(b"data:"):
            _on_event(self.rec, line[5:].strip(), time.perf_counter(), self.chat, self.text, self.keep_text)
        _check_usage(self.rec)


def _check_usage(rec: dict) -> None:
    if not rec["completion_tokens"] and not rec["error"]:
        rec["error"] = "the stream ended without a usage record (server too old for include_usage?)"


async def one_request(pool, cfg: dict, prompt, scheduled: float | None = None, keep_text: bool = False) -> dict:
    """One streamed request through `pool` (_session). Its latency is counted from `scheduled` (an open-loop
    arrival: the moment the user asked) when given, else from now; `sent` is when it actually went out, so
    `sent - start` is the time it waited in the client for a free slot - part of the latency the user sees, never
    hidden. keep_text: the answer's text in rec["text"] (a session's next turn sends it back)."""
    chat = cfg["endpoint"] == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    sent = time.perf_counter()
    rec = {"start": sent if scheduled is None else scheduled, "sent": sent, "end": 0.0, "chunk_times": [],
           "prompt_tokens": 0, "completion_tokens": 0, "error": ""}
    if chat:  # a reasoning model's stream: its reasoning steps, and when the answer began
        rec.update(reasoning_steps=0, answer_at=None)
    text: list = []
    sink = _EventSink(rec, chat, text, keep_text)
    try:
        # The request's deadline is one timer for the whole request. asyncio.TimeoutError: the builtin one from
        # Python 3.11, its own class before (a vLLM venv may be older than the controller's Python).
        status = await asyncio.wait_for(pool.request("POST", path, json.dumps(_payload(cfg, prompt)).encode(),
                                                     sink.feed), cfg["request_timeout_s"])
        if status != 200:
            rec["error"] = f"HTTP {status}: {sink.other.decode('utf-8', 'replace')}"[:200]
        else:
            sink.finish()
    except asyncio.TimeoutError:  # noqa: UP041 - see above
        rec["error"] = f"no whole answer within request_timeout_s ({cfg['request_timeout_s']} s)"
    except sse_http.HttpError as e:
        rec["error"] = str(e)[:200]
    except fastjson.JSONError as e:  # the last event (no line end after it) is not JSON
        rec["error"] = f"bad answer from the server: {type(e).__name__}: {e}"[:200]
    rec["end"] = time.perf_counter()
    if keep_text:
        rec["text"] = "".join(text)
    return rec


async def _send(session, cfg: dict, item, scheduled: float | None = None) -> list:
    """The records of one item: a prompt (one request) or a session (its turns one after another, each with the
    conversation so far; the first counted from `scheduled`). A session ends at a failed turn (its history is
    broken) or once the stop file appears."""
    if not (isinstance(item, dict) and "turns" in item):
        return [await one_request(session, cfg, item, scheduled)]
    stop_file, recs, answers = cfg.get("stop_file"), [], []
    words = "replies" not in item
    for k in range(len(item["turns"])):
        if k and stop_file and os.path.exists(stop_file):
            break
        rec = await one_request(session, cfg, turn_prompt(cfg, item, k, answers), scheduled if k == 0 else None,
                                keep_text=words)
        rec["turn"] = k + 1
        answers.append(rec.pop("text", ""))
        recs.append(rec)
        if rec["error"]:
            break
    return recs


class _LagTicker:
    """The event loop's lag: a callback due every TICK, the lateness of each call kept in `lags` (ms). A timer
    callback, not a task that sleeps: the check costs the client less than the streams it watches."""

    def __init__(self, lags: list):
        self.lags, self.loop = lags, asyncio.get_running_loop()
        self.handle = self.loop.call_later(TICK, self._tick, time.perf_counter() + TICK)

    def _tick(self, due: float) -> None:
        now = time.perf_counter()
        self.lags.append(max(now - due, 0.0) * 1000)
        self.handle = self.loop.call_later(TICK, self._tick, now + TICK)

    def stop(self) -> None:
        self.handle.cancel()


def _session(cfg: dict, limit: int, base_url: str | None = None) -> sse_http.Pool:
    """Keep-alive connections to the server (base_url, default the point's), up to `limit` requests at once."""
    try:
        return sse_http.Pool(base_url or cfg["base_url"], limit, _headers(cfg))
    except (ImportError, ValueError) as e:
        raise bench.BenchError(str(e)) from None


async def _drive(cfg: dict, prompts: list, concurrency: int | None, rate: float | None, start_at: float) -> dict:
    """Run prompts closed-loop at `concurrency`, or Poisson at `rate` (capped by concurrency when given)."""
    lags: list = []
    records: list = []
    stop_file = cfg.get("stop_file")
    async with _session(cfg, concurrency or len(prompts)) as session:
        delay = start_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ticker = _LagTicker(lags)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if rate:
            # Open loop: Poisson arrivals on an absolute schedule (a late event loop does not stretch it), and
            # each request's latency counted from its scheduled arrival, including any wait for a client slot
            # when a concurrency cap is given.
            rng = random.Random(cfg["seed"] + 7)
            sem = asyncio.Semaphore(concurrency) if concurrency else None

            async def timed(p, scheduled):
                if sem is None:
                    records.extend(await _send(session, cfg, p, scheduled))
                    return
                async with sem:
                    records.extend(await _send(session, cfg, p, scheduled))

            tasks = []
            arrival = time.perf_counter()
            for p in prompts:
                delay = arrival - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if stop_file and os.path.exists(stop_file):
                    break
                tasks.append(asyncio.create_task(timed(p, arrival)))
                arrival += rng.expovariate(rate)
            await asyncio.gather(*tasks)
        else:
            queue = list(reversed(prompts))

            async def worker():
                while queue and not (stop_file and os.path.exists(stop_file)):
                    records.extend(await _send(session, cfg, queue.pop()))

            await asyncio.gather(*(worker() for _dummy in range(min(concurrency, len(prompts)))))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        ticker.stop()
    return {"records": records, "cpu_fraction": cpu / wall if wall > 0 else 0.0, "loop_lag_ms": lags}


def _child(cfg, prompts, concurrency, rate, start_at, conn) -> None:
    try:
        conn.send(_arun(_drive(cfg, prompts, concurrency, rate, start_at)))
    except BaseException as e:  # the parent reports it
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def _metrics_urls(cfg: dict) -> list:
    return [u.rstrip("/") for u in cfg.get("metrics_urls") or []] or [cfg["base_url"]]


def scrape(cfg: dict) -> list:
    """One /metrics text per server that counts the point's tokens (see metrics_urls)."""
    texts = []
    for url in _metrics_urls(cfg):
        with open_url(url + "/metrics", headers=_headers(cfg), timeout=10) as r:
            texts.append(r.read().decode("utf-8", "replace"))
    return texts


def snapshot(texts: list, model: str | None) -> dict:
    """The servers' counters and gauges as one (bench.combine_snapshots)."""
    return bench.combine_snapshots([bench.server_snapshot(t, model) for t in texts])


async def _get_text(pool: sse_http.Pool, path: str) -> str | None:
    """A GET's whole body as text; None for an answer that is not 200."""
    parts: list = []
    status = await pool.request("GET", path, b"", lambda _status, block: parts.append(block))
    return b"".join(parts).decode("utf-8", "replace") if status == 200 else None


async def _sample_gauges(cfg: dict, stop: asyncio.Event, out: list) -> None:
    pools = [_session(cfg, 1, url) for url in _metrics_urls(cfg)]
    try:
        while not stop.is_set():
            try:
                texts = []
                for pool in pools:
                    # keep the raw text: parsing here would stall the event loop the lag check measures
                    texts.append(await asyncio.wait_for(_get_text(pool, "/metrics"), 10))
                if None not in texts:
                    out.append(texts)
            except (asyncio.TimeoutError, sse_http.HttpError):  # noqa: UP041 - Python 3.10 vLLM venvs
                pass
            try:
                await asyncio.wait_for(stop.wait(), cfg["metrics_interval_s"])
            except asyncio.TimeoutError:  # noqa: UP041 - Python 3.10 vLLM venvs
                pass
    finally:
        for pool in pools:
            pool.close()


class _TelemetryThread:
    """The server's CPU (cfg server_pid: its process tree) and the host's GPUs sampled every metrics interval, in a
    thread of its own: /proc walks and NVML calls would otherwise stall the event loop whose lag is measured."""

    def __init__(self, cfg: dict):
        import threading

        from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import telemetry

        self.t, self.cfg, self.samples = telemetry, cfg, []
        self.pid = int(cfg.get("server_pid") or 0)
        self.gpu = telemetry.GpuSampler() if cfg.get("gpu_telemetry", True) else None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        s = {"t": time.perf_counter()}
        if self.pid:
            s["server_cpu_s"] = self.t.proc_tree_cpu_seconds(self.pid)
        if self.gpu is not None and self.gpu.kind:
            s["gpus"] = self.gpu.sample()
        self.samples.append(s)

    def _run(self):
        self._sample()
        while not self.stop.wait(self.cfg["metrics_interval_s"]):
            self._sample()
        self._sample()  # the end of the point: a point shorter than the interval still has one interval

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.ident is not None:  # started
            self.thread.join(10)

    def summary(self) -> dict:
        out = self.t.summarise(self.samples)
        out["gpu_source"] = self.gpu.kind if self.gpu is not None else None
        return out


def _split(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def _run_parts(cfg: dict, prompts: list, procs: int, concurrency, request_rate, num_prompts: int,
               start_at: float, samples: list, tele: _TelemetryThread) -> list:
    """The point's requests, in this process or split over `procs` forked client processes, with /metrics
    sampled meanwhile into `samples` and the telemetry thread started (after the forks: never fork beside a
    running thread); returns each process's part."""
    if procs == 1:
        tele.__enter__()

        async def main():
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample_gauges(cfg, stop, samples))
            res = await _drive(cfg, prompts, concurrency, request_rate, start_at)
            stop.set()
            await sampler
            return [res]
        parts = _arun(main())
    else:
        ctx = multiprocessing.get_context("fork")
        shares = _split(num_prompts, procs)
        conc = _split(concurrency, procs) if concurrency else [None] * procs
        children, offset = [], 0
        for i in range(procs):
            parent_end, child_end = ctx.Pipe(duplex=False)
            sub = dict(cfg, seed=cfg["seed"] + i)
            p = ctx.Process(target=_child, args=(sub, prompts[offset:offset + shares[i]], conc[i],
                                                 request_rate / procs if request_rate else None, start_at,
                                                 child_end), daemon=True)
            offset += shares[i]
            p.start()
            child_end.close()
            children.append((p, parent_end))
        tele.__enter__()

        async def main():
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample_gauges(cfg, stop, samples))
            loop = asyncio.get_running_loop()
            got = await asyncio.gather(*(loop.run_in_executor(None, c.recv) for _dummy, c in children))
            stop.set()
            await sampler
            return got
        parts = _arun(main())
        for p, c in children:
            p.join(10)
            c.close()
        errs = [x["error"] for x in parts if "error" in x]
        if errs:
            raise bench.BenchError(f"a client process failed: {errs[0]}")
    return parts


def run_point(cfg: dict, *, concurrency: int | None = None, request_rate: float | None = None,
              num_prompts: int = 8) -> dict:
    """One benchmark point: warm-up, scrape, run (1..N client processes), scrape, metrics and checks."""
    if not concurrency and not request_rate:
        raise bench.BenchError("a point needs a concurrency or a request rate")
    procs = max(1, min(int(cfg.get("processes") or 1), concurrency or num_prompts, num_prompts))
    if cfg.get("warmup"):
        w = make_prompts(dict(cfg, turns=1), cfg["warmup"], salt=-1)
        _arun(_drive(cfg, w, min(cfg["warmup"], concurrency or cfg["warmup"]), None, 0.0))
    try:
        before = snapshot(scrape(cfg), cfg["model"])
    except OSError as e:
        raise bench.BenchError(f"cannot read /metrics of {', '.join(_metrics_urls(cfg))} ({e}); is the server up "
                               "and the API key right?") from e
    prompts = make_prompts(cfg, num_prompts, salt=concurrency or int(request_rate * 1000))
    samples: list = []
    start_at = time.perf_counter() + (0.3 if procs > 1 else 0.0)
    tele = _TelemetryThread(cfg)
    try:
        parts = _run_parts(cfg, prompts, procs, concurrency, request_rate, num_prompts, start_at, samples, tele)
    finally:
        tele.__exit__()
    after = snapshot(scrape(cfg), cfg["model"])
    samples = [snapshot(texts, cfg["model"]) for texts in samples]
    records = [r for part in parts for r in part["records"]]
    m = bench.point_metrics(records, goodput_ttft_ms=cfg.get("goodput_ttft_ms"),
                            goodput_tpot_ms=cfg.get("goodput_tpot_ms"))
    m.update(bench.reconcile(m["total_output_tokens"], before, after, cfg["reconcile_tolerance"]))
    m.update(bench.prefix_cache(before, after))
    if cfg.get("workload") == "multi-turn":
        m["sessions"] = {"count": num_prompts, "turns": cfg.get("turns") or 3, "by_turn": bench.by_turn(records)}
    m["telemetry"] = tele.summary()
    m.update(bench.client_health([x["cpu_fraction"] for x in parts], [v for x in parts for v in x["loop_lag_ms"]],
                                 max_cpu_fraction=cfg["max_cpu_fraction"], max_lag_p99_ms=cfg["max_lag_p99_ms"]))
    waits = [s["requests_waiting"] for s in samples if s.get("requests_waiting") is not None]
    kvs = [s["kv_cache_usage"] for s in samples if s.get("kv_cache_usage") is not None]
    runs = [s["requests_running"] for s in samples if s.get("requests_running") is not None]
    m.update({
        "max_concurrency": concurrency, "request_rate": request_rate if request_rate else "inf",
        "num_prompts": num_prompts, "sent": len(records), "client_processes": procs,
        "server_requests_waiting_max": max(waits) if waits else None,
        "server_requests_running_max": max(runs) if runs else None,
        "server_kv_cache_usage_max": max(kvs) if kvs else None,
        "server_metric_samples": len(samples),
        "server_kv_tokens_capacity": after.get("kv_tokens_capacity"),
    })
    invalid = []
    if m["client_bound"]:
        invalid += m["client_reasons"]
    if m["reconciled"] is False:
        invalid.append(m["reconcile_note"])
    if m["failed"]:
        invalid.append(f"{m['failed']} of {len(records)} requests failed: {m['errors'][:3]}")
    m["valid"] = not invalid
    m["invalid_reasons"] = invalid
    return m


def _result_head(cfg: dict, started: float, **client) -> dict:
    """What every result starts with: when, against what, and the client's settings (never the API key)."""
    return {
        "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)),
        "started_at": started, "finished_at": time.time(),
        "backend": "openai-chat" if cfg["endpoint"] == "chat" else "openai",
        "model_id": cfg["model"], "base_url": cfg["base_url"],
        "client": {k: v for k, v in cfg.items() if k != "api_key"} | client | {
            "pid": os.getpid()},
    }


def run_sweep(cfg: dict, *, levels: list[int], request_rate: float | None = None, per_level: int = 4,
              min_prompts: int = 8, max_prompts: int = 2000, kv_tokens_capacity: int | None = None,
              progress=None, repeat: int = 1) -> dict:
    """A concurrency sweep (or one rate point per level cap); the result carries points, knee, headline. With
    repeat > 1 every point runs that many times and carries the throughputs' confidence intervals."""
    if not isinstance(repeat, int) or repeat < 1:
        raise bench.BenchError(f"repeat must be a whole number >= 1, got {repeat!r}")
    points = []
    started = time.time()
    for c in levels:
        n = bench.num_prompts_for(c, per_level=per_level, minimum=min_prompts, maximum=max_prompts)
        runs = [run_point(cfg, concurrency=c, request_rate=request_rate, num_prompts=n) for _dummy in range(repeat)]
        p = bench.merge_repeats(runs)
        cap = kv_tokens_capacity or p.get("server_kv_tokens_capacity")
        bound = bench.kv_bound(cap, cfg["input_len"], cfg["output_len"])
        p["kv_bound_concurrency"] = bound
        p["beyond_kv_bound"] = bool(bound is not None and c > bound)
        # the same point with other tools (method export); the tokenizer other tools load: the model's repo
        p["equivalent_commands"] = bench.equivalent_commands(cfg, p, cfg.get("tokenizer"))
        points.append(p)
        if progress:
            progress(p)
    return {
        **_result_head(cfg, started, levels=levels, request_rate=request_rate, per_level=per_level, repeat=repeat),
        "points": points,
        "knee": bench.find_knee(points),
        "headline": bench.headline(points),
        "formulas": bench.FORMULAS,
    }


def capacity_search(cfg: dict, *, slo: dict, mode: str = "rate", start: float = 1.0, maximum: float = 256.0,
                    repeat: int = 1, probe_seconds: float = 20.0, per_level: int = 4, min_prompts: int = 8,
                    max_prompts: int = 2000, precision: float = 0.1, max_probes: int = 12, progress=None) -> dict:
    """The highest load that meets the latency targets `slo` (bench.check_slo): mode "rate" probes open-loop Poisson
    request rates (req/s, each probe about probe_seconds long), "concurrency" closed-loop concurrencies; doubling
    until a probe misses (stopping there once the server is over-saturated), then bisecting. Every probe's point is
    kept (with its error bars when repeat >= 2); the result is a sweep result with a `capacity` summary."""
    slo = bench.check_slo(slo)
    if mode not in ("rate", "concurrency"):
        raise bench.BenchError(f"capacity mode must be rate or concurrency, got {mode!r}")
    if start <= 0 or maximum < start:
        raise bench.BenchError(f"capacity search needs 0 < start <= maximum, got {start} and {maximum}")
    integer = mode == "concurrency"
    if integer:
        start, maximum = max(1, int(start)), int(maximum)
    # goodput counts the requests that met the per-request targets
    cfg = dict(cfg, goodput_ttft_ms=slo.get("ttft_p99_ms"), goodput_tpot_ms=slo.get("tpot_p99_ms"))
    started, probes, history = time.time(), [], []
    while True:
        load = bench.next_probe(history, start=start, maximum=maximum, integer=integer, precision=precision,
                                max_probes=max_probes)
        if load is None:
            break
        if integer:
            n = bench.num_prompts_for(int(load), per_level=per_level, minimum=min_prompts, maximum=max_prompts)
            runs = [run_point(cfg, concurrency=int(load), num_prompts=n) for _dummy in range(repeat)]
        else:
            n = max(min_prompts, min(max_prompts, int(round(load * probe_seconds))))
            runs = [run_point(cfg, request_rate=load, num_prompts=n) for _dummy in range(repeat)]
        p = bench.merge_repeats(runs)
        p["offered_load"] = load
        p["equivalent_commands"] = bench.equivalent_commands(cfg, p, cfg.get("tokenizer"))
        meets, why, saturated = bench.slo_verdict(p, slo, None if integer else load)
        probes.append({"load": load, "meets": meets, "why": why, "point": p})
        history.append((load, meets))
        if progress:
            progress(p, meets, why)
        if saturated and not any(m for v, m in history if v < load):
            break  # over-saturated from the first probes on: nothing lower was tried to meet
    points = [pr["point"] for pr in probes]
    ordered = sorted(points, key=lambda p: p["offered_load"])
    return {
        **_result_head(cfg, started, capacity_mode=mode, start=start, maximum=maximum, repeat=repeat,
                       probe_seconds=probe_seconds),
        "points": ordered,
        "capacity": bench.capacity_summary(probes, slo, mode),
        "knee": bench.find_knee(ordered) if integer else {"summary": "(a rate search: see the capacity)"},
        "headline": bench.headline(ordered) if integer else bench.headline([]),
        "formulas": bench.FORMULAS,
    }

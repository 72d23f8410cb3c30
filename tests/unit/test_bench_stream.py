"""The benchmark client's stream reading (bench_client.one_request) against a real HTTP server on loopback (aiohttp's)
that sends a vLLM-shaped event stream in pieces cut anywhere - inside a line, inside "data:", between the two
newlines of an event - with \\n or \\r\\n line ends: every token step is counted once, the usage and the answer's text
are read whole, and an error event or a cut stream is reported."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench, bench_client

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402


def _events(chat: bool, words: list[str], usage: bool = True) -> list[dict]:
    out = []
    if chat:  # vLLM's chat stream opens with a role-only delta, which is no generation step
        out.append({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for w in words:
        out.append({"choices": [{"index": 0, "delta": {"content": w}}]} if chat
                   else {"choices": [{"index": 0, "text": w, "logprobs": None, "finish_reason": None}]})
    if usage:
        out.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(words)}})
    return out


def _body(events: list, eol: bytes = b"\n", done: bool = True) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() + eol + eol for e in events]
    return b"".join(lines) + (b"data: [DONE]" + eol + eol if done else b"")


def _run(body: bytes, piece: int, cfg: dict, keep_text: bool = False, stall_s: float = 0.0) -> dict:
    """`body` sent in pieces of `piece` bytes; `stall_s`: then the server holds the stream open that long."""
    async def main():
        async def handler(request):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(0, len(body), piece):
                await resp.write(body[i:i + piece])
                await asyncio.sleep(0.0005)  # separate reads on the client, cut wherever `piece` falls
            await asyncio.sleep(stall_s)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=1.0)  # a stalled handler is cancelled, not awaited
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            c = dict(cfg, base_url=f"http://127.0.0.1:{port}")
            async with bench_client._session(c, 1) as pool:
                return await bench_client.one_request(pool, c, [1, 2, 3], keep_text=keep_text)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def _cfg(chat=False):
    return dict(bench_client.default_config(), model="m", endpoint="chat" if chat else "completions")


WORDS = [" alpha", " bravo", "", " charlie", " dé", "lta"]  # an empty text: a step whose character is incomplete


@pytest.mark.parametrize("piece", [1, 5, 7, 64, 100000])
@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_a_completion_stream_cut_anywhere_counts_each_step_once(piece, eol):
    rec = _run(_body(_events(False, WORDS), eol), piece, _cfg(), keep_text=True)
    assert rec["error"] == "" and len(rec["chunk_times"]) == len(WORDS)
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (7, len(WORDS))
    assert rec["text"] == "".join(WORDS)
    assert rec["chunk_times"] == sorted(rec["chunk_times"]) and rec["sent"] <= rec["chunk_times"][0] <= rec["end"]


@pytest.mark.parametrize("piece", [3, 64, 100000])
def test_a_chat_stream_skips_the_role_delta_and_keeps_the_answer(piece):
    rec = _run(_body(_events(True, WORDS)), piece, _cfg(chat=True), keep_text=True)
    assert rec["error"] == "" and len(rec["chunk_times"]) == len(WORDS) and rec["text"] == "".join(WORDS)
    assert "text" not in _run(_body(_events(True, WORDS)), piece, _cfg(chat=True))


@pytest.mark.parametrize("piece", [4, 100000])
def test_an_error_event_or_a_stream_without_usage_is_reported(piece):
    body = _body([*_events(False, WORDS[:2], usage=False), {"error": {"message": "engine died"}}], done=False)
    rec = _run(body, piece, _cfg())
    assert rec["error"] == "engine died" and len(rec["chunk_times"]) == 2
    rec = _run(_body(_events(False, WORDS, usage=False)), piece, _cfg())
    assert rec["error"].startswith("the stream ended without a usage record")
    # the stream ends without [DONE] and without its last line's end: that line is still read
    rec = _run(_body(_events(False, WORDS), done=False)[:-2], piece, _cfg())
    assert rec["error"] == "" and rec["completion_tokens"] == len(WORDS) and len(rec["chunk_times"]) == len(WORDS)


def _reasoning_events(key: str, thought: list[str], answer: list[str], both_at_the_turn: bool = False) -> list:
    """A reasoning model's chat stream as vLLM's reasoning parser sends it: the role delta, reasoning deltas (empty
    ones too: an incomplete character), then the answer; `both_at_the_turn`: one delta carries the end of the
    reasoning and the start of the answer. The server counts its reasoning tokens as 0 (as vLLM 0.32 does when the
    template opened the reasoning in the prompt)."""
    out = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    out += [{"choices": [{"index": 0, "delta": {key: w}}]} for w in thought]
    if both_at_the_turn:
        out[-1]["choices"][0]["delta"]["content"] = answer[0]
        answer = answer[1:]
    out += [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in answer]
    n = len(thought) + len(answer) + (1 if both_at_the_turn else 0) + 1  # + </think>, which sends no chunk
    out.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                         "completion_tokens_details": {"reasoning_tokens": 0}}})
    return out


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])  # vLLM 0.32's name, and earlier versions'
@pytest.mark.parametrize("piece", [5, 100000])
def test_a_reasoning_stream_counts_its_thinking_and_when_the_answer_began_and_keeps_only_the_answer(key, piece):
    thought, answer = [" let", "", " me", " think"], [" the", " answer"]
    rec = _run(_body(_reasoning_events(key, thought, answer)), piece, _cfg(chat=True), keep_text=True)
    assert rec["error"] == "" and len(rec["chunk_times"]) == 6
    assert rec["reasoning_steps"] == 4 and rec["answer_at"] == rec["chunk_times"][4]
    assert rec["text"] == " the answer"  # a conversation's history holds the answer, never the reasoning
    assert rec["server_reasoning_tokens"] == 0 and rec["completion_tokens"] == 7
    rec = _run(_body(_reasoning_events(key, thought, answer, both_at_the_turn=True)), piece, _cfg(chat=True))
    assert rec["reasoning_steps"] == 4 and rec["answer_at"] == rec["chunk_times"][3]
    rec = _run(_body(_reasoning_events(key, thought, [])), piece, _cfg(chat=True))  # thinking till max_tokens
    assert rec["reasoning_steps"] == 4 and rec["answer_at"] is None


def test_a_stream_without_reasoning_has_no_reasoning_steps():
    rec = _run(_body(_events(True, WORDS)), 64, _cfg(chat=True))
    assert rec["reasoning_steps"] == 0 and rec["answer_at"] == rec["chunk_times"][0]
    assert "reasoning_steps" not in _run(_body(_events(False, WORDS)), 64, _cfg())


def test_a_stream_that_stalls_ends_at_the_request_deadline_with_its_steps_so_far():
    """The deadline is the client's own (request_timeout_s for the whole request), not aiohttp's: a server that
    stops sending mid-answer does not hold the point, and what it sent before is kept."""
    body = _body(_events(False, WORDS[:3], usage=False), done=False)
    rec = _run(body, 100000, dict(_cfg(), request_timeout_s=0.5), stall_s=30)
    assert rec["error"] == "no whole answer within request_timeout_s (0.5 s)"
    assert len(rec["chunk_times"]) == 3 and rec["completion_tokens"] == 0
    assert rec["end"] - rec["sent"] < 10  # ended by the deadline, not by the server's 30 s


# ---- the HTTP under it (sse_http): connections, framing, failures ----

def _raw(answer, cfg: dict, n: int = 1, prefix: str = "", close_each: bool = False, gap_s: float = 0.0):
    """A server that reads each request whole, keeps it, and answers with `answer(i)` (raw bytes; None: close the
    connection at once; close_each: close it after every answer, whatever the answer's headers say); returns the
    requests' raw bytes, the number of connections and the records of `n` requests sent one after another
    (`gap_s` apart) through one pool."""
    seen: list = []
    conns = [0]

    async def main():
        async def handle(reader, writer):
            conns[0] += 1
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:  # the client closed the connection
                    break
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                                  if h.lower().startswith(b"content-length")))
                seen.append(head + await reader.readexactly(length))
                out = answer(len(seen) - 1)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if close_each or b"Connection: close" in out:
                    break
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = dict(cfg, base_url=f"http://127.0.0.1:{port}{prefix}", request_timeout_s=20)
        try:
            async with bench_client._session(c, 1) as pool:
                recs = []
                for _dummy in range(n):
                    recs.append(await bench_client.one_request(pool, c, [1, 2, 3]))
                    await asyncio.sleep(gap_s)
                return recs
        finally:
            server.close()
    recs = asyncio.run(main())
    return seen, conns[0], recs


def _chunked(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


def test_the_request_is_one_post_with_the_key_and_the_url_s_path_and_connections_are_kept_alive():
    body = _body(_events(False, WORDS))
    seen, conns, recs = _raw(lambda i: _chunked(body), dict(_cfg(), api_key="k-1"), n=3, prefix="/lb/")
    assert [r["error"] for r in recs] == ["", "", ""] and all(r["completion_tokens"] == len(WORDS) for r in recs)
    head, _sep, payload = seen[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /lb/v1/completions HTTP/1.1"
    assert b"Authorization: Bearer k-1" in lines and any(h.startswith(b"Host: 127.0.0.1:") for h in lines)
    assert json.loads(payload)["prompt"] == [1, 2, 3] and len(seen) == 3 and conns == 1  # all on one connection


def test_an_answer_framed_by_its_length_or_by_the_connection_s_end_is_read_whole():
    body = _body(_events(False, WORDS))
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    _seen, _conns, recs = _raw(lambda i: sized, _cfg(), n=2)
    assert [r["error"] for r in recs] == ["", ""] and len(recs[1]["chunk_times"]) == len(WORDS)
    # no length, no chunks: the answer ends with the connection (HTTP/1.0 style)
    _seen, _conns, (rec,) = _raw(lambda i: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body, _cfg())
    assert rec["error"] == "" and rec["completion_tokens"] == len(WORDS)


def test_a_failed_answer_is_a_record_s_error_not_an_exception():
    denied = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 23\r\n\r\n{\"error\": \"bad api key\"}"[:-1]
    _seen, _conns, (rec,) = _raw(lambda i: denied, _cfg())
    assert rec["error"] == 'HTTP 401: {"error": "bad api key"' and rec["chunk_times"] == []
    # the connection closed mid-answer: the steps so far are kept
    body = _body(_events(False, WORDS))
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body[:len(body) // 2]
    _seen, _conns, (rec,) = _raw(lambda i: cut, _cfg())
    assert rec["error"].startswith("the server closed the connection before the answer ended")
    assert 0 < len(rec["chunk_times"]) < len(WORDS)
    _seen, _conns, (rec,) = _raw(lambda i: None, _cfg())  # closed without a word
    assert rec["error"].startswith("the server closed the connection before the answer ended")
    _seen, _conns, (rec,) = _raw(lambda i: b"SSH-2.0-OpenSSH_9.2\r\n\r\n", _cfg())  # not HTTP
    assert rec["error"].startswith("bad answer from the server")
    _seen, _conns, (rec,) = _raw(lambda i: _chunked(b"data: {\"choices\": [\n\n"), _cfg())  # an event not JSON
    assert rec["error"].startswith("bad answer from the server: JSONDecodeError")
    _seen, _conns, (rec,) = _raw(lambda i: _chunked(b"data: {\"choices\": ["), _cfg())  # ... with no line end
    assert rec["error"].startswith("bad answer from the server: JSONDecodeError")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        cfg = dict(_cfg(), base_url=f"http://127.0.0.1:{port}")

        async def refused():
            async with bench_client._session(cfg, 1) as pool:
                return await bench_client.one_request(pool, cfg, [1])
        assert asyncio.run(refused())["error"].startswith(f"cannot connect to 127.0.0.1:{port}")


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    """A server that closes idle keep-alive connections (uvicorn after 5 s): the next request opens a new one
    instead of writing into the closed one."""
    body = _body(_events(False, WORDS))
    seen, conns, recs = _raw(lambda i: _chunked(body), _cfg(), n=3, close_each=True, gap_s=0.2)
    assert [r["error"] for r in recs] == ["", "", ""] and len(seen) == 3 and conns == 3


@pytest.mark.parametrize(("cfg", "fix"), [
    (dict(api_key="k\r\nX-Injected: 1"), "control character"),
    (dict(api_key="ключ"), "not Latin-1"),
    (dict(base_url="http://127.0.0.1:8000/my lb"), "plain ASCII without spaces"),
    (dict(base_url="http://127.0.0.1:8000/é"), "plain ASCII without spaces"),
    (dict(base_url="ftp://example.com"), "base_url must be"),
    (dict(base_url="127.0.0.1:8000"), "base_url must be"),
])
def test_bad_settings_are_a_benchmark_error_naming_them(cfg, fix):
    with pytest.raises(bench.BenchError, match=fix):
        bench_client._session(dict(_cfg(), **cfg), 1)

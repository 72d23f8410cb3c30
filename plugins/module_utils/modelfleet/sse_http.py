"""The benchmark client's HTTP: keep-alive HTTP/1.1 connections to one server, on asyncio's transports (uvloop's where
the client runs on it), with responses parsed by httptools (the parser uvicorn uses; every vLLM venv has it through
uvicorn[standard], and modelfleet's own venv pins it).

Why not aiohttp's client (which this replaced, 2026-12-06): a streamed answer is one socket read per token, and
aiohttp hands each read to the request's task through a StreamReader (a future, a task wake-up, a buffer and
flow-control calls per read). Here the parser calls `on_body` straight from the transport's `data_received`, and the
caller's event callback runs there: no task wakes until the answer is whole. On one vLLM CPU server at C = 256 that
cut the client's CPU per streamed token by 44% (benchmarks/bench_side_by_side.py, docs/benchmark.md).

What is written here is the request (its line and headers); the framing of the answer (status line, headers,
chunked or sized bodies, keep-alive) is httptools'. No proxy, no redirects, no compression: a benchmark talks to the
server it names. https is asyncio's TLS with the default context (certificates verified)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

try:
    import httptools
except ImportError:  # pragma: no cover - named where a pool is made
    httptools = None

# An idle connection is reused only this soon after its last answer: a server closes idle keep-alive connections
# after a few seconds (uvicorn, which vLLM runs on: 5 s), and a request written into a connection the server is
# closing would fail without any fault of the server's.
IDLE_REUSE_S = 2.0


class HttpError(Exception):
    """A request that got no whole answer: the connection failed, closed early, or the answer was not HTTP."""


def _has_control(text: str, space: bool = False) -> bool:
    """Whether `text` holds an ASCII control character (or, with `space`, a space)."""
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F or (space and ch == " ") for ch in text)


def _check_header_value(name: str, value: str) -> str:
    if _has_control(value):
        raise ValueError(f"the {name} header's value holds a control character (a line break would inject "
                         "headers into the request); remove it")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"the {name} header's value holds a character an HTTP header cannot carry (not "
                         "Latin-1); check it") from None
    return value


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; one request at a time. The answer's body goes to the request's sink (a callable
    given with each request) as it arrives, from the transport's callback."""

    def __init__(self, loop):
        self.loop, self.transport, self.closed = loop, None, False
        self.parser = self.done = self.sink = None
        self.status, self.keep_alive, self.complete, self.idle_since = 0, False, False, 0.0
        self.framed = False  # the answer's length is known (Content-Length or chunks), not the connection's end

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.parser is None:  # bytes with no request out: the connection is not usable any more
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # what the sink raised (an event that is not JSON), inside
            why = e.__context__ or e
            self._fail(HttpError(f"bad answer from the server: {type(why).__name__}: {why}"))
            self.close()
        except httptools.HttpParserError as e:  # not HTTP
            self._fail(HttpError(f"bad answer from the server: {type(e).__name__}: {e}"))
            self.close()

    def connection_lost(self, exc):
        self.closed = True
        if self.parser is not None and self.status and not self.framed and exc is None:
            self.on_message_complete()  # an answer with neither a length nor chunks ends with its connection
        if not self.complete:
            why = f": {exc}" if exc else ""
            self._fail(HttpError(f"the server closed the connection before the answer ended{why}"))

    # httptools' callbacks
    def on_header(self, name: bytes, _value: bytes):
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self):
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes):
        self.sink(self.status, body)

    def on_message_complete(self):
        self.complete = True
        if self.done is not None and not self.done.done():
            self.done.set_result(self.status)

    # ours
    def _fail(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def start(self, request: bytes, sink) -> asyncio.Future:
        if self.closed or self.transport.is_closing():  # a write would be dropped and no answer would come
            raise HttpError("the server closed the connection before the request was sent")
        self.parser = httptools.HttpResponseParser(self)
        self.sink, self.status, self.complete, self.framed = sink, 0, False, False
        self.done = self.loop.create_future()
        self.transport.write(request)
        return self.done

    def reusable(self) -> bool:
        return (self.complete and self.keep_alive and not self.closed
                and time.monotonic() - self.idle_since < IDLE_REUSE_S)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to the server of `base_url` (http or https, any path prefix), at most `limit` open
    at once beyond which requests wait for one. `async with Pool(...) as pool: status = await pool.request(...)`.
    Bad settings (the URL, a header value) raise ValueError here; no httptools, ImportError."""

    def __init__(self, base_url: str, limit: int, headers: dict | None = None):
        if httptools is None:
            raise ImportError("the benchmark client needs httptools (uvicorn's HTTP parser; every vLLM venv has "
                              "it): install it into the Python that runs the benchmark")
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http://host[:port] or https://..., got {base_url!r}")
        default_port = 443 if u.scheme == "https" else 80
        self.host, self.port = u.hostname, u.port or default_port
        prefix = u.path.rstrip("/")
        if not prefix.isascii() or _has_control(prefix, space=True):
            raise ValueError(f"base_url's path must be plain ASCII without spaces (percent-encode the rest), got "
                             f"{base_url!r}")
        self.prefix = prefix.encode("ascii")
        self.ssl = None
        if u.scheme == "https":
            import ssl

            self.ssl = ssl.create_default_context()
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if self.port == default_port else f"{host}:{self.port}"
        lines = [f"Host: {authority}"] + [f"{k}: {_check_header_value(k, str(v))}" for k, v in (headers or {}).items()]
        self.head = "\r\n".join(lines).encode("latin-1")  # each value checked above
        self.idle: list = []
        self.slots = asyncio.Semaphore(max(1, limit))
        self.open: set = set()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    def close(self) -> None:
        for c in list(self.open):
            c.close()
        self.open.clear()
        self.idle.clear()

    async def _connect(self) -> _Connection:
        while self.idle:
            c = self.idle.pop()
            if c.reusable():
                return c
            c.close()
            self.open.discard(c)
        loop = asyncio.get_running_loop()
        try:
            _t, c = await loop.create_connection(lambda: _Connection(loop), self.host, self.port, ssl=self.ssl)
        except OSError as e:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from None
        self.open.add(c)
        return c

    async def request(self, method: str, path: str, body: bytes, sink) -> int:
        """Send one request and wait for its whole answer; `sink(status, bytes)` gets the body as it arrives.
        Returns the status. Raises HttpError. A request cancelled (its deadline) closes its connection."""
        async with self.slots:
            c = await self._connect()
            head = b"%s %s%s HTTP/1.1\r\n%s\r\nContent-Length: %d\r\n\r\n" % (
                method.encode("ascii"), self.prefix, path.encode("ascii"), self.head, len(body))
            try:
                status = await c.start(head + body, sink)
            except BaseException:
                c.close()
                self.open.discard(c)
                raise
            c.parser, c.idle_since = None, time.monotonic()
            if c.reusable():
                self.idle.append(c)
            else:
                c.close()
                self.open.discard(c)
            return status

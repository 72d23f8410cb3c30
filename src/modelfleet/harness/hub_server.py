"""A real Hugging Face hub-compatible server on loopback for tests: olah (offline mirror mode) with a
thin ASGI layer that fills the gaps stock olah 0.5.4 has (see docs/harness.md):

  * HTTP Range on file downloads (olah answers 200 with the whole body): sliced to 206 here, so
    header reads by range move only header bytes to the client;
  * error codes: a missing file (olah: 401) becomes 404 EntryNotFound, an unknown revision
    (olah: 500) becomes 404 RevisionNotFound, so huggingface_hub raises its proper errors;
  * counters of bytes served per file at /_modelfleet/stats (for the fan-out egress measurement).

Runs with the olah venv's python: python hub_server.py --mirrors DIR --port N [--stats-file F].
Nothing here contacts the internet: offline mode is on and the upstream is set to a closed loopback
port.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
# /<repo>/resolve/<40-hex commit>/<file>: an immutable body (a commit's file never changes)
PINNED_FILE_RE = re.compile(r"/resolve/[0-9a-f]{40}/")
# POST /api/models/<repo>/paths-info/<40-hex commit>: the answer depends only on the commit and the paths asked
PINNED_PATHS_INFO_RE = re.compile(r"^/api/models/[^/]+/[^/]+/paths-info/[0-9a-f]{40}$")
# bodies up to this size at a pinned commit are answered from memory after olah's first answer: olah reads every
# file out of its git mirror per request (~30 ms of CPU for a 0.5 MB header object, ~0.7 s for the paths-info of a
# 66-file repo), which made this single-process server, not the client, the floor of many-shard header inspection
# (docs/harness.md); the real hub answers such reads from its caches and CDN
CACHE_BODY_MAX = 32 << 20
CACHE_TOTAL_MAX = 256 << 20
REPO_API_RE = re.compile(r"^/api/models/([^/]+)/([^/]+)/revision/")


class HarnessLayer:
    def __init__(self, app, mirrors: str, stats_file: str | None = None, fail_file: str | None = None,
                 rate_file: str | None = None, stall_file: str | None = None, latency_file: str | None = None):
        self.app = app
        self.mirrors = mirrors
        self.rate_file = rate_file    # holds bytes/s: file bodies are sent at that rate (a slow link)
        self.stall_file = stall_file  # while it exists, file bodies stop mid-way (a stalled link)
        self.stats = {"bytes_served": 0, "ranged_bytes": 0, "requests": 0, "by_path": {}, "whole_by_path": {}}
        self.in_flight = 0
        self.stats_file = stats_file
        self.fail_file = fail_file  # if this file exists, file downloads answer 503 (endpoint-down tests)
        self.latency_file = latency_file  # holds seconds: every request waits that long first (a far-away hub)
        self.max_in_flight = 0
        self.cache: dict[str, dict] = {}  # pinned path -> olah's first 200 answer (status, headers, chunks)
        self.cache_bytes = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path == "/_modelfleet/stats":
            body = json.dumps(dict(self.stats, in_flight=self.in_flight, max_in_flight=self.max_in_flight)).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            return await send({"type": "http.response.body", "body": body})
        if path == "/_modelfleet/reset":
            self.stats = {"bytes_served": 0, "ranged_bytes": 0, "requests": 0, "by_path": {}, "whole_by_path": {}}
            self.max_in_flight = self.in_flight
            await send({"type": "http.response.start", "status": 200, "headers": []})
            return await send({"type": "http.response.body", "body": b"{}"})
        is_file = "/resolve/" in path
        if is_file and self.fail_file and os.path.exists(self.fail_file):
            await send({"type": "http.response.start", "status": 503, "headers": []})
            return await send({"type": "http.response.body", "body": b"hub down (test switch)"})
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        want_range = headers.get("range") if is_file and scope.get("method") == "GET" else None
        is_api = path.startswith("/api/")
        state = {"status": None, "headers": [], "chunks": []}

        async def capture(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["headers"] = list(message.get("headers", []))
                return
            if message["type"] == "http.response.body":
                state["chunks"].append(message.get("body", b""))
                if message.get("more_body"):
                    return
                await self._finish(state, send, path, want_range, is_file, is_api, scope.get("method") == "HEAD")

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            latency = self._latency()
            if latency > 0:
                import asyncio

                await asyncio.sleep(latency)
            key = None
            if is_file and scope.get("method") == "GET" and PINNED_FILE_RE.search(path):
                key = path
            elif scope.get("method") == "POST" and PINNED_PATHS_INFO_RE.match(path):
                body = await _read_body(receive)
                key = path + "\0" + body.decode("latin-1")
                receive = _replay(body, receive)
            cacheable = key is not None
            hit = self.cache.get(key) if cacheable else None
            if hit is not None:
                state.update(status=hit["status"], headers=list(hit["headers"]), chunks=list(hit["chunks"]))
                return await self._finish(state, send, path, want_range, is_file, is_api)
            await self.app(scope, receive, capture)
            if cacheable and state["status"] == 200 and state.get("sent"):
                size = sum(len(c) for c in state["chunks"])
                if size <= CACHE_BODY_MAX and self.cache_bytes + size <= CACHE_TOTAL_MAX:
                    self.cache[key] = {"status": 200, "headers": state["headers"], "chunks": state["chunks"]}
                    self.cache_bytes += size
        except Exception as e:  # olah raises on unknown refs; answer like the hub does
            if state["status"] is None and (is_file or is_api):
                msg = json.dumps({"error": f"Revision not found ({type(e).__name__})"}).encode()
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"x-error-code", b"RevisionNotFound"),
                                        (b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": msg})
            elif not state.get("sent"):
                raise
        finally:
            self.in_flight -= 1

    async def _finish(self, state, send, path, want_range, is_file, is_api, is_head=False):
        status, hdrs = state["status"], state["headers"]
        body = b"".join(state["chunks"])
        extra = []
        if (is_file or is_api) and status == 401:
            status, body = 404, b'{"error":"Entry not found"}'
            extra = [(b"x-error-code", b"EntryNotFound" if is_file else b"RepoNotFound")]
            hdrs = [(k, v) for k, v in hdrs if k.lower() not in (b"content-length",)]
        elif is_api and status == 404 and not any(k.lower() == b"x-error-code" for k, _ in hdrs):
            extra = [(b"x-error-code", b"RepoNotFound")]
        elif (is_file or is_api) and status == 500:
            status, body = 404, b'{"error":"Revision not found"}'
            extra = [(b"x-error-code", b"RevisionNotFound")]
            hdrs = [(k, v) for k, v in hdrs if k.lower() not in (b"content-length",)]
        elif want_range and status == 200:
            m = RANGE_RE.match(want_range.strip())
            total = len(body)
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else total - 1, total - 1)
                else:
                    start, end = max(0, total - int(m.group(2))), total - 1
                if start >= total:
                    status, body = 416, b""
                    extra = [(b"content-range", f"bytes */{total}".encode())]
                else:
                    body = body[start:end + 1]
                    status = 206
                    extra = [(b"content-range", f"bytes {start}-{end}/{total}".encode())]
                hdrs = [(k, v) for k, v in hdrs if k.lower() not in (b"content-length",)]
        if status == 404:
            m = REPO_API_RE.match(path)
            if m and os.path.isdir(os.path.join(self.mirrors, "models", m.group(1), m.group(2))):
                # the repo exists, so what was not found is the revision
                extra = [(b"x-error-code", b"RevisionNotFound")]
                body = b'{"error":"Revision not found"}'
        keep_length = is_head and status == state["status"]  # HEAD: the length is the file's, not the body's
        drop = ({b"content-length"} if not keep_length else set()) | (
            {b"x-error-code", b"x-error-message"} if extra else set())
        hdrs = [(k, v) for k, v in hdrs if k.lower() not in drop] + extra
        if not keep_length:
            hdrs.append((b"content-length", str(len(body)).encode()))
        if is_file and state["status"] in (200, 206) and status in (200, 206):
            self.stats["bytes_served"] += len(body)
            if status == 206:  # partial reads: header-only inspection, or a resumed download
                self.stats["ranged_bytes"] += len(body)
            self.stats["requests"] += 1
            self.stats["by_path"][path] = self.stats["by_path"].get(path, 0) + len(body)
            if status == 200:  # whole-file reads: downloads
                self.stats["whole_by_path"][path] = self.stats["whole_by_path"].get(path, 0) + len(body)
            if self.stats_file:
                tmp = self.stats_file + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(self.stats, f)
                os.replace(tmp, self.stats_file)
        state["sent"] = True
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        if is_file and not is_head and status in (200, 206) and len(body) > 65536 and (
                self._rate() or (self.stall_file and os.path.exists(self.stall_file))):
            await self._send_slowly(send, body)
            return
        await send({"type": "http.response.body", "body": body})

    def _latency(self) -> float:
        if not self.latency_file:
            return 0.0
        try:
            with open(self.latency_file) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def _rate(self) -> float:
        try:
            with open(self.rate_file) as f:
                return float(f.read().strip() or 0)
        except (OSError, TypeError, ValueError):
            return 0.0

    async def _send_slowly(self, send, body: bytes) -> None:
        import asyncio

        chunk = 65536
        for i in range(0, len(body), chunk):
            while self.stall_file and os.path.exists(self.stall_file):
                await asyncio.sleep(0.2)  # the link delivers nothing while the switch is on
            await send({"type": "http.response.body", "body": body[i:i + chunk], "more_body": True})
            rate = self._rate()
            if rate > 0:
                await asyncio.sleep(chunk / rate)
        await send({"type": "http.response.body", "body": b""})


async def _read_body(receive) -> bytes:
    """A request's whole body (ASGI http.request messages)."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if msg.get("type") != "http.request" or not msg.get("more_body"):
            return body


def _replay(body: bytes, receive):
    """An ASGI receive that gives the already-read `body` once, then hands over to the connection's own (which
    tells of the disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="olah + modelfleet harness layer on loopback")
    ap.add_argument("--mirrors", required=True, help="folder holding models/<org>/<name> git repos")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--stats-file")
    ap.add_argument("--fail-file", help="while this file exists, file downloads answer 503")
    ap.add_argument("--rate-file", help="a file holding bytes/s: file bodies are sent at that rate")
    ap.add_argument("--stall-file", help="while this file exists, file bodies stop mid-way")
    ap.add_argument("--latency-file", help="a file holding seconds: every request waits that long first")
    a = ap.parse_args(argv)
    if not a.host.startswith("127.") and a.host not in ("localhost", "::1"):
        print("hub_server: refusing to bind outside loopback", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="modelfleet-hub-")
    cfg = os.path.join(work, "olah.toml")
    with open(cfg, "w") as f:
        f.write(
            "[basic]\n"
            f'host = "{a.host}"\nport = {a.port}\n'
            f'repos-path = "{os.path.join(work, "repos")}"\n'
            f'mirrors-path = ["{os.path.abspath(a.mirrors)}"]\n'
            f'mirror-netloc = "{a.host}:{a.port}"\nmirror-lfs-netloc = "{a.host}:{a.port}"\n'
            # upstream points at a closed loopback port: nothing can leave this machine
            'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'
            "[accessibility]\noffline = true\n"
        )
    sys.argv = ["olah-cli", "--config", cfg, "--log-path", os.path.join(work, "logs")]
    import uvicorn
    from olah import server

    server.init()
    layer = HarnessLayer(server.app, os.path.abspath(a.mirrors), a.stats_file, a.fail_file, a.rate_file,
                         a.stall_file, a.latency_file)
    uvicorn.run(layer, host=a.host, port=a.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

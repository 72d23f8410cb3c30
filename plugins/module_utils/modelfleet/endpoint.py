"""The fleet endpoint: one address per group of replicas, in front of the hosts that serve the group's model.

The balancer is HAProxy (Debian's package), run by its own unit (modelfleet-endpoint.service) with its own
configuration, so a host's other HAProxy, if any, is left alone. This module is the rule, in one place:

- `frontends` decides which replicas an endpoint names: the hosts of its group that this run deployed (their
  deploy outcome says the URL and the served name); the others are left out with the reason.
- `render` writes the configuration. Every value that reaches it is checked first (a name, a port, an address,
  a served name, an API key), so nothing a fleet file or an inventory says can add a line or a directive.
- `install` puts a configuration in place only after `haproxy -c` accepted it; a refused one never replaces
  the running one.
- `server_states` reads the balancer's own view of each replica from its admin socket ("show stat").

Membership follows readiness while the endpoint runs: HAProxy's active check of each replica is a real
completion of one token (the same request the readiness check and the watchdog make), so a replica joins after
its first passed check and leaves after `fall` failed ones - /health would answer 200 from a server whose
engine is stopped. The client's Authorization header is passed through untouched: the replicas still require
their API key; the endpoint holds it only for its checks (the configuration file is root-only)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
from urllib.parse import urlsplit

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+)\Z")
# what vLLM serves as a model name and HAProxy can carry inside a quoted word: no quote, space or control
SERVED_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}\Z")
API_KEY_RE = re.compile(r"^[A-Za-z0-9_.~+/=-]{1,512}\Z")
SOCKET = "/run/modelfleet-endpoint/admin.sock"
# the check: one real completion of one token, as the readiness check and the watchdog make it
CHECK_PROMPT = "ping"


class EndpointError(ModelfleetError):
    """An endpoint cannot be configured as asked; the message names the value and the fix."""


def _port(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise EndpointError(f"{what}: port must be an integer 1-65535, got {value!r}")
    return value


def _positive(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise EndpointError(f"{what} must be a positive number of seconds, got {value!r}")
    return value


def _split_url(url: str, who: str) -> tuple[str, int]:
    parts = urlsplit(url or "")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query or port == -1:
        raise EndpointError(f"{who}: its server URL {url!r} is not http://ADDRESS:PORT")
    host = parts.hostname
    address = f"[{host}]" if ":" in host else host
    if not ADDRESS_RE.match(address):
        raise EndpointError(f"{who}: address {host!r} in {url!r} is not a host name or an IP address")
    return address, _port(port or 80, who)


def frontends(endpoints: list, members: dict) -> list[dict]:
    """The endpoints this host runs, each with the replicas it names.

    endpoints: [{name, port, model, hosts: [host, ...]}] (the fleet file's `endpoint` of each group, as the
    inventory gives it to the endpoint host); members: {host: {"outcome": its deploy outcome this run or None,
    "api_key": its server's key or ""}}. A host without an outcome or a URL (not deployed in this run: failed,
    rolled back, stopped before its wave, or check mode) is left out, with the reason in `left_out`. Every
    replica must answer to the endpoint's model name (its outcome's served_model_names) with the same key: one
    request must be right for each; without a model name, they must serve one name."""
    out = []
    for ep in endpoints or []:
        name = ep.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise EndpointError(f"endpoint name {name!r}: letters, digits, '_', '.', '-' (at most 64)")
        port = _port(ep.get("port"), f"endpoint {name}")
        # the name its clients use and its checks ask for; every replica answers to it, whatever model it serves
        # (mid-switch, some the old and some the new one). Without one, the replicas must serve one name.
        model = ep.get("model") or ""
        backends, left_out, served, keys = [], [], {}, {}
        for host in ep.get("hosts") or []:
            info = members.get(host) or {}
            outcome = info.get("outcome") or {}
            if not outcome.get("url"):
                left_out.append({"host": host, "why": "not serving from this run (failed, rolled back, not reached, "
                                                      "or check mode)"})
                continue
            address, bport = _split_url(outcome["url"], f"endpoint {name}, replica {host}")
            served[host] = outcome.get("served_name") or ""
            names = outcome.get("served_model_names") or [served[host]]
            if model and model not in names:
                raise EndpointError(f"endpoint {name}: replica {host} does not answer to the endpoint's model name "
                                    f"{model!r} (it serves {', '.join(repr(n) for n in names)}); deploy it from the "
                                    "fleet file that declares the endpoint, which gives it that name "
                                    "(vllm_service_served_aliases)")
            keys[host] = info.get("api_key") or ""
            backends.append({"name": host, "address": address, "port": bport})
        if not model and len(set(served.values())) > 1:
            raise EndpointError(f"endpoint {name}: its replicas serve different names ("
                                + ", ".join(f"{h}: {s!r}" for h, s in sorted(served.items()))
                                + "); give the endpoint a model name they all answer to (a fleet file's "
                                "endpoint.model, by default its group's name), or each model its own endpoint")
        if len(set(keys.values())) > 1:
            raise EndpointError(f"endpoint {name}: its replicas have different API keys ("
                                + ", ".join(sorted(keys)) + "); set one vllm_service_api_key for the group")
        out.append({"name": name, "port": port, "served_name": model or next(iter(served.values()), ""),
                    "api_key": next(iter(keys.values()), ""), "backends": backends, "left_out": left_out})
    return out


def _check_frontends(fronts: list) -> None:
    names, ports = set(), set()
    for fe in fronts:
        name = fe.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise EndpointError(f"endpoint name {name!r}: letters, digits, '_', '.', '-' (at most 64)")
        if name in names:
            raise EndpointError(f"endpoint {name} appears twice on this host")
        port = _port(fe.get("port"), f"endpoint {name}")
        if port in ports:
            raise EndpointError(f"endpoint {name}: port {port} is already another endpoint's on this host")
        names.add(name)
        ports.add(port)
        if fe.get("backends") and not SERVED_RE.match(fe.get("served_name") or ""):
            raise EndpointError(f"endpoint {name}: served name {fe.get('served_name')!r} cannot be checked "
                                "(letters, digits and _ . : / @ + -; no space, quote or newline)")
        if fe.get("api_key") and not API_KEY_RE.match(fe["api_key"]):
            raise EndpointError(f"endpoint {name}: the API key has characters a check header cannot carry "
                                "(space, quote, newline...); use letters, digits and _ . ~ + / = -")
        seen = set()
        for b in fe.get("backends") or []:
            if not NAME_RE.match(str(b.get("name"))):
                raise EndpointError(f"endpoint {name}: replica name {b.get('name')!r} is not a host name")
            if b["name"] in seen:
                raise EndpointError(f"endpoint {name}: replica {b['name']} appears twice")
            seen.add(b["name"])
            if not ADDRESS_RE.match(str(b.get("address"))):
                raise EndpointError(f"endpoint {name}, replica {b['name']}: address {b.get('address')!r} is not "
                                    "a host name or an IP address")
            _port(b.get("port"), f"endpoint {name}, replica {b['name']}")
            if b["address"] in ("127.0.0.1", "localhost", "[::1]") and b["port"] in ports:
                raise EndpointError(f"endpoint {name}: port {b['port']} is also replica {b['name']}'s on loopback")


# The largest request (KiB) the endpoint keeps a copy of, to send it again when its replica fails before answering:
# HAProxy's buffer size (tune.bufsize). HAProxy's own 16 KiB is a prompt of a few thousand tokens; 256 KiB holds
# one of about 60,000. Memory: an open request holds up to two buffers (a streamed answer one), so 4,096 open
# requests take up to 2 GiB.
RETRY_REQUEST_KIB = 256
RETRY_REQUEST_KIB_MIN, RETRY_REQUEST_KIB_MAX = 16, 4096


def render(fronts: list, bind_address: str = "0.0.0.0", check_interval: float = 10, check_timeout: float = 30,
           rise: int = 1, fall: int = 2, timeout: float = 600, maxconn: int = 4096, admin_socket: str = SOCKET,
           user: str | None = "haproxy", retry_request_kib: int = RETRY_REQUEST_KIB) -> str:
    """The HAProxy configuration for `fronts` (from `frontends`); every value is checked before it is written."""
    _check_frontends(fronts)
    if not ADDRESS_RE.match(str(bind_address)):
        raise EndpointError(f"bind address {bind_address!r} is not a host name or an IP address")
    for what, v in (("check interval", check_interval), ("check timeout", check_timeout), ("timeout", timeout)):
        _positive(v, what)
    for what, v in (("rise", rise), ("fall", fall), ("maxconn", maxconn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise EndpointError(f"{what} must be a positive integer, got {v!r}")
    if isinstance(retry_request_kib, bool) or not isinstance(retry_request_kib, int) \
            or not RETRY_REQUEST_KIB_MIN <= retry_request_kib <= RETRY_REQUEST_KIB_MAX:
        raise EndpointError(f"retry_request_kib must be an integer from {RETRY_REQUEST_KIB_MIN} (HAProxy's own "
                            f"buffer) to {RETRY_REQUEST_KIB_MAX}, got {retry_request_kib!r}")
    if not re.match(r"^/[A-Za-z0-9_./-]+\Z", admin_socket):
        raise EndpointError(f"admin socket {admin_socket!r} must be an absolute path")
    if user is not None and not NAME_RE.match(user):
        raise EndpointError(f"user {user!r} is not a user name")

    def ms(seconds):
        return f"{int(round(seconds * 1000))}ms"

    lines = [
        "# modelfleet fleet endpoint (modelfleet-endpoint.service); written by the fleet_endpoint role - edits are",
        "# replaced. Each backend is one group's replicas; each replica is checked by a real one-token completion.",
        "global",
        f"    maxconn {maxconn}",
        # one buffer holds the copy of a request kept to send again (below): a larger request is not retried
        f"    tune.bufsize {retry_request_kib * 1024}",
        f"    stats socket {admin_socket} mode 600 level admin",
        *([f"    user {user}", f"    group {user}"] if user else []),
        "",
        "defaults",
        "    mode http",
        "    option dontlognull",
        "    timeout connect 5s",
        # a streamed answer may take minutes between its first and last token
        f"    timeout client {ms(timeout)}",
        f"    timeout server {ms(timeout)}",
        f"    timeout check {ms(check_timeout)}",
        "    timeout http-request 30s",
        # a replica that refuses the connection or closes it before answering is tried again on another.
        # HAProxy keeps a request for a retry only when it had the whole request before sending any of it, and
        # most clients (Python's http.client, h11) write the headers and the body apart: wait for the body
        "    option http-buffer-request",
        "    retries 2",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response",
    ]
    for fe in fronts:
        body = json.dumps({"model": fe["served_name"], "prompt": CHECK_PROMPT, "max_tokens": 1},
                          separators=(",", ":"))
        auth = f" hdr Authorization 'Bearer {fe['api_key']}'" if fe.get("api_key") else ""
        lines += [
            "",
            f"frontend {fe['name']}",
            f"    bind {bind_address}:{fe['port']}",
            f"    default_backend {fe['name']}",
            "",
            f"backend {fe['name']}",
            "    balance leastconn",
            "    option httpchk",
            "    http-check send meth POST uri /v1/completions ver HTTP/1.1 hdr Host modelfleet-endpoint"
            f" hdr Content-Type application/json{auth} body '{body}'",
            "    http-check expect status 200",
            # which replica answered (people and tests read it; the body is the replica's own)
            "    http-response set-header X-Modelfleet-Replica %s",
            # a replica whose connection fails in live traffic (its process died) leaves at once, not at its
            # next check: the request itself is tried again on another replica (retry-on above)
            f"    default-server check inter {ms(check_interval)} fastinter {ms(min(check_interval, 1))}"
            f" downinter {ms(check_interval)} rise {rise} fall {fall} observe layer4 error-limit 1"
            " on-error mark-down",
        ]
        for b in fe.get("backends") or []:
            lines.append(f"    server {b['name']} {b['address']}:{b['port']}")
    return "\n".join(lines) + "\n"


def install(path: str, text: str, haproxy: str = "haproxy", check: bool = False) -> tuple[bool, str]:
    """Put `text` at `path` (root-only) when it differs, after `haproxy -c` accepted it.

    Returns (changed, the file's text before). A refused configuration raises EndpointError with HAProxy's
    words and leaves the file as it was; check mode validates too when HAProxy is installed, and writes nothing."""
    try:
        with open(path, encoding="utf-8") as f:
            before = f.read()
    except FileNotFoundError:
        before = ""
    if before == text:
        return False, before
    folder = os.path.dirname(path) or "."
    if check and not os.path.isdir(folder):
        return True, before
    fd, tmp = tempfile.mkstemp(prefix=".haproxy.", suffix=".cfg", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        try:
            res = subprocess.run([haproxy, "-c", "-f", tmp], capture_output=True, text=True, check=False)
        except FileNotFoundError:
            if check:
                return True, before
            raise EndpointError(f"{haproxy} is not installed: the configuration cannot be checked, so it is not "
                                "put in place (install the haproxy package)") from None
        if res.returncode != 0:
            said = " ".join((res.stdout + res.stderr).replace(tmp, path).split())
            raise EndpointError(f"haproxy -c refused the new endpoint configuration, which was not put in place "
                                f"(the running one is unchanged): {said[-1500:]}")
        if check:
            return True, before
        os.replace(tmp, path)
        tmp = None
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return True, before
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def parse_stat(csv_text: str) -> dict:
    """{backend: {server: {"status": "UP"|"DOWN"|..., "current": sessions now, "total": sessions so far,
    "check": the last check's words}}} from HAProxy's "show stat" CSV."""
    lines = csv_text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise EndpointError(f"not HAProxy's show stat output: {csv_text[:200]!r}")
    head = lines[0][2:].split(",")
    out: dict = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        row = dict(zip(head, line.split(","), strict=False))
        if row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        out.setdefault(row["pxname"], {})[row["svname"]] = {
            "status": row.get("status", ""), "current": int(row.get("scur") or 0),
            "total": int(row.get("stot") or 0), "check": row.get("check_status", ""),
            "check_detail": row.get("check_desc", "")}
    return out


def admin(command: str, path: str = SOCKET, timeout: float = 5) -> str:
    """One command on HAProxy's admin socket; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def server_states(path: str = SOCKET) -> dict:
    """The balancer's view of every replica (parse_stat of "show stat")."""
    return parse_stat(admin("show stat", path))


def not_up(states: dict, expect: dict) -> list[str]:
    """What keeps `expect` ({endpoint: [replica, ...]}) from being UP in `states` (parse_stat), in words."""
    missing = []
    for name, replicas in sorted((expect or {}).items()):
        for r in replicas or []:
            s = (states.get(name) or {}).get(r)
            if s is None:
                missing.append(f"{name}/{r}: not in the balancer's configuration")
            elif not s["status"].startswith("UP"):
                hint = ""
                if s["check"].startswith("L4CON"):
                    hint = (" (connection refused: is its server running, and listening on an address this host "
                            "reaches? vllm_service_host is loopback unless the inventory says otherwise)")
                missing.append(f"{name}/{r}: {s['status']}, last check {s['check']} {s['check_detail']}{hint}")
    return missing


def set_state(backend: str, server: str, state: str, path: str = SOCKET) -> dict:
    """Put one replica of an endpoint in `state` ("maint": no new request, none checked, those it holds go on;
    "ready": checked again, it takes requests after its first passed check). Returns its states before and after.

    Raises EndpointError when the balancer does not know the replica (HAProxy's words)."""
    if state not in ("maint", "ready"):
        raise EndpointError(f"state {state!r}: maint or ready")
    for what, v in (("endpoint", backend), ("replica", server)):
        if not NAME_RE.match(str(v)):
            raise EndpointError(f"{what} name {v!r}: letters, digits, '_', '.', '-'")
    before = server_states(path).get(backend, {}).get(server)
    if before is None:
        raise EndpointError(f"the endpoint has no replica {backend}/{server} (is this host in the endpoint's group, "
                            "and the endpoint configured by a run in which it served?)")
    said = admin(f"set server {backend}/{server} state {state}", path).strip()
    if said:
        raise EndpointError(f"HAProxy refused 'set server {backend}/{server} state {state}': {said}")
    after = server_states(path).get(backend, {}).get(server) or {}
    return {"before": before, "after": after}

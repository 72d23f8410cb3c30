"""The vLLM server command line and unit settings, computed from a profile, a plan and the fetched
model - validated before anything is stopped or written.

`server_argv` gives one flag per element (the unit template puts one per line); `unit_settings` adds
the unit name, timeouts and environment; every bad input is a ServeError naming the setting."""

from __future__ import annotations

import ipaddress
import re

from ansible.module_utils.modelfleet.errors import ModelfleetError

HEX40 = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ServeError(ModelfleetError):
    """The service cannot be configured as asked; nothing was stopped or written."""


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unit_name(served_name: str) -> str:
    if not NAME.match(served_name or ""):
        raise ServeError(f"served model name {served_name!r} must be 1-63 letters, digits, '.', '_' or '-'")
    return f"modelfleet-vllm@{served_name}.service"


def server_argv(*, python: str, model_dir: str, profile: dict, plan: dict | None, host: str, port: int,
                revision: str | None, gpu_count: int | None = None, api_key_set: bool = False) -> list[str]:
    v = profile.get("vllm", {})
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServeError(f"port {port!r} is not a TCP port (1-65535)")
    if not is_loopback(host) and not api_key_set:
        raise ServeError(f"host {host} is not loopback: an API key is required (vllm_service_api_key) before the "
                         "server may listen there")
    tp = (plan or {}).get("tensor_parallel_size") or (v.get("tensor_parallel_size") if v.get(
        "tensor_parallel_size") != "auto" else 1)
    if gpu_count is not None and gpu_count > 0 and tp > gpu_count:
        raise ServeError(f"tensor_parallel_size {tp} is larger than the {gpu_count} GPU(s) on this host")
    ep = (plan or {}).get("expert_parallel", v.get("expert_parallel") is True)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_dir,
            "--served-model-name", profile["served_model_name"],
            "--host", host,
            "--port", str(port),
            "--tensor-parallel-size", str(tp),
            "--max-model-len", str(v["max_model_len"]),
            "--gpu-memory-utilization", str(v.get("gpu_memory_utilization", 0.9)),
            "--kv-cache-dtype", v.get("kv_cache_dtype", "auto")]
    if ep:
        argv += ["--enable-expert-parallel"]
    if v.get("trust_remote_code"):
        if not revision or not HEX40.match(revision):
            raise ServeError("trust_remote_code is on but no 40-hex revision is known; fetch first (the lock holds "
                             "the commit) so --revision and --code-revision can be pinned")
        argv += ["--trust-remote-code", "--revision", revision, "--code-revision", revision]
    if v.get("tool_call_parser"):
        argv += ["--tool-call-parser", v["tool_call_parser"]]
    if v.get("enable_auto_tool_choice"):
        argv += ["--enable-auto-tool-choice"]
    if v.get("reasoning_parser"):
        argv += ["--reasoning-parser", v["reasoning_parser"]]
    argv += list(v.get("extra_args") or [])
    return argv


def start_timeout_seconds(model_bytes: int, load_bytes_per_s: float, base_seconds: int = 180) -> int:
    """How long systemd and the readiness gate wait for the first start: a 595 GB model at 1 GB/s needs
    ~10 minutes of loading; probes that give up sooner kill a healthy load."""
    if load_bytes_per_s <= 0:
        raise ServeError(f"load rate must be > 0 bytes/s, got {load_bytes_per_s}")
    return int(base_seconds + model_bytes / load_bytes_per_s)


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart argument for systemd (spaces, quotes, specifiers and variables)."""
    a = arg.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", a):
        a = '"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return a


def exec_lines(argv: list[str]) -> list[str]:
    """argv as unit lines: the program and module first, then one flag (with its value) per line."""
    quoted = [systemd_quote(a) for a in argv]
    head = 3 if len(argv) > 2 and argv[1] == "-m" else 1
    lines = [" ".join(quoted[:head])]
    for a, q in zip(argv[head:], quoted[head:], strict=True):
        if a.startswith("--") or not lines[1:]:
            lines.append(q)
        else:
            lines[-1] += " " + q
    return lines

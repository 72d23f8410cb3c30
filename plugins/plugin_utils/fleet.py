"""Fleet files (`*.fleet.yml`): parse and validate a fleet description into hosts, groups and variables.

Pure logic used by the `modelfleet.fleet` inventory plugin (plugins/inventory/fleet.py) and the CLI.
Errors name the file, the line, the host or group, and the field, and say what is allowed.

Shape:
    plugin: modelfleet.fleet.fleet                       # required by Ansible to pick this plugin
    models_root: /models                # fleet-wide defaults (any host field below may be set here)
    connection: {ansible_connection: ssh, ansible_user: root}
    vars: {...}                         # variables for every host
    groups:
      <group>:
        profile: kimi-k2.5-int4         # profiles/<name>.yml must exist
        gpu: {kind: rtx-pro-6000, count: 8, memory_gib: 96, interconnect: pcie}
        models_root: /models
        connection: {...}
        vars: {...}
        endpoint: {host: gpu-01, port: 8080}   # one address for the group's replicas (a host of this file)
        multi_host: {layout: pp, nodes: 2, port: 29501}  # one model over several hosts (docs/multi-host.md): the
                                        # hosts, in file order, make replicas of `nodes` hosts each, the first the
                                        # head; each host names its private-segment address in
                                        # vars.vllm_service_group_address
        hosts:
          <host>: {address: 10.0.0.11, port: 22, user: root, gpu: {...}, models_root: ..., vars: {...}}
    rollout:
      waves:                            # in order; a host is in at most one wave
        - {name: canary, canary: true, hosts: [gpu-01]}
        - {name: rest, hosts: [gpu-02, gpu-03], serial: 1, max_fail_percentage: 50}   # this wave's own
      max_fail_percentage: 0            # the other waves' (a canary wave tolerates none)
"""

from __future__ import annotations

import re

import yaml
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import models_root_problem
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import NAME as SERVED_NAME_RE


class FleetError(ModelfleetError):
    """A fleet file is malformed; the message names file, line and field."""


# The inventory plugin's names: its FQCN, and the short name it had before the collection (fleet files say either).
PLUGIN_NAMES = ("modelfleet.fleet.fleet", "fleet")
TOP_KEYS = {"plugin", "models_root", "connection", "vars", "groups", "rollout", "gpu", "profile",
            "compose", "keyed_groups", "conditional_groups", "strict", "cache", "profiles_dir", "cache_plugin",
            "cache_timeout", "cache_connection", "cache_prefix", "leading_separator", "use_extra_vars"}
GROUP_KEYS = {"profile", "gpu", "models_root", "connection", "vars", "hosts", "endpoint", "multi_host"}
MULTI_HOST_KEYS = {"layout", "nodes", "port"}
MULTI_HOST_LAYOUTS = ("pp", "dp")
ENDPOINT_KEYS = {"host", "port", "model"}
HOST_KEYS = {"address", "port", "user", "gpu", "models_root", "connection", "vars", "profile"}
GPU_KEYS = {"kind", "count", "memory_gib", "interconnect"}
INTERCONNECTS = {"pcie", "nvlink", "mixed", "single", "none"}
ROLLOUT_KEYS = {"waves", "max_fail_percentage"}
WAVE_KEYS = {"name", "hosts", "canary", "serial", "max_fail_percentage"}
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9]+)?\]?)\Z")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last one)."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for knode, _dummy in node.value:
        key = loader.construct_object(knode, deep=deep)
        if key in seen:
            raise FleetError(f"line {knode.start_mark.line + 1}: duplicate key {key!r} "
                             f"(first at line {seen[key] + 1}); each host and group may appear once")
        seen[key] = knode.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _lines(node, path=()) -> dict:
    """Line number (1-based) of every mapping key / sequence item, keyed by its path of keys."""
    out = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (k.value,)
            out[p] = k.start_mark.line + 1
            out.update({q: n for q, n in _lines(v, p).items() if q != p})
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.update(_lines(v, path + (i,)))
    return out


class _Ctx:
    def __init__(self, source: str, lines: dict):
        self.source, self.lines = source, lines

    def fail(self, path: tuple, msg: str):
        line = None
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line:
                break
        where = f"{self.source}:{line}" if line else self.source
        field = ".".join(str(x) for x in path) or "(top)"
        raise FleetError(f"{where}: {field}: {msg}")

    def keys(self, data, allowed: set, path: tuple, what: str):
        if not isinstance(data, dict):
            self.fail(path, f"{what} must be a mapping, got {type(data).__name__}")
        for k in data:
            if k not in allowed:
                self.fail(path + (k,), f"unknown key {k!r} in {what}; allowed: {', '.join(sorted(allowed))}")


def load_text(text: str, source: str) -> tuple[dict, dict]:
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except FleetError as e:
        raise FleetError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        raise FleetError(f"{source}: not valid YAML: {e}") from None
    return data or {}, (_lines(node) if node is not None else {})


def _check_gpu(ctx, gpu, path):
    ctx.keys(gpu, GPU_KEYS, path, "gpu")
    if "count" in gpu:
        c = gpu["count"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            ctx.fail(path + ("count",), f"GPU count must be a positive integer, got {c!r}")
    if "memory_gib" in gpu:
        m = gpu["memory_gib"]
        if isinstance(m, bool) or not isinstance(m, int | float) or m <= 0:
            ctx.fail(path + ("memory_gib",), f"memory_gib must be a positive number, got {m!r}")
    if "interconnect" in gpu and gpu["interconnect"] not in INTERCONNECTS:
        ctx.fail(path + ("interconnect",), f"interconnect {gpu['interconnect']!r} is not one of "
                                           f"{', '.join(sorted(INTERCONNECTS))}")
    if "kind" in gpu and not (isinstance(gpu["kind"], str) and NAME_RE.match(gpu["kind"])):
        ctx.fail(path + ("kind",), f"GPU kind must be a name like rtx-pro-6000 or h200, got {gpu['kind']!r}")


def _check_common(ctx, data, path, profiles):
    if "gpu" in data:
        _check_gpu(ctx, data["gpu"], path + ("gpu",))
    for k in ("connection", "vars"):
        if k in data and not isinstance(data[k], dict):
            ctx.fail(path + (k,), f"{k} must be a mapping of variables")
    if "connection" in data:
        for k in data["connection"]:
            if not str(k).startswith("ansible_"):
                ctx.fail(path + ("connection", k), "connection keys are Ansible connection variables "
                                                   "(ansible_connection, ansible_user, ...)")
    if "profile" in data and profiles is not None and data["profile"] not in profiles:
        ctx.fail(path + ("profile",), f"profile {data['profile']!r} does not exist; known: "
                                      f"{', '.join(sorted(profiles)) or '(none)'} (profiles/<name>.yml)")
    if "models_root" in data:
        problem = models_root_problem(data["models_root"], resolve=False)
        if problem:
            ctx.fail(path + ("models_root",), problem)
    if "address" in data and not (isinstance(data["address"], str) and ADDRESS_RE.match(data["address"])):
        ctx.fail(path + ("address",), f"address {data['address']!r} is not a host name or an IP address "
                                      "(letters, digits, '.', '-', ':'; not starting with '-')")


def _group_name(prefix: str, value) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", str(value))


def _percentage(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v <= 100


def _serving_groups(ctx, groups_in, hosts, groups):
    """Each group's `multi_host`: its hosts, in file order, make replicas of `nodes` hosts each (the first of each
    the head, rank 0, the one that serves HTTP), and every member gets modelfleet_serving_group = {name, layout,
    nodes, port, hosts (the head first), head}. The name is the group's, or <group>-<k> for the k-th of several.
    What the members' units need and the file can say is checked here, with its line: the layout, a host count
    that `nodes` divides, each member's group address, and one vLLM port for the members (the head's is the
    replica's URL)."""
    for g, gd in groups_in.items():
        if "multi_host" not in gd:
            continue
        mh = gd["multi_host"]
        p = ("groups", g, "multi_host")
        ctx.keys(mh, MULTI_HOST_KEYS, p, f"group {g}'s multi_host")
        layout = mh.get("layout")
        if layout not in MULTI_HOST_LAYOUTS:
            ctx.fail(p + ("layout",), f"layout must be pp (pipeline parallel: one model split over the hosts) or dp "
                                      f"(data parallel: a whole copy per host, one API on the head), got {layout!r}")
        nodes = mh.get("nodes")
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2:
            ctx.fail(p + ("nodes",), f"nodes (the hosts of one replica) must be a whole number >= 2, got {nodes!r}; "
                                     "a replica on one host needs no multi_host")
        port = mh.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535):
            ctx.fail(p + ("port",), f"the group port must be 1024-65535, got {port!r}")
        members = groups[g]["hosts"]
        if len(members) % nodes:
            rem = len(members) % nodes
            ctx.fail(p + ("nodes",), f"group {g} has {len(members)} host(s), not a multiple of nodes {nodes}: each "
                                     f"replica takes {nodes} hosts; add {nodes - rem} host(s)"
                                     + (f" or remove {rem}" if len(members) > nodes else "") + ", or change nodes")
        chunks = [members[i:i + nodes] for i in range(0, len(members), nodes)]
        for k, chunk in enumerate(chunks, start=1):
            name = g if len(chunks) == 1 else f"{g}-{k}"
            served = {h: hosts[h].get("modelfleet_profile") for h in chunk}
            if len(set(served.values())) > 1:
                ctx.fail(("groups", g, "hosts", chunk[1]),
                         f"the members of replica {name} declare different profiles "
                         f"({', '.join(f'{h}: {v}' for h, v in served.items())}): its hosts serve one model; set "
                         "the profile once, on the group")
            ports = {h: hosts[h].get("vllm_service_port") for h in chunk}
            if len(set(ports.values())) > 1:  # one unset means the default: it differs from a set one
                ctx.fail(("groups", g, "hosts", chunk[1]),
                         f"the members of replica {name} set different vllm_service_port values "
                         f"({', '.join(f'{h}: {v}' for h, v in ports.items())}): a replica has one URL, its head's; "
                         "set the port once, on the group")
            seen: dict = {}
            for h in chunk:
                addr = hosts[h].get("vllm_service_group_address")
                if not addr:
                    ctx.fail(("groups", g, "hosts", h),
                             f"host {h} is a member of multi-host replica {name} and has no group address: set "
                             "vars.vllm_service_group_address to its address on the private segment the members "
                             "share (their traffic is unencrypted and must not leave it)")
                if addr in seen:
                    ctx.fail(("groups", g, "hosts", h),
                             f"hosts {seen[addr]} and {h} of replica {name} have one group address ({addr}): each "
                             "member needs its own (set vllm_service_group_address on each host, not on the group)")
                seen[addr] = h
                hosts[h]["modelfleet_serving_group"] = {"name": name, "layout": layout, "nodes": nodes,
                                                        "port": port, "hosts": list(chunk), "head": chunk[0]}


def _endpoints(ctx, groups_in, hosts, groups):
    """Each group's `endpoint`: the host that runs it gets {name: group, port, model, hosts} in modelfleet_endpoints
    and joins the derived group `endpoints`; each replica gets {host, name, model} in modelfleet_endpoint and
    answers to the endpoint's model name besides its profile's own (vllm_service_served_aliases): the name the
    endpoint's clients use and its checks ask for, by default the group's name, so it stays when the group
    switches to another model."""
    used: dict = {}
    for g, gd in groups_in.items():
        if "endpoint" not in gd:
            continue
        ep = gd["endpoint"]
        p = ("groups", g, "endpoint")
        ctx.keys(ep, ENDPOINT_KEYS, p, f"group {g}'s endpoint")
        host, port = ep.get("host"), ep.get("port")
        if host not in hosts:
            ctx.fail(p + ("host",), f"endpoint host {host!r} is not a host of this fleet file; name one of "
                                    f"{', '.join(sorted(hosts))} (it needs no GPU work of its own group)")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            ctx.fail(p + ("port",), f"endpoint port must be 1-65535, got {port!r}")
        if (host, port) in used:
            ctx.fail(p + ("port",), f"port {port} on {host} is already group {used[(host, port)]}'s endpoint")
        serving = hosts[host].get("vllm_service_port")
        if serving == port:
            ctx.fail(p + ("port",), f"port {port} is the vLLM port of {host} (vllm_service_port); pick another")
        model = ep.get("model", g)
        if not (isinstance(model, str) and SERVED_NAME_RE.match(model)):
            ctx.fail(p + ("model",), f"the endpoint's model name {model!r} (by default the group's name) must be "
                                     "1-63 letters, digits, '.', '_' or '-': set endpoint.model to such a name")
        used[(host, port)] = g
        # the replicas: each host, or each multi-host replica's head (its other members serve no HTTP)
        replicas = [h for h in groups[g]["hosts"]
                    if hosts[h].get("modelfleet_serving_group", {}).get("head", h) == h]
        hosts[host].setdefault("modelfleet_endpoints", []).append(
            {"name": g, "port": port, "model": model, "hosts": replicas})
        for member in groups[g]["hosts"]:
            if member in replicas:  # where a switch of this replica drains it first
                hosts[member]["modelfleet_endpoint"] = {"host": host, "name": g, "model": model}
            aliases = hosts[member].get("vllm_service_served_aliases") or []
            if not isinstance(aliases, list):
                ctx.fail(("groups", g, "hosts", member), "vllm_service_served_aliases must be a list of names")
            hosts[member]["vllm_service_served_aliases"] = [*aliases, *([] if model in aliases else [model])]
        if host not in groups.setdefault("endpoints", {"hosts": [], "vars": {}})["hosts"]:
            groups["endpoints"]["hosts"].append(host)


def parse(text: str, source: str = "<fleet>", profiles: set | None = None) -> dict:
    """Validate a fleet file and return {hosts: {name: vars}, groups: {name: {hosts, vars}}, rollout}."""
    data, lines = load_text(text, source)
    ctx = _Ctx(source, lines)
    ctx.keys(data, TOP_KEYS, (), "the fleet file")
    if data.get("plugin") not in PLUGIN_NAMES:
        ctx.fail(("plugin",), "must be 'modelfleet.fleet.fleet' (or its short name 'fleet')")
    _check_common(ctx, data, (), profiles)
    groups_in = data.get("groups")
    if not isinstance(groups_in, dict) or not groups_in:
        ctx.fail(("groups",), "a fleet needs at least one group with hosts")
    hosts: dict = {}
    groups: dict = {}
    for g, gd in groups_in.items():
        gp = ("groups", g)
        if not NAME_RE.match(str(g)):
            ctx.fail(gp, f"group name {g!r} must be letters, digits, '_', '.', '-'")
        ctx.keys(gd, GROUP_KEYS, gp, f"group {g}")
        _check_common(ctx, gd, gp, profiles)
        members = gd.get("hosts")
        if not isinstance(members, dict) or not members:
            ctx.fail(gp + ("hosts",), f"group {g} needs a mapping of hosts")
        groups[g] = {"hosts": [], "vars": {}}
        for h, hd in members.items():
            hp = gp + ("hosts", h)
            hd = hd or {}
            if not NAME_RE.match(str(h)):
                ctx.fail(hp, f"host name {h!r} must be letters, digits, '_', '.', '-'")
            ctx.keys(hd, HOST_KEYS, hp, f"host {h}")
            _check_common(ctx, hd, hp, profiles)
            if "port" in hd and (isinstance(hd["port"], bool) or not isinstance(hd["port"], int)
                                 or not 1 <= hd["port"] <= 65535):
                ctx.fail(hp + ("port",), f"port must be 1-65535, got {hd['port']!r}")
            if h in hosts:
                ctx.fail(hp, f"duplicate host {h}: already in group {hosts[h]['modelfleet_group']}")
            gpu = {**(data.get("gpu") or {}), **(gd.get("gpu") or {}), **(hd.get("gpu") or {})}
            if "count" not in gpu:
                ctx.fail(hp + ("gpu",), "no GPU count for this host (set gpu.count on the host, group or fleet)")
            v = {}
            for layer in (data, gd, hd):
                v.update(layer.get("connection") or {})
            for layer in (data, gd, hd):
                v.update(layer.get("vars") or {})
            if "address" in hd:
                v["ansible_host"] = hd["address"]
            if "port" in hd:
                v["ansible_port"] = hd["port"]
            if "user" in hd:
                v["ansible_user"] = hd["user"]
            profile = hd.get("profile") or gd.get("profile") or data.get("profile")
            v.update(modelfleet_group=g, modelfleet_gpu_kind=gpu.get("kind", "unknown"),
                     modelfleet_gpu_count=gpu["count"], modelfleet_gpu_memory_gib=gpu.get("memory_gib"),
                     modelfleet_interconnect=gpu.get("interconnect", "single" if gpu["count"] == 1 else "unknown"),
                     modelfleet_models_root=hd.get("models_root") or gd.get("models_root")
                     or data.get("models_root") or "/models",
                     modelfleet_profile=profile, modelfleet_wave=None, modelfleet_wave_index=None,
                     modelfleet_canary=False)
            hosts[h] = v
            groups[g]["hosts"].append(h)
    _serving_groups(ctx, groups_in, hosts, groups)
    _endpoints(ctx, groups_in, hosts, groups)
    rollout = data.get("rollout") or {}
    ctx.keys(rollout, ROLLOUT_KEYS, ("rollout",), "rollout")
    mfp = rollout.get("max_fail_percentage", 0)
    if not _percentage(mfp):
        ctx.fail(("rollout", "max_fail_percentage"), f"must be 0-100, got {mfp!r}")
    waves = rollout.get("waves") or []
    if not isinstance(waves, list):
        ctx.fail(("rollout", "waves"), "waves must be a list of {name, hosts, canary}")
    wave_of: dict = {}
    names = set()
    for i, w in enumerate(waves):
        wp = ("rollout", "waves", i)
        ctx.keys(w, WAVE_KEYS, wp, f"wave {i + 1}")
        name = w.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            ctx.fail(wp + ("name",), f"wave {i + 1} needs a name (letters, digits, '_', '.', '-')")
        if name in names:
            ctx.fail(wp + ("name",), f"duplicate wave name {name}")
        names.add(name)
        serial = w.get("serial")
        if serial is not None and not (
                (isinstance(serial, int) and not isinstance(serial, bool) and serial >= 1)
                or (isinstance(serial, str) and re.match(r"^(100|[1-9][0-9]?)%\Z", serial))):
            ctx.fail(wp + ("serial",), f"wave {name}: serial must be a number of hosts >= 1 or a percentage "
                                       f"such as '25%', got {serial!r}")
        if w.get("canary") and i != 0:
            ctx.fail(wp + ("canary",), f"only the first wave can be the canary ({name} is wave {i + 1})")
        if "max_fail_percentage" in w:
            if not _percentage(w["max_fail_percentage"]):
                ctx.fail(wp + ("max_fail_percentage",), f"wave {name}: max_fail_percentage must be 0-100, got "
                                                        f"{w['max_fail_percentage']!r}")
            if w.get("canary") and w["max_fail_percentage"] != 0:
                ctx.fail(wp + ("max_fail_percentage",),
                         f"wave {name}: a canary wave tolerates no failure (any failed canary stops the rollout); "
                         "remove its max_fail_percentage, or make it an ordinary first wave")
        members = w.get("hosts")
        if not isinstance(members, list) or not members:
            ctx.fail(wp + ("hosts",), f"wave {name} needs a list of hosts")
        for h in members:
            if h not in hosts:
                ctx.fail(wp + ("hosts",), f"wave {name} names host {h!r}, which no group defines")
            if h in wave_of:
                ctx.fail(wp + ("hosts",), f"host {h} is in two exclusive waves: {wave_of[h]} and {name}")
            wave_of[h] = name
            hosts[h].update(modelfleet_wave=name, modelfleet_wave_index=i, modelfleet_canary=bool(w.get("canary")))
    for h, v in hosts.items():
        sg = v.get("modelfleet_serving_group")
        if sg and h == sg["head"] and len({wave_of.get(m) for m in sg["hosts"]}) > 1:
            where = ", ".join(f"{m}: {wave_of.get(m) or 'none'}" for m in sg["hosts"])
            ctx.fail(("rollout", "waves"), f"the members of multi-host replica {sg['name']} are in different waves "
                                           f"({where}); a replica is deployed as one: put its hosts in one wave")
    if waves:
        missing = sorted(set(hosts) - set(wave_of))
        if missing:
            ctx.fail(("rollout", "waves"), f"hosts in no wave: {', '.join(missing)} (every host needs a wave, "
                                           "or leave rollout.waves out)")
    # derived groups (a fleet group of the same name is refused where it is met)
    if "endpoints" in groups_in and any("endpoint" in (gd or {}) for gd in groups_in.values()):
        ctx.fail(("groups", "endpoints"), "group name endpoints clashes with the derived group of the hosts that "
                                          "run an endpoint; rename it")
    for h, v in hosts.items():
        for gname in (_group_name("gpu_", v["modelfleet_gpu_kind"]),
                      _group_name("interconnect_", v["modelfleet_interconnect"]),
                      _group_name("profile_", v["modelfleet_profile"]) if v["modelfleet_profile"] else None,
                      _group_name("wave_", v["modelfleet_wave"]) if v["modelfleet_wave"] else None,
                      "canary" if v["modelfleet_canary"] else None):
            if gname:
                if gname in groups_in:
                    ctx.fail(("groups", gname), f"group name {gname} clashes with a derived group "
                                                "(gpu_*, interconnect_*, profile_*, wave_*, canary); rename it")
                groups.setdefault(gname, {"hosts": [], "vars": {}})["hosts"].append(h)
    return {"hosts": hosts, "groups": groups,
            "rollout": {"waves": [{"name": w["name"], "hosts": list(w["hosts"]), "canary": bool(w.get("canary")),
                                   "serial": w.get("serial"),
                                   **({"max_fail_percentage": w["max_fail_percentage"]}
                                      if "max_fail_percentage" in w else {})} for w in waves],
                        "max_fail_percentage": mfp},
            "options": {k: data[k] for k in ("compose", "keyed_groups", "conditional_groups", "strict")
                        if k in data}}

"""One model across several hosts (issue 24): which layout a model needs on a group of hosts, and what each member
runs. vLLM does this itself, without Ray, through its multiprocessing launcher: pipeline parallel across hosts
(`--nnodes N --node-rank R --master-addr HEAD --master-port P`, the other nodes `--headless`; only the head serves
HTTP), or data parallel with headless ranks (`--data-parallel-size N --data-parallel-address HEAD
--data-parallel-rpc-port P`, the others `--headless --data-parallel-start-rank R`).

`layout` is the rule (one host while the model fits one with room for its context, else the fewest pipeline
stages that fit, one host each, TP within a host - the links between hosts are Ethernet or InfiniBand, where
pipeline parallel sends one activation per stage and token while tensor or expert parallel would all-reduce or
all-to-all every layer); `members` derives every member's ranks, addresses, ports and environment from the
inventory, and refuses what it cannot derive instead of guessing."""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import gpus_from_facts, plan
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes

LAYOUTS = ("auto", "single", "pp", "dp")
DEFAULT_MASTER_PORT = 29501
DEFAULT_DP_RPC_PORT = 29550


def _host_gpus(hosts: list[dict]) -> dict:
    """The one GPU description every host of the group shares (gpu_facts' output or the planner's input)."""
    if not hosts:
        raise PlanError("a group needs at least one host")
    norm = [gpus_from_facts(h) if "gpu_count" in h and "memory_bytes" not in h else h for h in hosts]
    first = norm[0]
    key = (first.get("count"), first.get("memory_bytes"))
    for i, h in enumerate(norm[1:], start=1):
        if (h.get("count"), h.get("memory_bytes")) != key:
            name = hosts[i].get("host", f"host {i + 1}")
            raise PlanError(f"the members of a group must have the same GPUs: {hosts[0].get('host', 'host 1')} has "
                            f"{key[0]} x {fmt_bytes(key[1] or 0)}, {name} {h.get('count')} x "
                            f"{fmt_bytes(h.get('memory_bytes') or 0)}; group hosts of one kind")
    return first


def _room_ok(p: dict, need_tokens: int) -> bool:
    return bool(p["fits"]) and p["kv_tokens_capacity"] >= need_tokens


def layout(facts: dict, hosts: list[dict], profile: dict | None = None, input_len: int = 1024,
           output_len: int = 1024, **plan_kw) -> dict:
    """The plan for a model on a group of `hosts` (each host's GPUs, all alike), with `layout` (single | pp | dp),
    `nodes` (hosts used), `data_parallel_size`, and its reasons first. The profile may ask for a layout
    (vllm.multi_host: {layout: auto|single|pp|dp, nodes: N}); a layout that cannot hold the model is a PlanError
    that says what would."""
    gpus = _host_gpus(hosts)
    req = ((profile or {}).get("vllm") or {}).get("multi_host") or {}
    want = req.get("layout", "auto")
    if want not in LAYOUTS:
        raise PlanError(f"vllm.multi_host.layout must be one of {', '.join(LAYOUTS)}, got {want!r}")
    nodes = req.get("nodes", "auto")
    if nodes != "auto" and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise PlanError(f"vllm.multi_host.nodes must be a whole number >= 1 or auto, got {nodes!r}")
    if nodes != "auto" and nodes > len(hosts):
        raise PlanError(f"the profile asks for {nodes} hosts; the group has {len(hosts)}: add hosts to the group "
                        "or lower vllm.multi_host.nodes")
    max_len = ((profile or {}).get("vllm") or {}).get("max_model_len")
    need = max(max_len or 0, input_len + output_len)
    kw = dict(plan_kw, input_len=input_len, output_len=output_len)
    one = plan(facts, gpus, profile, **kw)
    what = f"{gpus['count']} x {fmt_bytes(gpus['memory_bytes'])}"

    def done(p: dict, kind: str, n: int, why: str) -> dict:
        p = dict(p, layout=kind, nodes=n, data_parallel_size=n if kind == "dp" else 1)
        p["reasons"] = [why] + p["reasons"]
        return p

    if want in ("auto", "single") and _room_ok(one, need) and nodes in ("auto", 1):
        why = f"one host: the model fits {what} with room for {one['kv_tokens_capacity']} tokens of KV cache"
        return done(one, "single", 1, f"{why} (a sequence needs {need})")
    if want == "dp":
        if not _room_ok(one, need):
            raise PlanError(f"data parallel keeps a whole copy on each host, and one host of {what} cannot hold it "
                            f"({'; '.join(one['reasons'][-1:])}); use layout pp")
        n = len(hosts) if nodes == "auto" else nodes
        return done(one, "dp", n, f"data parallel over {n} hosts (the profile asks for it): a whole copy per host, "
                                  "one API on the head, requests spread over the ranks")
    if want == "single" or nodes == 1:
        raise PlanError(f"the model does not fit one host of {what} with room for a {need}-token sequence "
                        f"({one['reasons'][-1]}); let the layout be auto (pipeline parallel across hosts)")
    tried = []
    for n in ([nodes] if nodes != "auto" else range(2, len(hosts) + 1)):
        p = plan(facts, gpus, profile, pipeline_parallel_size=n, **kw)
        if _room_ok(p, need):
            return done(p, "pp", n, (
                f"{n} hosts: the model does not fit one host of {what} (it needs "
                f"{fmt_bytes(one['weight_bytes_per_gpu'] + one['overhead_bytes_per_gpu'])} per GPU of "
                f"{fmt_bytes(one['memory_budget_bytes_per_gpu'])}); pipeline parallel {n} stages across hosts, TP="
                f"{p['tensor_parallel_size']} within each ({fmt_bytes(p['weight_bytes_per_gpu'])} of weights per "
                f"GPU, room for {p['kv_tokens_capacity']} tokens of KV cache)"))
        tried.append(f"PP={n}: {fmt_bytes(p['weight_bytes_per_gpu'])} of weights per GPU, "
                     f"{p['kv_tokens_capacity']} KV tokens")
    if not tried:
        raise PlanError(f"the model does not fit one host of {what} with room for a {need}-token sequence "
                        f"({one['reasons'][-1]}); add hosts to the group (pipeline parallel across hosts), or use "
                        "hosts with more GPU memory")
    n = len(hosts) if nodes == "auto" else nodes
    raise PlanError(f"the model does not fit {n} hosts of {what} with room for a {need}-token sequence "
                    f"({'; '.join(tried)}); add hosts, or use hosts with more GPU memory")


def _address(m: dict) -> str:
    addr = m.get("address")
    if not addr:
        raise PlanError(f"{m.get('host', '?')}: no group address (vllm_service_group_address): the members reach "
                        "each other on a private segment, which the inventory must name for each host")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise PlanError(f"{m.get('host', '?')}: group address {addr!r} is not an IP address; give the host's "
                        "address on the private segment") from None
    if ip.is_loopback or ip.is_unspecified:
        raise PlanError(f"{m.get('host', '?')}: group address {addr} is loopback or unspecified: the other members "
                        "cannot reach it; give the host's address on the private segment")
    return str(ip)


# the private segment's interface, as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME both take it: a Linux interface
# name (1-15 characters) or a comma list of them; never blanks, quotes or control characters (the value goes
# into the unit's Environment=). NCCL's own '^'/'=' marks are not gloo's, so they are not accepted here.
IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*\Z")


def _ifname(h: dict) -> str | None:
    name = h.get("ifname")
    if name in (None, ""):
        return None
    if not isinstance(name, str) or not IFNAME.match(name):
        raise PlanError(f"{h.get('host', '?')}: group interface {name!r} (vllm_service_group_ifname) is not an "
                        "interface name: give the private segment's interface as `ip link` names it (e.g. ens8f0; "
                        "up to 15 letters, digits or . _ - :, several separated by commas)")
    return name


def members(p: dict, hosts: list[dict], http_port: int, group_port: int | None = None) -> list[dict]:
    """Each member of the group of plan `p` (layout pp or dp): {host, rank, role (head | headless), address, args
    (vLLM arguments beyond the single-host ones), environment, peers (the other members' addresses), ports (the
    group's ports the members reach each other on)}. hosts: [{host, address, ifname?}] in group order, the head
    first. Anything that cannot be derived is a PlanError."""
    kind = p.get("layout")
    if kind not in ("pp", "dp"):
        raise PlanError(f"members are derived for a multi-host layout (pp or dp), not {kind!r}")
    n = p["nodes"]
    if len(hosts) != n:
        raise PlanError(f"the layout needs {n} hosts and the group has {len(hosts)}: "
                        f"{'add' if len(hosts) < n else 'remove'} {abs(n - len(hosts))}")
    names = [h.get("host") for h in hosts]
    if any(not x for x in names) or len(set(names)) != n:
        raise PlanError(f"every member needs a distinct host name, got {names}")
    addrs = [_address(h) for h in hosts]
    if len(set(addrs)) != n:
        raise PlanError(f"two members share a group address ({addrs}); each host needs its own")
    port = group_port or (DEFAULT_MASTER_PORT if kind == "pp" else DEFAULT_DP_RPC_PORT)
    if not isinstance(port, int) or not 1024 <= port <= 65535 or port == http_port:
        raise PlanError(f"group port {port!r} must be a free port in 1024-65535 other than the HTTP port "
                        f"{http_port}")
    head = addrs[0]
    out = []
    for r, (h, addr) in enumerate(zip(hosts, addrs, strict=True)):
        env = {"VLLM_HOST_IP": addr}
        ifname = _ifname(h)
        if ifname:
            env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
        if kind == "pp":
            args = ["--pipeline-parallel-size", str(p["pipeline_parallel_size"]), "--nnodes", str(n),
                    "--node-rank", str(r), "--master-addr", head, "--master-port", str(port)]
        else:
            args = ["--data-parallel-size", str(n), "--data-parallel-size-local", "1", "--data-parallel-address",
                    head, "--data-parallel-rpc-port", str(port)]
            if r:
                args += ["--data-parallel-start-rank", str(r)]
        if r:
            args.append("--headless")
        out.append({"host": h["host"], "rank": r, "role": "head" if r == 0 else "headless", "address": addr,
                    "args": args, "environment": env, "peers": [a for a in addrs if a != addr] or [addr],
                    "ports": [port]})
    return out


def replica_plan(serving: dict, p: dict | None = None) -> dict:
    """The plan a multi-host replica's members are derived from (`members`' first argument). serving: the
    replica as the fleet file declares it ({layout, nodes, ...}: modelfleet_serving_group). p: the planner's plan
    for it (`layout` over every member's GPUs, which honours the declared layout and nodes), or None on hosts
    without GPU facts (CPU hosts), where the declared layout is the plan."""
    kind, n = (serving or {}).get("layout"), (serving or {}).get("nodes")
    if kind not in ("pp", "dp") or isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise PlanError(f"a multi-host replica needs layout pp or dp and nodes >= 2, got {kind!r} and {n!r}")
    if p:
        if (p.get("layout"), p.get("nodes")) != (kind, n):
            raise PlanError(f"the plan is {p.get('layout')} on {p.get('nodes')} host(s), the fleet file asks for "
                            f"{kind} on {n}: plan the replica with its multi_host")
        return p
    return {"layout": kind, "nodes": n, "pipeline_parallel_size": n if kind == "pp" else 1,
            "data_parallel_size": n if kind == "dp" else 1,
            "reasons": [f"{kind} over {n} hosts, as the fleet file's multi_host asks (no GPU facts to plan from)"]}


def layout_request(profile: dict | None, serving: dict) -> dict:
    """The profile with the replica's layout and nodes as its vllm.multi_host (what `layout` reads)."""
    profile = dict(profile or {})
    profile["vllm"] = dict(profile.get("vllm") or {},
                           multi_host={"layout": serving["layout"], "nodes": serving["nodes"]})
    return profile


def request_problem(profile: dict | None, serving: dict | None) -> str:
    """What is wrong between a profile's vllm.multi_host (what the model asks for) and the host's multi-host
    replica in the fleet file (modelfleet_serving_group; None when it serves alone), or '' when they agree. A
    profile that asks for several hosts on a host that serves alone, or for another layout or host count than
    its replica has, would otherwise be deployed as something it did not ask for."""
    req = ((profile or {}).get("vllm") or {}).get("multi_host") or {}
    want, nodes = req.get("layout", "auto"), req.get("nodes", "auto")
    name = (profile or {}).get("name", "the profile")
    if not serving:
        if want in ("pp", "dp") or (nodes != "auto" and nodes > 1):
            return (f"profile {name} asks for {want if want != 'auto' else 'a layout'} over "
                    f"{nodes if nodes != 'auto' else 'several'} hosts (vllm.multi_host), and this host serves alone: "
                    "declare the replica on its fleet group (multi_host: {layout, nodes}, and each host's "
                    "vllm_service_group_address), or remove vllm.multi_host from the profile")
        return ""
    if want == "single" or (want in ("pp", "dp") and want != serving.get("layout")) or (
            nodes != "auto" and nodes != serving.get("nodes")):
        return (f"profile {name} asks for {want} on {nodes} host(s) (vllm.multi_host), and its fleet group makes "
                f"replica {serving.get('name')} {serving.get('layout')} on {serving.get('nodes')} hosts "
                "(multi_host): make them agree")
    return ""

"""The runner wrapper: modelfleet's playbooks driven from Python through ansible-runner.

    from modelfleet import runner
    res = runner.deploy("kimi-k2.5-int4", inventory="inventory/seed", on_event=print_event)
    res.ok, res.hosts["gpu-01"].facts["vllm_service_outcome"]["url"]

Every run gets a run directory with a stable layout:
    <state_dir>/runs/<run-id>/
        artifacts/<run-id>/        ansible-runner's own (stdout, job_events/*.json, rc, status)
        events.jsonl               every event, one per line
        result.json                the RunResult (per-host status, counts, phase reached, facts)
        bench/                     benchmark reports (the benchmark role writes here: MODELFLEET_RUN_DIR)
state_dir: $MODELFLEET_STATE_DIR, else ~/.local/state/modelfleet.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from modelfleet import collection

PHASES = {"storage_cleanup": "cleanup", "hf_fetch": "fetch", "nvidia_env": "environment",
          "vllm_service": "serve", "benchmark": "benchmark", "smoke_service": "smoke"}
OUTCOME_SUFFIX = "_outcome"
# facts kept besides the *_outcome ones: the deploy's rollout plan (set on localhost by deploy_model.yml)
KEPT_FACTS = ("modelfleet_rollout_plan",)


def state_dir() -> Path:
    """$MODELFLEET_STATE_DIR, else ~/.local/state/modelfleet (the one rule: controller_paths.state_dir, which the
    playbooks reach through the state_dir lookup)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.controller_paths import (
        state_dir as _state_dir,
    )

    return Path(_state_dir())


@dataclass
class HostResult:
    host: str
    status: str = "pending"          # ok | failed | unreachable | skipped | pending
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    phase: str = ""                  # the role (phase) of the last task seen
    task: str = ""                   # the last task seen
    detail: str = ""                 # the last progress line (download bytes/rate/ETA, readiness wait)
    failure: str = ""                # the message of the failure that was not rescued
    phases: list = field(default_factory=list)
    phase_seconds: dict = field(default_factory=dict)   # wall time per phase (union of its tasks' runs)
    facts: dict = field(default_factory=dict)   # *_outcome facts: plan, fetch, unit, readiness, benchmark


@dataclass
class RunResult:
    playbook: str
    run_id: str
    run_dir: str
    check: bool
    rc: int
    status: str
    started_at: float
    duration_s: float
    events: int
    hosts: dict

    @property
    def ok(self) -> bool:
        """Every host ok, and at least one fleet host ran: a run on the controller alone is never a success."""
        fleet = [n for n in self.hosts if n not in ("localhost", "127.0.0.1")]
        return self.rc == 0 and bool(fleet) and all(h.status == "ok" for h in self.hosts.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _event_time(ev: dict) -> float | None:
    try:
        return datetime.fromisoformat(str(ev.get("created"))).timestamp()
    except ValueError:
        return None


def _task_interval(ev: dict) -> tuple[float, float] | None:
    """The [start, end] of one task result on one host (ansible-runner puts both in event_data); the
    event's own time, as an instant, where they are missing."""
    data = ev.get("event_data") or {}
    try:
        return (datetime.fromisoformat(str(data["start"])).timestamp(),
                datetime.fromisoformat(str(data["end"])).timestamp())
    except (KeyError, ValueError):
        t = _event_time(ev)
        return None if t is None else (t, t)


# roles that are not a phase of their own: the defaults role (argument checks) and the deploy steps, whose time
# belongs to the play they run in (or to the capability role they include)
NOT_PHASES = ("modelfleet", "modelfleet_deploy")
COLLECTION_PREFIX = collection.NAME + "."


def _phase_of(data: dict) -> str:
    """A role's phase name, else the play's short name (before " - ": Canary wave, Distribute, Switch)."""
    role = data.get("role") or ""
    if role.startswith(COLLECTION_PREFIX):  # the collection's roles are named by FQCN in the events
        role = role[len(COLLECTION_PREFIX):]
    if role in NOT_PHASES:
        role = ""
    return PHASES.get(role, role or (data.get("play") or "").split(" - ")[0])


def phase_spans(events) -> list[tuple[str, str, float, float]]:
    """(host, phase, start, end) of every task result in ansible-runner events (dicts). A host that comes
    back to a phase in a later play (the canary's fetch phase in the distribute play) gets a second
    interval, not one span over everything in between."""
    spans = []
    for ev in events:
        data = ev.get("event_data") or {}
        name = data.get("host") or data.get("remote_addr")
        if not name or not str(ev.get("event", "")).startswith("runner_on_"):
            continue
        iv = _task_interval(ev)
        if iv is not None:
            spans.append((name, _phase_of(data), iv[0], iv[1]))
    return spans


def _union_seconds(ivs) -> float:
    total, cur = 0.0, None
    for a, b in sorted(ivs):
        if cur and a <= cur[1]:
            cur[1] = max(cur[1], b)
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = [a, b]
    if cur:
        total += cur[1] - cur[0]
    return total


def wall_seconds_in(spans, phases) -> float:
    """Wall time during which at least one host was in one of `phases`: the union of those intervals, so
    hosts fetching in parallel count once and the time between them not at all."""
    return round(_union_seconds((a, b) for _, p, a, b in spans if p in phases), 1)


class _Tracker:
    """Folds ansible-runner events into per-host state."""

    def __init__(self, on_event: Callable | None, events_file: Path):
        self.hosts: dict[str, HostResult] = {}
        self.on_event = on_event
        self.count = 0
        self.spans: dict = {}
        self.events = events_file.open("w")

    def host(self, name: str) -> HostResult:
        if name not in self.hosts:
            self.hosts[name] = HostResult(host=name)
        return self.hosts[name]

    def __call__(self, ev: dict) -> bool:
        self.count += 1
        self.events.write(json.dumps(ev, default=str) + "\n")
        data = ev.get("event_data") or {}
        name = data.get("host") or data.get("remote_addr")
        kind = ev.get("event", "")
        if name and kind.startswith("runner_on_"):
            h = self.host(name)
            phase = _phase_of(data)
            if phase and (not h.phases or h.phases[-1] != phase):
                h.phases.append(phase)
            iv = _task_interval(ev)
            if phase and iv is not None:
                ivs = self.spans.setdefault((name, phase), [])
                ivs.append(iv)
                h.phase_seconds[phase] = round(_union_seconds(ivs), 1)
            h.phase, h.task = phase, data.get("task") or ""
            res = data.get("res") or {}
            if kind == "runner_on_ok":
                for k, v in (res.get("ansible_facts") or {}).items():
                    if k.endswith(OUTCOME_SUFFIX) or k in KEPT_FACTS:
                        h.facts[k] = v
                msg = res.get("msg")
                if isinstance(msg, str) and "progress" in h.task.lower():
                    h.detail = " ".join(msg.split())[:160]
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                h.failure = str(res.get("msg") or res.get("stderr") or "failed")[:2000]
            elif kind == "runner_on_unreachable":
                h.failure = str(res.get("msg") or "unreachable")[:2000]
        if kind == "playbook_on_stats":
            for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("dark", "unreachable"),
                              ("skipped", "skipped"), ("rescued", "rescued")):
                for name, n in (data.get(key) or {}).items():
                    setattr(self.host(name), attr, n)
            for h in self.hosts.values():
                if h.unreachable:
                    h.status = "unreachable"
                elif h.failed:
                    h.status = "failed"
                elif h.ok or h.changed:
                    h.status = "ok"
                else:
                    h.status = "skipped"
        if self.on_event:
            self.on_event(ev, self.hosts)
        return True

    def close(self):
        self.events.close()


class InventoryError(ValueError):
    """The inventory cannot be run against: a fleet file that fails validation, no host, a limit that matches
    nothing. Raised before anything runs."""


def inventory_hosts(inventory: str | None, limit: str | None = None) -> list[str]:
    """The hosts a run would target, read by Ansible itself with unparsed inventories made fatal, so a fleet
    file that fails validation is an error naming file:line: field: message, never a warning followed by a
    run on no host. A limit that matches nothing names the pattern and the hosts there are."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(collection.ansible_cfg()), ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
               ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")

    def listing(pattern_limit):
        cmd = ["ansible", "all", "--list-hosts"] + (["-i", inventory] if inventory else [])
        if pattern_limit:
            cmd += ["--limit", pattern_limit]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=collection.root())
        hosts = [h.strip() for h in r.stdout.splitlines()[1:] if h.strip()] if "hosts (" in r.stdout else []
        return r, hosts

    r, hosts = listing(limit)
    text = r.stderr + r.stdout
    # the plugin as Ansible names it: fleet, modelfleet.fleet.fleet or its module path
    m = re.search(r"Failed to parse inventory with '(?:ansible_collections\.modelfleet\.fleet\.plugins\.inventory\.|"
                  r"modelfleet\.fleet\.)?fleet' plugin: (.+)", text)
    if m:
        raise InventoryError(f"fleet file does not validate: {m.group(1).strip()} (fix the fleet file; nothing ran)")
    if "Completely failed to parse inventory" in text or ("Unable to parse" in text and r.returncode != 0):
        first = next((x for x in text.splitlines() if "ERROR" in x or "WARNING" in x), text.strip()[:300])
        raise InventoryError(f"inventory {inventory}: cannot be parsed ({first.strip()}); nothing ran")
    if not hosts:
        if limit:
            _, every = listing(None)
            raise InventoryError(f"--limit {limit!r} matches no host of {inventory or 'the inventory'}; its hosts: "
                                 f"{', '.join(every) or '(none)'} (give one of them, a group, or a pattern)")
        raise InventoryError(f"inventory {inventory or '(default)'} has no host; add hosts to the fleet file")
    return hosts


def run_playbook(playbook: str, inventory: str | None = None, limit: str | None = None, check: bool = False,
                 extravars: dict | None = None, on_event: Callable | None = None, tags: str | None = None,
                 run_id: str | None = None, quiet: bool = True) -> RunResult:
    """Run one of modelfleet's playbooks (a name in playbooks/ or a path); returns the RunResult."""
    import ansible_runner

    pb = Path(playbook)
    playbooks = collection.playbooks_dir()
    if not pb.is_absolute():
        pb = (playbooks / playbook) if (playbooks / playbook).exists() else (Path.cwd() / playbook)
    if not pb.exists():
        raise FileNotFoundError(f"playbook {playbook} not found (looked in {playbooks})")
    inv = Path(inventory).resolve() if inventory else None
    if inv is not None and not inv.exists():
        raise FileNotFoundError(f"inventory {inventory} not found")
    inventory_hosts(str(inv) if inv else None, limit)
    run_id = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
    run_dir = state_dir() / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    tracker = _Tracker(on_event, run_dir / "events.jsonl")
    cmdline = []
    if check:
        cmdline += ["--check", "--diff"]
    if tags:
        cmdline += ["--tags", tags]
    env = {"ANSIBLE_CONFIG": str(collection.ansible_cfg()), "MODELFLEET_RUN_DIR": str(run_dir),
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
           "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "1"}
    started = time.time()
    try:
        r = ansible_runner.run(private_data_dir=str(run_dir), project_dir=str(collection.root()), playbook=str(pb),
                               inventory=str(inv) if inv else None, limit=limit, extravars=extravars or {},
                               cmdline=" ".join(cmdline) or None, envvars=env, ident=run_id, quiet=quiet,
                               event_handler=tracker, settings={"suppress_ansible_output": quiet})
    finally:
        tracker.close()
    res = RunResult(playbook=str(pb), run_id=run_id, run_dir=str(run_dir), check=check, rc=int(r.rc or 0),
                    status=r.status, started_at=started, duration_s=round(time.time() - started, 1),
                    events=tracker.count, hosts=tracker.hosts)
    (run_dir / "result.json").write_text(json.dumps(res.to_dict(), indent=2, default=str))
    return res


def deploy(profile: str | None = None, inventory: str | None = None, limit: str | None = None, check: bool = False,
           extravars: dict | None = None, on_event: Callable | None = None,
           playbook: str = "deploy_model.yml") -> RunResult:
    """Deploy the fleet to what its fleet file declares with playbooks/deploy_model.yml (or a playbook that
    imports it, such as deploy_kimi_int4.yml): each group its profile, the rollout's waves in order. A profile
    (profiles/<name>.yml) narrows the run to the hosts that declare it and is the profile of hosts that
    declare none (a plain inventory)."""
    ev = ({"modelfleet_profile_name": profile} if profile else {}) | (extravars or {})
    return run_playbook(playbook, inventory, limit, check, ev, on_event)


def preview(profile: str | None = None, inventory: str | None = None, limit: str | None = None,
            extravars: dict | None = None, on_event: Callable | None = None,
            playbook: str = "deploy_model.yml") -> RunResult:
    """The whole deploy in check mode (`modelfleet deploy --check`): the wave plan, what would be deleted,
    downloaded, started; changes nothing. (The TP/EP planner is `modelfleet plan`, a different thing.)"""
    return deploy(profile, inventory, limit, True, extravars, on_event, playbook)


def bench(inventory: str | None = None, limit: str | None = None, extravars: dict | None = None,
          on_event: Callable | None = None) -> RunResult:
    return run_playbook("benchmark.yml", inventory, limit, False, extravars, on_event)


def status(inventory: str | None = None, limit: str | None = None, on_event: Callable | None = None) -> RunResult:
    """Each host's state: served model, revision, unit active, last benchmark (read-only)."""
    return run_playbook("status.yml", inventory, limit, False, None, on_event)

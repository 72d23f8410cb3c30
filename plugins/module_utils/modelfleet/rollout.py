"""The rollout a fleet file declares, as the ordered batches a deploy runs (issue 21: the fleet file is the
desired state). Pure: it takes what `fleet.parse` returns.

- Waves run in the order the file lists them; only the first may be the canary (fleet.parse refuses
  others). A fleet without `rollout.waves` is one wave, `all`, with the caller's default pace.
- Each wave is cut into batches by its own `serial` the way Ansible cuts a play: a number of hosts, or a
  percentage of the wave's hosts rounded down and at least one. No serial: the whole wave at once.
- `max_fail_percentage` is a wave's own, else the rollout's, and holds per batch by Ansible's rule: the
  rollout stops after a batch where more than that share of its hosts failed, or where every host failed.
  A canary wave tolerates none (any failed canary stops the rollout).
- `limit` (host names, already matched by Ansible's pattern rules) and `profile` narrow the plan without
  reordering it: hosts outside are dropped, a wave left empty is dropped.
- A multi-host replica (a fleet group's `multi_host`: several hosts serving one model as one vLLM group) is one
  unit of the rollout: `serial` counts replicas, a batch never splits one, and a run that targets some of its
  hosts but not all is refused (the members start together and block on each other).
"""

from __future__ import annotations

import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError


class RolloutError(ModelfleetError):
    """The rollout cannot be planned as asked (a limit or profile that matches no host of the fleet)."""


def batch_size(serial, count: int) -> int:
    """Hosts per batch for a wave of `count` hosts, by Ansible's rule for `serial`."""
    if count <= 0:
        return 0
    if serial is None:
        return count
    if isinstance(serial, str):
        m = re.match(r"^(\d+)%\Z", serial)
        if not m:
            raise RolloutError(f"serial {serial!r} is neither a number of hosts nor a percentage such as '25%'")
        return max(1, int(int(m.group(1)) / 100.0 * count))
    if isinstance(serial, bool) or not isinstance(serial, int) or serial < 1:
        raise RolloutError(f"serial {serial!r} is neither a number of hosts nor a percentage such as '25%'")
    return min(serial, count)


def _units(members: list, units: dict) -> list[list]:
    """The wave's hosts as the rollout's units in the wave's order: a host alone, or a multi-host replica (its
    hosts in the replica's order, the head first) where its first host appears."""
    out, seen = [], set()
    for h in members:
        if h in seen:
            continue
        unit = [m for m in (units.get(h) or [h]) if m in members] or [h]
        seen.update(unit)
        out.append(unit)
    return out


def wave_plan(parsed: dict, limit=None, profile: str | None = None, default_serial=None,
              units: dict | None = None) -> list[dict]:
    """[{name, index, canary, serial, max_fail_percentage, batches: [[host, ...], ...],
    profiles: {host: profile}}] in the order the deploy runs them. units: {host: [the hosts of its multi-host
    replica]} for the hosts that are members of one; `serial` then counts replicas, never splitting one."""
    hosts = parsed["hosts"]
    rollout = parsed.get("rollout") or {}
    mfp = rollout.get("max_fail_percentage", 0)
    waves = rollout.get("waves") or [
        {"name": "all", "hosts": sorted(hosts), "canary": False, "serial": default_serial}]
    wanted = set(hosts)
    if limit is not None:
        unknown = sorted(set(limit) - set(hosts))
        if unknown:
            raise RolloutError(f"limit names host(s) {', '.join(unknown)}, which no fleet group defines; hosts "
                               f"there: {', '.join(sorted(hosts))}")
        wanted &= set(limit)
    if profile is not None:
        wanted = {h for h in wanted if hosts[h].get("modelfleet_profile") == profile}
    if not wanted:
        raise RolloutError(
            "no fleet host left to deploy"
            + (f" with profile {profile!r} (hosts declare: "
               + ", ".join(sorted({str(v.get('modelfleet_profile')) for v in hosts.values()})) + ")"
               if profile is not None else "")
            + (f" within the limit {', '.join(sorted(limit))}" if limit is not None else ""))
    out = []
    for index, w in enumerate(waves):
        members = [h for h in w["hosts"] if h in wanted]
        if not members:
            continue
        cut = _units(members, units if units is not None else {
            h: v["modelfleet_serving_group"]["hosts"] for h, v in hosts.items() if v.get("modelfleet_serving_group")})
        size = batch_size(w.get("serial"), len(cut))
        out.append({"name": w["name"], "index": index, "canary": bool(w.get("canary")), "serial": w.get("serial"),
                    "max_fail_percentage": 0 if w.get("canary") else w.get("max_fail_percentage", mfp),
                    "batches": [[h for u in cut[i:i + size] for h in u] for i in range(0, len(cut), size)],
                    "profiles": {h: hosts[h].get("modelfleet_profile") for h in members},
                    # the multi-host replicas of the wave (several hosts each, the head first)
                    "replicas": [u for u in cut if len(u) > 1]})
    return out


def tolerated_failures(batch: int, max_fail_percentage) -> int:
    """How many hosts of a batch of `batch` may fail before the rollout stops, by Ansible's rule for
    max_fail_percentage (it stops when failed / batch > the percentage) and its rule that a batch where every
    host failed ends the play."""
    if batch <= 0:
        return 0
    allowed = 0
    while allowed < batch and (allowed + 1) * 100 <= max_fail_percentage * batch:
        allowed += 1
    return min(allowed, batch - 1)


def plan_text(plan: list[dict]) -> str:
    """The plan as `deploy --check` prints it: one line per wave, one per batch with each host's model."""
    lines = []
    for w in plan:
        pace = "all at once" if w["serial"] is None else f"serial {w['serial']}"
        lines.append(f"wave {w['index'] + 1} {w['name']}{' (canary)' if w['canary'] else ''}: "
                     f"{sum(len(b) for b in w['batches'])} host(s), {pace}, "
                     f"max {w['max_fail_percentage']}% failed per batch")
        heads = {u[0]: u for u in w.get("replicas") or []}
        inner = {h for u in heads.values() for h in u[1:]}
        for i, batch in enumerate(w["batches"], start=1):
            lines.append(f"  batch {i}: " + ", ".join(
                (f"{' + '.join(heads[h])} (one replica, head {h}: {w['profiles'][h] or 'no profile'})" if h in heads
                 else f"{h} ({w['profiles'][h] or 'no profile'})") for h in batch if h not in inner))
    return "\n".join(lines)


def host_profiles(declared: dict, profile: str | None = None) -> dict:
    """Each targeted host's profile: the one its fleet group declares; a named profile narrows the run to
    the hosts that declare it and is the profile of hosts that declare none (a plain inventory)."""
    if not declared:
        raise RolloutError("no host to deploy: the inventory lists none, or --limit / modelfleet_targets match none "
                           "(check that it parses: ansible-inventory -i <fleet file> --graph)")
    out = {}
    for h, p in declared.items():
        if p is None or p == "":
            if profile is None:
                continue
            out[h] = profile
        elif profile is None or p == profile:
            out[h] = p
    if not out:
        if profile is None:
            raise RolloutError(
                f"no profile to deploy on {', '.join(sorted(declared)) or 'any host'}: name one "
                "(-e modelfleet_profile_name=<profile>, or `modelfleet deploy <profile>`) or declare `profile:` "
                "on the hosts' fleet group")
        raise RolloutError(
            f"no targeted host serves profile {profile!r}: the hosts declare "
            + ", ".join(f"{h}: {p}" for h, p in sorted(declared.items()))
            + "; run without a profile to converge every group to its own")
    return out


def _replicas(serving: dict | None, profiles: dict, declared: dict) -> dict:
    """{host: the hosts of its multi-host replica} for the targeted members; a replica this run would deploy in
    part is refused."""
    out = {}
    for h, sg in (serving or {}).items():
        if not sg or h not in profiles:
            continue
        hosts = list(sg.get("hosts") or [])
        missing = [m for m in hosts if m not in profiles]
        if missing:
            why = ", ".join(f"{m} ({'serves another profile' if m in declared else 'not targeted'})" for m in missing)
            raise RolloutError(f"{h} is a member of multi-host replica {sg.get('name')} ({', '.join(hosts)}), and "
                               f"this run would leave out {why}: a replica is deployed as one (its members start "
                               f"together and wait for each other); target all its hosts (--limit "
                               f"{','.join(hosts)}) or none")
        out[h] = hosts
    return out


def deploy_plan(declared: dict, rollout: dict | None = None, canary=(), profile: str | None = None,
                default_serial=None, default_max_fail_percentage: int = 0, serving: dict | None = None) -> dict:
    """What `deploy_model.yml` runs, from the hosts Ansible targets (after --limit), in inventory order.

    declared: {host: the profile its fleet group declares, or None}. rollout: the fleet file's
    (modelfleet_rollout), or None for a plain inventory, whose waves are then the `canary` group and the
    rest at `default_serial`. Hosts declaring none take `profile`; hosts declaring another are left out
    (and reported in `left_out`). serving: {host: its modelfleet_serving_group (the fleet inventory's), or None}:
    a multi-host replica's members go into one batch, and a run that targets part of one is refused."""
    profiles = host_profiles(declared, profile)
    replicas = _replicas(serving, profiles, declared)
    hosts = list(profiles)
    if rollout and rollout.get("waves"):
        waves = rollout["waves"]
        mfp = rollout.get("max_fail_percentage", 0)
    else:
        # a canary that is a member of a multi-host replica brings the replica's other members into the wave
        canaries = [h for h in hosts if h in set(canary) or set(replicas.get(h, [])) & set(canary)]
        waves = ([{"name": "canary", "hosts": canaries, "canary": True, "serial": None}] if canaries else []) + [
            {"name": "rest", "hosts": [h for h in hosts if h not in canaries], "canary": False,
             "serial": default_serial}]
        mfp = default_max_fail_percentage
    placed = {h for w in waves for h in w["hosts"]}
    unplaced = [h for h in hosts if h not in placed]
    if unplaced:
        raise RolloutError(f"host(s) {', '.join(unplaced)} are in no rollout wave; add them to one in the fleet "
                           "file's rollout.waves")
    parsed = {"hosts": {h: {"modelfleet_profile": profiles[h]} for h in hosts},
              "rollout": {"waves": waves, "max_fail_percentage": mfp}}
    plan = wave_plan(parsed, units=replicas)
    canary_waves = [w for w in plan if w["canary"]]
    rest_waves = [w for w in plan if not w["canary"]]
    wave_of = {}
    for w in plan:
        for i, batch in enumerate(w["batches"], start=1):
            for h in batch:
                wave_of[h] = {"wave": w["name"], "wave_number": w["index"] + 1, "batch": i,
                              "batches": len(w["batches"]), "batch_hosts": batch,
                              "max_fail_percentage": w["max_fail_percentage"],
                              "tolerated_failures": tolerated_failures(len(batch), w["max_fail_percentage"])}
    order = [h for w in plan for b in w["batches"] for h in b]
    profile_hosts: dict = {}
    for h in order:
        profile_hosts.setdefault(profiles[h], []).append(h)
    return {
        "waves": plan,
        "text": plan_text(plan),
        "host_profile": profiles,
        "profiles": sorted(set(profiles.values())),
        "left_out": sorted(set(declared) - set(profiles)),
        "canary_hosts": [h for w in canary_waves for b in w["batches"] for h in b],
        "canary_serial": [len(b) for w in canary_waves for b in w["batches"]] or [1],
        "rest_hosts": [h for w in rest_waves for b in w["batches"] for h in b],
        "rest_serial": [len(b) for w in rest_waves for b in w["batches"]] or [1],
        "max_fail_percentage": mfp,
        "wave_of": wave_of,
        # the host of each model that takes it from the hub (its first in the rollout: a canary when one serves
        # it); the others receive it from there
        "origins": {p: hs[0] for p, hs in profile_hosts.items()},
        # each profile's hosts in the rollout's order (the fan-out of a model stays among them)
        "profile_hosts": profile_hosts,
    }

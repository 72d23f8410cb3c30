"""Filter plugin over module_utils group (the one rule for what each member of a multi-host group runs):
`group_members` gives every member of a group its rank, role, vLLM arguments, environment and peers from a plan
(layout pp or dp) and the inventory's group addresses (`vllm_service_group_address`, and
`vllm_service_group_ifname` for the socket interfaces); `replica_members` does it for a fleet file's multi-host
replica (modelfleet_serving_group)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def group_members(plan, hosts, hostvars, http_port, group_port=None, address_var="vllm_service_group_address",
                  ifname_var="vllm_service_group_ifname"):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import errors, group

    rows = []
    for h in hosts or []:
        hv = hostvars[h] if h in hostvars else {}
        row = {"host": str(h), "address": hv.get(address_var)}
        if hv.get(ifname_var):
            row["ifname"] = str(hv.get(ifname_var))
        rows.append(row)
    try:
        return group.members(dict(plan or {}), rows, http_port=int(http_port),
                             group_port=int(group_port) if group_port else None)
    except (errors.ModelfleetError, TypeError, ValueError) as e:
        raise AnsibleFilterError(f"group_members: {e}") from None


def replica_members(serving, hostvars, http_port, plan=None, address_var="vllm_service_group_address",
                    ifname_var="vllm_service_group_ifname"):
    """The members of this host's multi-host replica (modelfleet_serving_group, as the fleet inventory plugin
    gives it) from the planner's plan for it, or from the declared layout on hosts without GPU facts."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import errors, group

    try:
        p = group.replica_plan(dict(serving or {}), dict(plan) if plan else None)
    except errors.ModelfleetError as e:
        raise AnsibleFilterError(f"replica_members: {e}") from None
    return group_members(p, (serving or {}).get("hosts"), hostvars, http_port, (serving or {}).get("port"),
                         address_var, ifname_var)


def replica_request_problem(profile, serving=None):
    """'' when the profile's vllm.multi_host and the host's multi-host replica (or its serving alone) agree; else
    what disagrees and how to fix it (module_utils group.request_problem)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group

    return group.request_problem(dict(profile or {}), dict(serving) if serving else None)


def unit_start_verdict(status, restarts_allowed=0):
    """Why a unit that was just started died before it was ready ('' while it has not): module_utils
    readiness.start_verdict over the properties systemd gives (ansible.builtin.systemd_service's `status`). A
    headless group member serves no HTTP, so its own unit is the only place its crash loop shows."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.readiness import start_verdict

    props = {str(k): str(v) for k, v in dict(status or {}).items()}
    dead, why = start_verdict(props, int(restarts_allowed))
    return why if dead else ""


class FilterModule:
    def filters(self):
        return {"group_members": group_members, "replica_members": replica_members,
                "replica_request_problem": replica_request_problem, "unit_start_verdict": unit_start_verdict}

"""Filter plugin over module_utils group (the one rule for what each member of a multi-host group runs):
`group_members` gives every member of a group its rank, role, vLLM arguments, environment and peers from a plan
(layout pp or dp) and the inventory's group addresses (`vllm_service_group_address`, and
`vllm_service_group_ifname` for the socket interfaces)."""

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


class FilterModule:
    def filters(self):
        return {"group_members": group_members}

"""Filter plugin over module_utils endpoint (the one rule for which replicas an endpoint names): `endpoint_frontends`
gives the endpoint host its frontends from the fleet file's endpoints and each replica's deploy outcome."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def endpoint_frontends(endpoints, hostvars, outcome="modelfleet_deploy_outcome", key="vllm_service_api_key"):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import endpoint

    members = {}
    for ep in endpoints or []:
        for h in ep.get("hosts") or []:
            hv = hostvars[h] if h in hostvars else {}
            members[str(h)] = {"outcome": dict(hv.get(outcome) or {}), "api_key": str(hv.get(key) or "")}
    try:
        return endpoint.frontends([dict(ep) for ep in endpoints or []], members)
    except endpoint.EndpointError as e:
        raise AnsibleFilterError(f"endpoint_frontends: {e}") from None


class FilterModule:
    def filters(self):
        return {"endpoint_frontends": endpoint_frontends}

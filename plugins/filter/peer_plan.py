"""Filter plugins over module_utils peer (the one rule for peer distribution): `peer_plan` gives each receiver its
sources in order (parent, then ancestors, the origin last), `peer_served_by` the receivers each host serves,
`peer_sources` a receiver's sources as hf_peer_pull takes them."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def peer_plan(receivers, origin, fanout=1):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer

    try:
        return peer.plan(str(origin), [str(r) for r in receivers], int(fanout))
    except (TypeError, ValueError) as e:
        raise AnsibleFilterError(f"peer_plan: {e} (receivers is a list of hosts, fanout an integer >= 1)") from None
    except peer.PeerError as e:
        raise AnsibleFilterError(f"peer_plan: {e}") from None


def peer_served_by(plan):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer

    if not isinstance(plan, dict):
        raise AnsibleFilterError("peer_served_by: give it the mapping peer_plan returned")
    return peer.served_by(plan)


def peer_sources(names, hostvars, user, origin, fact="__hf_fetch_peer_me"):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer

    reach = {str(n): dict(hostvars[n].get(fact) or {}) for n in names if n in hostvars}
    try:
        return peer.source_entries([str(n) for n in names], reach, str(user), str(origin))
    except peer.PeerError as e:
        raise AnsibleFilterError(f"peer_sources: {e}") from None


class FilterModule:
    def filters(self):
        return {"peer_plan": peer_plan, "peer_served_by": peer_served_by,
                "peer_sources": peer_sources}

"""Filter plugin: the bytes a fetch needs free on the models root (module_utils fetch.required_bytes, the one rule:
the model, plus the Xet chunk cache's bound on the host that downloads from the hub with Xet on)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean


def fetch_required_bytes(total_bytes, xet=False, xet_cache_bytes=0, from_hub=True):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import fetch

    try:
        # booleans as Ansible reads them: an inventory's "false" is False
        return fetch.required_bytes(int(total_bytes), boolean(xet, strict=True), int(xet_cache_bytes),
                                    boolean(from_hub, strict=True))
    except (TypeError, ValueError) as e:
        raise AnsibleFilterError(f"fetch_required_bytes: {e} (total_bytes and xet_cache_bytes are byte counts, "
                                 "xet and from_hub booleans)") from None


class FilterModule:
    def filters(self):
        return {"fetch_required_bytes": fetch_required_bytes}

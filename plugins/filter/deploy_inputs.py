"""Filter plugin: the digest of a deploy's inputs (module_utils deploy_record.inputs_digest, the one rule for
which variables count and how they are hashed). Runs on the controller, where the values are."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _deploy_record():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import deploy_record

    return deploy_record


def deploy_inputs_digest(inputs):
    """{profile, revision, plan, driver, code, variables} -> sha256 hex; `variables` may hold any variables (the
    rule keeps the inputs among them)."""
    if not isinstance(inputs, dict):
        raise AnsibleFilterError(f"deploy_inputs_digest: expected a mapping, got {type(inputs).__name__}")
    missing = sorted({"profile", "revision", "code", "variables"} - set(inputs))
    if missing:
        raise AnsibleFilterError(f"deploy_inputs_digest: missing {', '.join(missing)}")
    return _deploy_record().inputs_digest(profile=inputs["profile"], revision=inputs["revision"],
                                          plan=inputs.get("plan"), driver=inputs.get("driver"),
                                          code=inputs["code"], variables=dict(inputs["variables"]))


class FilterModule:
    def filters(self):
        return {"deploy_inputs_digest": deploy_inputs_digest}

#!/usr/bin/python
"""Ansible module shell over modelfleet's checkpoint inspection (plugins/module_utils/modelfleet)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_inspect
short_description: Read a checkpoint's facts from its config and safetensors headers, never its weights
description:
  - Reads C(config.json) (including a nested C(text_config)), C(model.safetensors.index.json) and every
    shard's safetensors header, from a local directory or from a Hugging Face hub repo at a revision
    (headers by HTTP range requests).
  - Returns architecture, attention kind, quantization (method, bits, group size, what is quantized,
    counted from the headers), shard count, exact sizes, logical parameter count, the resolved 40-hex
    revision and per-file size and sha256.
  - Read-only; it changes nothing, so check mode returns the same facts.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  path:
    description: A local checkpoint directory. Exactly one of O(path) and O(repo_id) is required.
    type: path
  repo_id:
    description: A hub repo id (C(org/name)).
    type: str
  revision:
    description: Branch, tag or commit on the hub (default C(main)); for O(path), the revision to report.
    type: str
  endpoint:
    description: Hub endpoint (a mirror or a local hub server). Default is C(HF_ENDPOINT) or the public hub.
    type: str
  token:
    description: Hub token. Never logged.
    type: str
  compute_capability:
    description: Target GPU compute capability (e.g. C(12.0)), to add compatibility warnings.
    type: str
  kv_cache_dtype:
    description: The KV cache dtype that will be used (e.g. C(fp8)), for compatibility warnings.
    type: str
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Inspect Kimi-K2.5 on the hub before downloading
  modelfleet.fleet.checkpoint_inspect:
    repo_id: moonshotai/Kimi-K2.5
    revision: main
    compute_capability: "12.0"
  register: __kimi_facts

- name: Inspect a local checkpoint
  modelfleet.fleet.checkpoint_inspect:
    path: /models/moonshotai--Kimi-K2.5/0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
checkpoint:
  description: The facts (see README "checkpoint_inspect" for every key).
  returned: success
  type: dict
  sample:
    architecture: KimiK25ForConditionalGeneration
    attention: mla
    num_shards: 64
    quantization: {method: compressed-tensors, bits: 4, group_size: 32, symmetric: true}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import (
    compatibility_warnings,
    inspect_hub,
    inspect_local,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path"},
            "repo_id": {"type": "str"},
            "revision": {"type": "str"},
            "endpoint": {"type": "str"},
            "token": {"type": "str", "no_log": True},
            "compute_capability": {"type": "str"},
            "kv_cache_dtype": {"type": "str"},
        },
        required_one_of=[("path", "repo_id")],
        mutually_exclusive=[("path", "repo_id")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["path"]:
            facts = inspect_local(p["path"], revision=p["revision"])
        else:
            facts = inspect_hub(p["repo_id"], revision=p["revision"] or "main", endpoint=p["endpoint"],
                                token=p["token"])
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    if p["compute_capability"] or p["kv_cache_dtype"]:
        pinned = bool(facts.get("revision")) and len(facts["revision"]) == 40
        facts["warnings"] = compatibility_warnings(facts, p["compute_capability"], pinned, p["kv_cache_dtype"])
    module.exit_json(changed=False, checkpoint=facts)


if __name__ == "__main__":
    main()

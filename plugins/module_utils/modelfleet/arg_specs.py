"""Argument-spec fragments for options several modules share (issue 21), so each option means and checks the same
thing everywhere; their documentation is the doc fragment of the same name (plugins/doc_fragments/modelfleet.py)."""

from __future__ import annotations

# how a module reaches the hub (hf_lock, hf_snapshot)
HUB_ACCESS = {
    "endpoint": {"type": "str"},
    "token_file": {"type": "path"},
}

# where a locked model lives on the host (hf_snapshot, hf_verify)
MODEL_FILES = {
    "root": {"type": "path", "required": True},
    "lock": {"type": "dict", "required": True},
}

# who owns the final files (hf_snapshot, hf_verify)
OWNERSHIP = {
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
}

# a running vLLM server (vllm_readiness, vllm_bench)
SERVER = {
    "url": {"type": "str", "required": True},
    "served_name": {"type": "str", "required": True},
    "api_key": {"type": "str", "no_log": True},
}

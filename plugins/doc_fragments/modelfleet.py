"""Documentation fragments for the options several modelfleet modules share; their argument specs are the
fragments of the same name in plugins/module_utils/modelfleet/arg_specs.py."""

from __future__ import annotations


class ModuleDocFragment:
    HUB_ACCESS = r"""
options:
  endpoint:
    description: Hub endpoint (a mirror or a local hub); default HF_ENDPOINT, else the public hub.
    type: str
  token_file:
    description: Root-only file holding the hub token (never logged).
    type: path
"""

    MODEL_FILES = r"""
options:
  root:
    description: The models root on the host.
    type: path
    required: true
  lock:
    description: The lock from M(modelfleet.fleet.hf_lock) (repo, commit, and each file's name, size and sha256).
    type: dict
    required: true
"""

    OWNERSHIP = r"""
options:
  owner:
    description: Owner of the final files.
    type: str
    default: root
  group:
    description: Group of the final files.
    type: str
    default: root
"""

    SERVER = r"""
options:
  url:
    description: Base URL of the server, e.g. http://127.0.0.1:8000.
    type: str
    required: true
  served_name:
    description: The served model name.
    type: str
    required: true
  api_key:
    description: API key (never logged).
    type: str
"""

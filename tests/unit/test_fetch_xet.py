"""The hub client's environment for a fetch (fetch.hub_environment, apply_hub_environment, transfer_facts) and the
bytes the disk plan reserves for it (fetch.required_bytes, the fetch_required_bytes filter)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import fetch
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

ROOT = Path(__file__).resolve().parents[2]


def test_xet_is_off_unless_asked():
    assert fetch.hub_environment("/m/staging") == {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


def test_xet_on_puts_its_bounded_cache_in_the_staging_folder():
    env = fetch.hub_environment("/m/.staging/org--x@c", xet=True, xet_cache_bytes=10 * 2**30, xet_high_performance=True)
    assert env == {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "0",
                   "HF_XET_CACHE": "/m/.staging/org--x@c/.cache/xet", "HF_XET_CHUNK_CACHE_SIZE_BYTES": "10737418240",
                   "HF_XET_HIGH_PERFORMANCE": "1"}


@pytest.mark.parametrize("bad", [0, -1, None, True, "10GB", 1.5])
def test_xet_on_without_a_positive_cache_size_is_refused(bad):
    with pytest.raises(ModelfleetError, match="xet_cache_bytes .*positive integer"):
        fetch.hub_environment("/s", xet=True, xet_cache_bytes=bad)


PROBE = """
import json, os, sys
import huggingface_hub  # imported before the environment is applied, as the module's process may have done
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import fetch
fetch.apply_hub_environment(fetch.hub_environment(sys.argv[1], xet=sys.argv[2] == "on", xet_cache_bytes=2048))
print(json.dumps(fetch.transfer_facts()))
"""


@pytest.mark.parametrize("mode", ["on", "off"])
def test_applied_environment_is_what_huggingface_hub_sees_even_after_its_import(tmp_path, mode):
    env = dict(os.environ, HF_HUB_DISABLE_XET="1" if mode == "on" else "0", HF_XET_CACHE=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "staging"), mode], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    if mode == "on":
        assert facts == {"xet": True, "xet_cache": str(tmp_path / "staging" / ".cache" / "xet"),
                         "xet_chunk_cache_bytes": 2048}
    else:
        assert facts == {"xet": False, "xet_cache": None, "xet_chunk_cache_bytes": None}


@pytest.mark.parametrize("xet,from_hub,want", [(False, True, 1000), (True, True, 1512), (True, False, 1000),
                                               (False, False, 1000)])
def test_the_plan_reserves_the_cache_only_where_xet_downloads(xet, from_hub, want):
    assert fetch.required_bytes(1000, xet=xet, xet_cache_bytes=512, from_hub=from_hub) == want


def test_the_filter_is_the_same_rule_through_ansible():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a",
         "msg={{ [100 | modelfleet.fleet.fetch_required_bytes(xet=true, xet_cache_bytes=5, from_hub=true),"
         " 100 | modelfleet.fleet.fetch_required_bytes(xet=true, xet_cache_bytes=5, from_hub=false),"
         " 100 | modelfleet.fleet.fetch_required_bytes(xet='false', xet_cache_bytes=5, from_hub=true)] }}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r'"msg": \[\s*105,\s*100,\s*100\s*\]', out.stdout), out.stdout  # "false" from an inventory


def test_the_deploys_reservation_uses_hf_fetchs_defaults():
    """modelfleet_deploy reserves before hf_fetch is included, so it names hf_fetch's defaults: they must agree."""
    defaults = yaml.safe_load((ROOT / "roles/hf_fetch/defaults/main.yml").read_text())
    text = (ROOT / "roles/modelfleet_deploy/tasks/fetch.yml").read_text()
    assert f"xet=hf_fetch_xet | default({str(defaults['hf_fetch_xet']).lower()})" in text
    assert f"xet_cache_bytes=hf_fetch_xet_cache_bytes | default({defaults['hf_fetch_xet_cache_bytes']})" in text
    assert "from_hub=inventory_hostname == modelfleet_deploy_origin_host" in text

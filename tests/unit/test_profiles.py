"""Profiles are data validated against a schema; a bad one is a one-line error naming file and field."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ProfileError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.profiles import (
    load_profile,
    validate_profile,
    version_satisfies,
)

from tests.conftest import ROOT

PROFILES = ROOT / "profiles"


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES.glob("*.yml")))
def test_shipped_profiles_validate(name):
    p = load_profile(name, str(PROFILES))
    assert p["name"] == name


def test_kimi_profile_has_the_seed_arguments():
    p = load_profile("kimi-k2.5-int4", str(PROFILES))
    assert p["repo_id"] == "moonshotai/Kimi-K2.5"
    v = p["vllm"]
    assert (v["tool_call_parser"], v["reasoning_parser"]) == ("kimi_k2", "kimi_k2")
    assert v["enable_auto_tool_choice"] and v["trust_remote_code"]
    assert v["kv_cache_dtype"] == "auto"


def test_minimax_requires_ep():
    assert load_profile("minimax-m2.5-fp8", str(PROFILES))["constraints"]["expert_parallel"] == "required"


BASE = yaml.safe_load((PROFILES / "kimi-k2.5-int4.yml").read_text())


def _mut(path, value):
    d = copy.deepcopy(BASE)
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d


@pytest.mark.parametrize("path,value,needle", [
    (("repo_id",), "no-slash", "not of the form org/name"),
    (("revision_policy",), "pinned", "not a 40-hex commit"),
    (("served_model_name",), KeyError, "required key 'served_model_name'"),
    (("colour",), "blue", "unknown key 'colour'"),
    (("vllm", "tool_call_parser"), "kimi_k3", "tool_call_parser 'kimi_k3' is unknown"),
    (("vllm", "tensor_parallel_size"), 0, "positive integer or 'auto'"),
    (("vllm", "tensor_parallel_size"), True, "not a boolean"),
    (("vllm", "gpu_memory_utilization"), 1.5, "(0, 1]"),
    (("vllm", "kv_cache_dtype"), "int2", "kv_cache_dtype 'int2'"),
    (("vllm", "version"), "newest", "not a version specifier"),
    (("vllm", "max_model_len"), "long", "max_model_len must be int"),
    (("constraints", "expert_parallel"), "sometimes", "required, forbidden or optional"),
    (("constraints", "min_compute_capability"), "sm120", "must look like '9.0'"),
    (("vllm", "multi_host"), "pp", "multi_host must be dict"),
    (("vllm", "multi_host"), {"layout": "ray"}, "vllm.multi_host.layout must be auto, single, pp or dp, got 'ray'"),
    (("vllm", "multi_host"), {"nodes": 0}, "vllm.multi_host.nodes must be a whole number >= 1 or auto, got 0"),
    (("vllm", "multi_host"), {"nodes": "two"}, "got 'two'"),
    (("vllm", "multi_host"), {"layout": "pp", "tp": 8}, "vllm.multi_host: unknown key 'tp'"),
])
def test_bad_profiles(path, value, needle):
    with pytest.raises(ProfileError) as e:
        validate_profile(_mut(path, value), "profiles/kimi-k2.5-int4.yml")
    assert needle in str(e.value) and str(e.value).startswith("profiles/kimi-k2.5-int4.yml")


def test_unknown_profile_lists_known():
    with pytest.raises(ProfileError, match="known: .*kimi-k2.5-int4"):
        load_profile("nope", str(PROFILES))


def test_bad_yaml_names_line(tmp_path):
    f = tmp_path / "x.yml"
    f.write_text("name: x\nvllm: [\n")
    with pytest.raises(ProfileError, match=r"x.yml: line \d+ not valid YAML"):
        load_profile(str(f), str(tmp_path))


@pytest.mark.parametrize("v,spec,ok", [("0.32.0", ">=0.11.0", True), ("0.10.2", ">=0.11", False),
                                       ("0.32.0", ">=0.11,<0.14", False), ("0.13.1", "~=0.13.0", True)])
def test_version_satisfies(v, spec, ok):
    assert version_satisfies(v, spec) is ok


def test_a_profile_may_ask_for_a_multi_host_layout():
    p = validate_profile(_mut(("vllm", "multi_host"), {"layout": "pp", "nodes": 2}), "profiles/kimi-k2.5-int4.yml")
    assert p["vllm"]["multi_host"] == {"layout": "pp", "nodes": 2}

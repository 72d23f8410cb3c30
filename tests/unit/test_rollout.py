"""The wave plan (issue 21): fleet file -> the ordered batches a deploy runs, with --limit, a profile, a
canary-less fleet and Ansible's rule for `serial`."""

from __future__ import annotations

import pytest
from ansible.module_utils.modelfleet import fleet
from ansible.module_utils.modelfleet.rollout import RolloutError, batch_size, plan_text, wave_plan

MIXED = """\
plugin: fleet
groups:
  a:
    profile: tiny-llama
    gpu: {count: 1}
    hosts: {fleet-1: {}, fleet-2: {}}
  b:
    profile: tiny-llama-b
    gpu: {count: 1}
    hosts: {fleet-3: {}}
rollout:
  max_fail_percentage: 0
  waves:
    - {name: canary, canary: true, hosts: [fleet-1]}
    - {name: rest, hosts: [fleet-3, fleet-2], serial: 1}
"""


def parsed(text=MIXED):
    return fleet.parse(text, "f.yml", None)


def test_waves_in_order_with_their_batches_and_models():
    assert wave_plan(parsed()) == [
        {"name": "canary", "index": 0, "canary": True, "serial": None, "max_fail_percentage": 0,
         "batches": [["fleet-1"]], "profiles": {"fleet-1": "tiny-llama"}},
        {"name": "rest", "index": 1, "canary": False, "serial": 1, "max_fail_percentage": 0,
         "batches": [["fleet-3"], ["fleet-2"]], "profiles": {"fleet-3": "tiny-llama-b", "fleet-2": "tiny-llama"}}]
    assert plan_text(wave_plan(parsed())) == (
        "wave 1 canary (canary): 1 host(s), all at once, max 0% failed per batch\n"
        "  batch 1: fleet-1 (tiny-llama)\n"
        "wave 2 rest: 2 host(s), serial 1, max 0% failed per batch\n"
        "  batch 1: fleet-3 (tiny-llama-b)\n"
        "  batch 2: fleet-2 (tiny-llama)")


def test_a_limit_narrows_without_reordering_and_drops_empty_waves():
    plan = wave_plan(parsed(), limit=["fleet-2", "fleet-3"])
    assert [(w["name"], w["index"], w["batches"]) for w in plan] == [("rest", 1, [["fleet-3"], ["fleet-2"]])]
    plan = wave_plan(parsed(), limit=["fleet-2", "fleet-1"])
    assert [(w["name"], w["batches"]) for w in plan] == [("canary", [["fleet-1"]]), ("rest", [["fleet-2"]])]
    with pytest.raises(RolloutError) as e:
        wave_plan(parsed(), limit=["fleet-9"])
    assert str(e.value) == ("limit names host(s) fleet-9, which no fleet group defines; hosts there: fleet-1, "
                            "fleet-2, fleet-3")


def test_a_profile_narrows_to_the_hosts_that_declare_it():
    plan = wave_plan(parsed(), profile="tiny-llama-b")
    assert [(w["name"], w["batches"]) for w in plan] == [("rest", [["fleet-3"]])]
    with pytest.raises(RolloutError) as e:
        wave_plan(parsed(), profile="kimi")
    assert str(e.value) == "no fleet host left to deploy with profile 'kimi' (hosts declare: tiny-llama, tiny-llama-b)"
    with pytest.raises(RolloutError) as e:
        wave_plan(parsed(), limit=["fleet-1"], profile="tiny-llama-b")
    assert str(e.value) == ("no fleet host left to deploy with profile 'tiny-llama-b' (hosts declare: tiny-llama, "
                            "tiny-llama-b) within the limit fleet-1")


def test_a_fleet_without_waves_is_one_wave_at_the_callers_pace():
    text = MIXED.split("rollout:")[0]
    assert wave_plan(parsed(text)) == [
        {"name": "all", "index": 0, "canary": False, "serial": None, "max_fail_percentage": 0,
         "batches": [["fleet-1", "fleet-2", "fleet-3"]],
         "profiles": {"fleet-1": "tiny-llama", "fleet-2": "tiny-llama", "fleet-3": "tiny-llama-b"}}]
    assert wave_plan(parsed(text), default_serial="50%")[0]["batches"] == [["fleet-1"], ["fleet-2"], ["fleet-3"]]


def test_a_canary_less_rollout_keeps_its_order():
    text = MIXED.replace("canary: true, ", "").replace("max_fail_percentage: 0", "max_fail_percentage: 25")
    plan = wave_plan(parsed(text))
    assert [(w["name"], w["canary"], w["max_fail_percentage"]) for w in plan] == [("canary", False, 25),
                                                                                    ("rest", False, 25)]


@pytest.mark.parametrize("serial,count,size", [
    (None, 5, 5), (1, 5, 1), (2, 5, 2), (9, 5, 5), ("50%", 5, 2), ("1%", 5, 1), ("100%", 5, 5), ("30%", 10, 3),
    ("34%", 3, 1), ("67%", 3, 2), (3, 0, 0),
])
def test_batch_size_follows_ansible(serial, count, size):
    assert batch_size(serial, count) == size


@pytest.mark.parametrize("serial", [0, -1, True, 1.5, "x", "10", "%"])
def test_bad_serial(serial):
    with pytest.raises(RolloutError) as e:
        batch_size(serial, 3)
    assert str(e.value) == f"serial {serial!r} is neither a number of hosts nor a percentage such as '25%'"

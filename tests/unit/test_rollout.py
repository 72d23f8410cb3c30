"""The wave plan (issue 21): fleet file -> the ordered batches a deploy runs, with --limit, a profile, a
canary-less fleet and Ansible's rule for `serial`."""

from __future__ import annotations

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.rollout import (
    RolloutError,
    batch_size,
    deploy_plan,
    host_profiles,
    plan_text,
    tolerated_failures,
    wave_plan,
)
from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet

MIXED = """\
plugin: modelfleet.fleet.fleet
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
         "batches": [["fleet-1"]], "profiles": {"fleet-1": "tiny-llama"}, "replicas": []},
        {"name": "rest", "index": 1, "canary": False, "serial": 1, "max_fail_percentage": 0,
         "batches": [["fleet-3"], ["fleet-2"]], "profiles": {"fleet-3": "tiny-llama-b", "fleet-2": "tiny-llama"},
         "replicas": []}]
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
         "profiles": {"fleet-1": "tiny-llama", "fleet-2": "tiny-llama", "fleet-3": "tiny-llama-b"}, "replicas": []}]
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


def _declared(text=MIXED, hosts=None):
    p = parsed(text)
    return {h: p["hosts"][h]["modelfleet_profile"] for h in (hosts or sorted(p["hosts"]))}, p["rollout"]


def test_the_deploy_runs_the_fleet_files_waves_with_each_hosts_own_profile():
    declared, rollout = _declared()
    plan = deploy_plan(declared, rollout)
    assert plan["host_profile"] == {"fleet-1": "tiny-llama", "fleet-2": "tiny-llama", "fleet-3": "tiny-llama-b"}
    assert plan["profiles"] == ["tiny-llama", "tiny-llama-b"] and plan["left_out"] == []
    assert (plan["canary_hosts"], plan["canary_serial"]) == (["fleet-1"], [1])
    # the rest wave in the file's order (fleet-3 before fleet-2), one host per batch
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["fleet-3", "fleet-2"], [1, 1])
    assert plan["wave_of"] == {
        "fleet-1": {"wave": "canary", "wave_number": 1, "batch": 1, "batches": 1, "batch_hosts": ["fleet-1"],
                    "max_fail_percentage": 0, "tolerated_failures": 0},
        "fleet-3": {"wave": "rest", "wave_number": 2, "batch": 1, "batches": 2, "batch_hosts": ["fleet-3"],
                    "max_fail_percentage": 0, "tolerated_failures": 0},
        "fleet-2": {"wave": "rest", "wave_number": 2, "batch": 2, "batches": 2, "batch_hosts": ["fleet-2"],
                    "max_fail_percentage": 0, "tolerated_failures": 0}}
    # each model from the hub once: tiny-llama through the canary, tiny-llama-b through its first host
    assert plan["origins"] == {"tiny-llama": "fleet-1", "tiny-llama-b": "fleet-3"}
    assert plan["profile_hosts"] == {"tiny-llama": ["fleet-1", "fleet-2"], "tiny-llama-b": ["fleet-3"]}
    assert plan["max_fail_percentage"] == 0
    assert plan["text"] == plan_text(plan["waves"])


def test_several_waves_become_one_list_of_batch_sizes_in_order():
    text = MIXED.replace("""    - {name: rest, hosts: [fleet-3, fleet-2], serial: 1}""",
                         """    - {name: second, hosts: [fleet-2]}\n    - {name: third, hosts: [fleet-3]}""")
    declared, rollout = _declared(text)
    plan = deploy_plan(declared, rollout)
    assert [w["name"] for w in plan["waves"]] == ["canary", "second", "third"]
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["fleet-2", "fleet-3"], [1, 1])
    text = MIXED.replace("serial: 1}", "serial: '50%'}").replace("hosts: {fleet-3: {}}",
                                                                "hosts: {fleet-3: {}, fleet-4: {}, fleet-5: {}}")
    text = text.replace("hosts: [fleet-3, fleet-2]", "hosts: [fleet-3, fleet-2, fleet-4, fleet-5]")
    declared, rollout = _declared(text)
    plan = deploy_plan(declared, rollout)
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["fleet-3", "fleet-2", "fleet-4", "fleet-5"], [2, 2])


def test_a_named_profile_narrows_the_deploy_to_the_hosts_that_declare_it():
    declared, rollout = _declared()
    plan = deploy_plan(declared, rollout, profile="tiny-llama-b")
    assert plan["host_profile"] == {"fleet-3": "tiny-llama-b"} and plan["left_out"] == ["fleet-1", "fleet-2"]
    assert (plan["canary_hosts"], plan["rest_hosts"]) == ([], ["fleet-3"])
    assert plan["origins"] == {"tiny-llama-b": "fleet-3"}
    with pytest.raises(RolloutError) as e:
        deploy_plan(declared, rollout, profile="kimi")
    assert str(e.value) == ("no targeted host serves profile 'kimi': the hosts declare fleet-1: tiny-llama, "
                            "fleet-2: tiny-llama, fleet-3: tiny-llama-b; run without a profile to converge every "
                            "group to its own")


def test_a_limit_is_the_targeted_hosts_and_keeps_the_order():
    declared, rollout = _declared(hosts=["fleet-2", "fleet-3"])
    plan = deploy_plan(declared, rollout)
    assert [w["name"] for w in plan["waves"]] == ["rest"] and plan["canary_hosts"] == []
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["fleet-3", "fleet-2"], [1, 1])
    assert plan["origins"] == {"tiny-llama-b": "fleet-3", "tiny-llama": "fleet-2"}
    assert plan["profile_hosts"] == {"tiny-llama-b": ["fleet-3"], "tiny-llama": ["fleet-2"]}


def test_a_plain_inventory_is_the_canary_group_then_the_rest_at_the_callers_pace():
    declared = {"fleet-1": None, "fleet-2": None, "fleet-3": None}
    plan = deploy_plan(declared, None, canary=["fleet-1"], profile="tiny-llama-b")
    assert [(w["name"], w["canary"], w["batches"]) for w in plan["waves"]] == [
        ("canary", True, [["fleet-1"]]), ("rest", False, [["fleet-2", "fleet-3"]])]
    assert (plan["canary_serial"], plan["rest_serial"]) == ([1], [2])
    plan = deploy_plan(declared, None, canary=["fleet-1"], profile="p", default_serial=1,
                       default_max_fail_percentage=50)
    assert plan["rest_serial"] == [1, 1] and plan["max_fail_percentage"] == 50
    assert plan["waves"][1]["max_fail_percentage"] == 50
    # no canary group: one wave; no host in a wave: nothing to run after it
    plan = deploy_plan(declared, None, profile="p", default_serial="50%")
    assert (plan["canary_hosts"], plan["canary_serial"]) == ([], [1])
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["fleet-1", "fleet-2", "fleet-3"], [1, 1, 1])
    plan = deploy_plan({"fleet-1": None}, None, canary=["fleet-1"], profile="p")
    assert (plan["rest_hosts"], plan["rest_serial"]) == ([], [1])


def test_a_host_without_a_profile_needs_one_named():
    with pytest.raises(RolloutError) as e:
        deploy_plan({"b": None, "a": None}, None)
    assert str(e.value) == ("no profile to deploy on a, b: name one (-e modelfleet_profile_name=<profile>, or "
                            "`modelfleet deploy <profile>`) or declare `profile:` on the hosts' fleet group")
    # hosts with a profile go ahead; the ones without are left out and reported
    assert host_profiles({"a": "p", "b": None}) == {"a": "p"}
    assert deploy_plan({"a": "p", "b": None}, None)["left_out"] == ["b"]


def test_a_host_the_rollout_does_not_place_is_refused():
    declared, rollout = _declared()
    with pytest.raises(RolloutError) as e:
        deploy_plan(dict(declared, extra="tiny-llama"), rollout)
    assert str(e.value) == ("host(s) extra are in no rollout wave; add them to one in the fleet file's "
                            "rollout.waves")


def test_an_empty_inventory_is_refused_by_name():
    with pytest.raises(RolloutError) as e:
        deploy_plan({}, None, profile="tiny-llama")
    assert str(e.value) == ("no host to deploy: the inventory lists none, or --limit / modelfleet_targets match none "
                            "(check that it parses: ansible-inventory -i <fleet file> --graph)")


@pytest.mark.parametrize("batch, mfp, allowed", [
    (1, 0, 0), (4, 0, 0), (4, 24, 0), (4, 25, 1), (4, 49.9, 1), (4, 50, 2), (3, 33, 0), (3, 34, 1),
    (3, 66, 1), (3, 67, 2), (10, 10, 1), (10, 100, 9), (1, 100, 0), (2, 100, 1), (0, 50, 0)])
def test_tolerated_failures_follow_ansibles_rule(batch, mfp, allowed):
    """Ansible stops after a batch where failed / batch > max_fail_percentage, and after one where every host
    failed, whatever the percentage."""
    assert tolerated_failures(batch, mfp) == allowed
    if batch:
        # the same rule stated as Ansible's code states it
        assert all((k / batch > mfp / 100 or k == batch) == (k > allowed) for k in range(batch + 1))


def test_each_wave_has_its_own_max_fail_percentage_and_the_canary_none():
    text = MIXED.replace("hosts: {fleet-3: {}}", "hosts: {fleet-3: {}, fleet-4: {}, fleet-5: {}, fleet-6: {}}")
    text = text.replace("max_fail_percentage: 0", "max_fail_percentage: 10")
    text = text.replace("    - {name: rest, hosts: [fleet-3, fleet-2], serial: 1}",
                        "    - {name: second, hosts: [fleet-2]}\n"
                        "    - {name: wide, hosts: [fleet-3, fleet-4, fleet-5, fleet-6], max_fail_percentage: 50}")
    declared, rollout = _declared(text)
    plan = deploy_plan(declared, rollout)
    assert [(w["name"], w["max_fail_percentage"]) for w in plan["waves"]] == [
        ("canary", 0), ("second", 10), ("wide", 50)]
    assert plan["wave_of"]["fleet-2"]["tolerated_failures"] == 0
    assert {h: plan["wave_of"][h]["tolerated_failures"] for h in ("fleet-3", "fleet-6")} == {"fleet-3": 2,
                                                                                              "fleet-6": 2}
    assert plan["wave_of"]["fleet-4"]["batch_hosts"] == ["fleet-3", "fleet-4", "fleet-5", "fleet-6"]
    assert "wave 3 wide: 4 host(s), all at once, max 50% failed per batch" in plan["text"]
    # a plain inventory: the canary group tolerates none, the rest the caller's percentage
    declared = {"a": None, "b": None, "c": None}
    plan = deploy_plan(declared, None, canary=["a"], profile="tiny-llama", default_max_fail_percentage=50)
    assert [(w["name"], w["max_fail_percentage"]) for w in plan["waves"]] == [("canary", 0), ("rest", 50)]
    assert plan["wave_of"]["b"]["tolerated_failures"] == 1


MULTI_HOST = """\
plugin: modelfleet.fleet.fleet
gpu: {count: 8}
groups:
  big:
    profile: kimi-k2.5-int4
    multi_host: {layout: pp, nodes: 2}
    hosts:
      h1: {vars: {vllm_service_group_address: 10.9.0.1}}
      h2: {vars: {vllm_service_group_address: 10.9.0.2}}
      h3: {vars: {vllm_service_group_address: 10.9.0.3}}
      h4: {vars: {vllm_service_group_address: 10.9.0.4}}
      h5: {vars: {vllm_service_group_address: 10.9.0.5}}
      h6: {vars: {vllm_service_group_address: 10.9.0.6}}
  small:
    profile: tiny-llama
    hosts: {s1: {}}
rollout:
  waves:
    - {name: canary, canary: true, hosts: [h1, h2]}
    - {name: rest, hosts: [h5, s1, h3, h4, h6], serial: 2}
"""


def _multi(text=MULTI_HOST, hosts=None):
    p = parsed(text)
    targeted = hosts or list(p["hosts"])
    return ({h: p["hosts"][h]["modelfleet_profile"] for h in targeted}, p["rollout"],
            {h: p["hosts"][h].get("modelfleet_serving_group") for h in targeted})


def test_a_multi_host_replica_is_one_unit_of_a_batch():
    """serial counts replicas: the rest wave's serial 2 is [h5+h6, s1] then [h3+h4] - a replica's hosts are never
    cut apart (its members start together and block on each other), whatever order the wave lists them in."""
    declared, rollout, serving = _multi()
    plan = deploy_plan(declared, rollout, serving=serving)
    assert (plan["canary_hosts"], plan["canary_serial"]) == (["h1", "h2"], [2])
    assert [w["batches"] for w in plan["waves"]] == [[["h1", "h2"]], [["h5", "h6", "s1"], ["h3", "h4"]]]
    assert (plan["rest_hosts"], plan["rest_serial"]) == (["h5", "h6", "s1", "h3", "h4"], [3, 2])
    assert plan["wave_of"]["h6"]["batch_hosts"] == ["h5", "h6", "s1"]
    assert plan["text"].splitlines()[3:] == [
        "  batch 1: h5 + h6 (one replica, head h5: kimi-k2.5-int4), s1 (tiny-llama)",
        "  batch 2: h3 + h4 (one replica, head h3: kimi-k2.5-int4)"]
    # without the serving groups the same wave would cut h5 from h6
    assert deploy_plan(declared, rollout)["waves"][1]["batches"][0] == ["h5", "s1"]


@pytest.mark.parametrize("hosts,why", [
    (["h1", "h2", "h3"], r"h3 is a member of multi-host replica big-2 \(h3, h4\), and this run would leave out h4 "
                         r"\(not targeted\): a replica is deployed as one .* target all its hosts \(--limit h3,h4\)"),
    (["h4", "s1"], r"h4 is a member of multi-host replica big-2 \(h3, h4\), and this run would leave out h3"),
])
def test_a_run_that_targets_part_of_a_replica_is_refused(hosts, why):
    declared, rollout, serving = _multi(hosts=hosts)
    with pytest.raises(RolloutError, match=why):
        deploy_plan(declared, rollout, serving=serving)


def test_a_whole_replica_may_be_targeted_alone():
    declared, rollout, serving = _multi(hosts=["h3", "h4"])
    plan = deploy_plan(declared, rollout, serving=serving)
    assert plan["rest_hosts"] == ["h3", "h4"] and plan["rest_serial"] == [2]


def test_a_plain_inventorys_canary_brings_its_replica():
    """Without a rollout the canary group's hosts go first; a canary that is a member of a replica brings the
    replica's other members into the canary wave (they cannot start without each other)."""
    declared, _rollout, serving = _multi()
    plan = deploy_plan(declared, None, canary=["h2"], default_serial=1, serving=serving)
    assert plan["canary_hosts"] == ["h1", "h2"] and plan["canary_serial"] == [2]
    assert plan["rest_serial"] == [2, 2, 1]

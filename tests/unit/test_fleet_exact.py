"""The fleet file's contract, exactly: every host variable the inventory publishes (each layer's precedence
and each default), and every refusal's whole message with its file, line and field path.

test_fleet_inventory.py checks the fleet files users write; this file pins what a playbook and a user read
back, so that a change to a default, a precedence or the place an error points at is a failing test (the
mutation run of scripts/mutation.sh found those unchecked)."""

from __future__ import annotations

import textwrap

import pytest
from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet
from ansible_collections.modelfleet.fleet.plugins.plugin_utils.fleet import FleetError

PROFILES = {"tiny-llama", "tiny-llama-b", "kimi-k2.5-int4"}

LAYERED = """\
plugin: modelfleet.fleet.fleet
models_root: /srv/models
profile: tiny-llama
gpu: {kind: h200, count: 8, memory_gib: 141}
connection: {ansible_user: fleet, ansible_connection: ssh}
vars: {note: fleet, only_fleet: 1}
compose: {x: 1}
strict: true
groups:
  big:
    gpu: {count: 4}
    connection: {ansible_user: group}
    vars: {note: group}
    hosts:
      b1: {}
      b2: {address: 10.1.0.2, port: 2022, user: ops, profile: tiny-llama-b, models_root: /data/m,
           gpu: {count: 1, kind: rtx-6000}, connection: {ansible_user: hostconn}, vars: {note: host}}
  small:
    profile: kimi-k2.5-int4
    models_root: /g/models
    gpu: {count: 2, interconnect: nvlink}
    hosts:
      s1:
"""


def _host(**over):
    base = {"ansible_user": "fleet", "ansible_connection": "ssh", "note": "fleet", "only_fleet": 1,
            "modelfleet_group": "big", "modelfleet_gpu_kind": "h200", "modelfleet_gpu_count": 4,
            "modelfleet_gpu_memory_gib": 141, "modelfleet_interconnect": "unknown",
            "modelfleet_models_root": "/srv/models", "modelfleet_profile": "tiny-llama", "modelfleet_wave": None,
            "modelfleet_wave_index": None, "modelfleet_canary": False}
    base.update(over)
    return base


def test_every_published_variable_with_its_precedence_and_defaults():
    r = fleet.parse(LAYERED, "l.fleet.yml", PROFILES)
    assert r["hosts"] == {
        # group over fleet: count, connection user, note
        "b1": _host(ansible_user="group", note="group"),
        # host over group over fleet for every layered key; count 1 means a single GPU
        "b2": _host(ansible_user="ops", note="host", ansible_host="10.1.0.2", ansible_port=2022,
                    modelfleet_gpu_kind="rtx-6000", modelfleet_gpu_count=1, modelfleet_interconnect="single",
                    modelfleet_models_root="/data/m", modelfleet_profile="tiny-llama-b"),
        # a host given as an empty value; the group's own root, profile and interconnect
        "s1": _host(modelfleet_group="small", modelfleet_gpu_count=2, modelfleet_interconnect="nvlink",
                    modelfleet_models_root="/g/models", modelfleet_profile="kimi-k2.5-int4"),
    }
    # the host's `user:` wins over its own connection variable; without it, the host's connection variable
    assert fleet.parse(LAYERED.replace("user: ops, ", ""), "l", PROFILES)["hosts"]["b2"]["ansible_user"] == "hostconn"
    assert r["groups"] == {
        "big": {"hosts": ["b1", "b2"], "vars": {}}, "small": {"hosts": ["s1"], "vars": {}},
        "gpu_h200": {"hosts": ["b1", "s1"], "vars": {}}, "gpu_rtx_6000": {"hosts": ["b2"], "vars": {}},
        "interconnect_unknown": {"hosts": ["b1"], "vars": {}}, "interconnect_single": {"hosts": ["b2"], "vars": {}},
        "interconnect_nvlink": {"hosts": ["s1"], "vars": {}},
        "profile_tiny_llama": {"hosts": ["b1"], "vars": {}}, "profile_tiny_llama_b": {"hosts": ["b2"], "vars": {}},
        "profile_kimi_k2_5_int4": {"hosts": ["s1"], "vars": {}},
    }
    assert r["rollout"] == {"waves": [], "max_fail_percentage": 0}
    assert r["options"] == {"compose": {"x": 1}, "strict": True}


def test_defaults_when_the_file_says_least():
    r = fleet.parse("plugin: fleet\ngroups:\n  g:\n    gpu: {count: 2}\n    hosts:\n      a: {}\n", "m", None)
    assert r["hosts"] == {"a": {"modelfleet_group": "g", "modelfleet_gpu_kind": "unknown", "modelfleet_gpu_count": 2,
                                "modelfleet_gpu_memory_gib": None, "modelfleet_interconnect": "unknown",
                                "modelfleet_models_root": "/models", "modelfleet_profile": None,
                                "modelfleet_wave": None, "modelfleet_wave_index": None, "modelfleet_canary": False}}
    assert r["groups"] == {"g": {"hosts": ["a"], "vars": {}}, "gpu_unknown": {"hosts": ["a"], "vars": {}},
                           "interconnect_unknown": {"hosts": ["a"], "vars": {}}}
    assert r["options"] == {} and r["rollout"] == {"waves": [], "max_fail_percentage": 0}


def test_waves_publish_name_index_canary_and_serial():
    text = ("plugin: fleet\ngroups:\n  g:\n    gpu: {count: 1}\n    hosts: {a: {}, b: {}, c: {}}\n"
            "rollout:\n  max_fail_percentage: 50\n  waves:\n    - {name: first, canary: true, hosts: [b]}\n"
            "    - {name: rest, hosts: [c, a], serial: '50%'}\n")
    r = fleet.parse(text, "w", None)
    waves = [(h, v["modelfleet_wave"], v["modelfleet_wave_index"], v["modelfleet_canary"])
             for h, v in r["hosts"].items()]
    assert waves == [("a", "rest", 1, False), ("b", "first", 0, True), ("c", "rest", 1, False)]
    assert r["rollout"] == {"max_fail_percentage": 50, "waves": [
        {"name": "first", "hosts": ["b"], "canary": True, "serial": None},
        {"name": "rest", "hosts": ["c", "a"], "canary": False, "serial": "50%"}]}
    assert r["groups"]["canary"] == {"hosts": ["b"], "vars": {}}
    assert r["groups"]["wave_first"]["hosts"] == ["b"] and r["groups"]["wave_rest"]["hosts"] == ["a", "c"]
    # a canary-less rollout: no canary group, no host marked
    r2 = fleet.parse(text.replace("canary: true, ", ""), "w", None)
    assert "canary" not in r2["groups"] and not any(v["modelfleet_canary"] for v in r2["hosts"].values())


ONE = "groups:\n  g:\n    gpu: {count: 1}\n    hosts:\n      a: {}\n"
TWO = ONE.replace("a: {}", "a: {}\n      b: {}")

EXACT = [
    ("rollout not a mapping", ONE + "rollout: [a]\n",
     "e.yml:7: rollout: rollout must be a mapping, got list"),
    ("group not a mapping", "groups:\n  g: [a]\n",
     "e.yml:3: groups.g: group g must be a mapping, got list"),
    ("host not a mapping", ONE.replace("a: {}", "a: [x]"),
     "e.yml:6: groups.g.hosts.a: host a must be a mapping, got list"),
    ("fleet not a mapping", None,
     "e.yml:1: (top): the fleet file must be a mapping, got list"),
    ("gpu not a mapping", ONE.replace("{count: 1}", "8"),
     "e.yml:4: groups.g.gpu: gpu must be a mapping, got int"),
    ("groups empty", "groups: {}\n",
     "e.yml:2: groups: a fleet needs at least one group with hosts"),
    ("groups a list", "groups: [a]\n",
     "e.yml:2: groups: a fleet needs at least one group with hosts"),
    ("group without hosts", "groups:\n  g:\n    gpu: {count: 1}\n",
     "e.yml:3: groups.g.hosts: group g needs a mapping of hosts"),
    ("group hosts a list", "groups:\n  g:\n    hosts: [a]\n",
     "e.yml:4: groups.g.hosts: group g needs a mapping of hosts"),
    ("group name", ONE.replace("  g:", "  'g h':"),
     "e.yml:3: groups.g h: group name 'g h' must be letters, digits, '_', '.', '-'"),
    ("host name", ONE.replace("a: {}", "'-a': {}"),
     "e.yml:6: groups.g.hosts.-a: host name '-a' must be letters, digits, '_', '.', '-'"),
    ("vars not a mapping", ONE.replace("    gpu:", "    vars: [1]\n    gpu:"),
     "e.yml:4: groups.g.vars: vars must be a mapping of variables"),
    ("connection not a mapping", ONE.replace("    gpu:", "    connection: ssh\n    gpu:"),
     "e.yml:4: groups.g.connection: connection must be a mapping of variables"),
    ("fleet connection key", "connection: {user: x}\n" + ONE,
     "e.yml:2: connection.user: connection keys are Ansible connection variables (ansible_connection, ansible_user, "
     "...)"),
    ("host connection key", ONE.replace("a: {}", "a: {connection: {port: 1}}"),
     "e.yml:6: groups.g.hosts.a.connection.port: connection keys are Ansible connection variables "
     "(ansible_connection, ansible_user, ...)"),
    ("memory zero", ONE.replace("{count: 1}", "{count: 1, memory_gib: 0}"),
     "e.yml:4: groups.g.gpu.memory_gib: memory_gib must be a positive number, got 0"),
    ("memory bool", ONE.replace("{count: 1}", "{count: 1, memory_gib: true}"),
     "e.yml:4: groups.g.gpu.memory_gib: memory_gib must be a positive number, got True"),
    ("memory text", ONE.replace("{count: 1}", "{count: 1, memory_gib: lots}"),
     "e.yml:4: groups.g.gpu.memory_gib: memory_gib must be a positive number, got 'lots'"),
    ("count bool", ONE.replace("{count: 1}", "{count: true}"),
     "e.yml:4: groups.g.gpu.count: GPU count must be a positive integer, got True"),
    ("gpu kind", ONE.replace("{count: 1}", "{count: 1, kind: 'rtx pro'}"),
     "e.yml:4: groups.g.gpu.kind: GPU kind must be a name like rtx-pro-6000 or h200, got 'rtx pro'"),
    ("gpu kind number", ONE.replace("{count: 1}", "{count: 1, kind: 6000}"),
     "e.yml:4: groups.g.gpu.kind: GPU kind must be a name like rtx-pro-6000 or h200, got 6000"),
    ("fleet gpu", "gpu: {count: -1}\n" + ONE,
     "e.yml:2: gpu.count: GPU count must be a positive integer, got -1"),
    ("host gpu", ONE.replace("a: {}", "a: {gpu: {count: 0}}"),
     "e.yml:6: groups.g.hosts.a.gpu.count: GPU count must be a positive integer, got 0"),
    ("host profile", ONE.replace("a: {}", "a: {profile: nope}"),
     "e.yml:6: groups.g.hosts.a.profile: profile 'nope' does not exist; known: kimi-k2.5-int4, tiny-llama, "
     "tiny-llama-b (profiles/<name>.yml)"),
    ("fleet models root", "models_root: /models/x/..\n" + ONE,
     "e.yml:2: models_root: '/models/x/..' contains '..'; give the folder's own absolute path"),
    ("host models root", ONE.replace("a: {}", "a: {models_root: /}"),
     "e.yml:6: groups.g.hosts.a.models_root: '/' is /; models are never planned or deleted there - use a folder of "
     "their own such as /models"),
    ("address not text", ONE.replace("a: {}", "a: {address: 10}"),
     "e.yml:6: groups.g.hosts.a.address: address 10 is not a host name or an IP address (letters, digits, '.', '-', "
     "':'; not starting with '-')"),
    ("port bool", ONE.replace("a: {}", "a: {port: true}"),
     "e.yml:6: groups.g.hosts.a.port: port must be 1-65535, got True"),
    ("port text", ONE.replace("a: {}", "a: {port: '22'}"),
     "e.yml:6: groups.g.hosts.a.port: port must be 1-65535, got '22'"),
    ("port zero", ONE.replace("a: {}", "a: {port: 0}"),
     "e.yml:6: groups.g.hosts.a.port: port must be 1-65535, got 0"),
    ("plugin missing", None,
     "e.yml:1: plugin: must be 'modelfleet.fleet.fleet' (or its short name 'fleet')"),
    ("mfp negative", ONE + "rollout: {max_fail_percentage: -1}\n",
     "e.yml:7: rollout.max_fail_percentage: must be 0-100, got -1"),
    ("mfp bool", ONE + "rollout: {max_fail_percentage: true}\n",
     "e.yml:7: rollout.max_fail_percentage: must be 0-100, got True"),
    ("mfp text", ONE + "rollout: {max_fail_percentage: '10%'}\n",
     "e.yml:7: rollout.max_fail_percentage: must be 0-100, got '10%'"),
    ("waves a mapping", ONE + "rollout:\n  waves: {a: 1}\n",
     "e.yml:8: rollout.waves: waves must be a list of {name, hosts, canary}"),
    ("wave not a mapping", ONE + "rollout:\n  waves: [a]\n",
     "e.yml:8: rollout.waves.0: wave 1 must be a mapping, got str"),
    ("wave unknown key", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], pace: 1}\n",
     "e.yml:9: rollout.waves.0.pace: unknown key 'pace' in wave 1; allowed: canary, hosts, max_fail_percentage, name, "
     "serial"),
    ("wave mfp over 100", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], max_fail_percentage: 101}\n",
     "e.yml:9: rollout.waves.0.max_fail_percentage: wave w: max_fail_percentage must be 0-100, got 101"),
    ("wave mfp text", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], max_fail_percentage: '5%'}\n",
     "e.yml:9: rollout.waves.0.max_fail_percentage: wave w: max_fail_percentage must be 0-100, got '5%'"),
    ("canary wave tolerating failures",
     ONE + "rollout:\n  waves:\n    - {name: w, canary: true, hosts: [a], max_fail_percentage: 50}\n",
     "e.yml:9: rollout.waves.0.max_fail_percentage: wave w: a canary wave tolerates no failure (any failed canary "
     "stops the rollout); remove its max_fail_percentage, or make it an ordinary first wave"),
    ("wave without name", ONE + "rollout:\n  waves:\n    - {hosts: [a]}\n",
     "e.yml:9: rollout.waves.0.name: wave 1 needs a name (letters, digits, '_', '.', '-')"),
    ("wave name number", ONE + "rollout:\n  waves:\n    - {name: 1, hosts: [a]}\n",
     "e.yml:9: rollout.waves.0.name: wave 1 needs a name (letters, digits, '_', '.', '-')"),
    ("wave name spaces", ONE + "rollout:\n  waves:\n    - {name: 'a b', hosts: [a]}\n",
     "e.yml:9: rollout.waves.0.name: wave 1 needs a name (letters, digits, '_', '.', '-')"),
    ("duplicate wave name", TWO + "rollout:\n  waves:\n    - {name: w, hosts: [a]}\n    - {name: w, hosts: [b]}\n",
     "e.yml:11: rollout.waves.1.name: duplicate wave name w"),
    ("serial zero", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: 0}\n",
     "e.yml:9: rollout.waves.0.serial: wave w: serial must be a number of hosts >= 1 or a percentage such as '25%', "
     "got 0"),
    ("serial bool", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: true}\n",
     "e.yml:9: rollout.waves.0.serial: wave w: serial must be a number of hosts >= 1 or a percentage such as '25%', "
     "got True"),
    ("serial 0%", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: '0%'}\n",
     "e.yml:9: rollout.waves.0.serial: wave w: serial must be a number of hosts >= 1 or a percentage such as '25%', "
     "got '0%'"),
    ("serial 101%", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: '101%'}\n",
     "e.yml:9: rollout.waves.0.serial: wave w: serial must be a number of hosts >= 1 or a percentage such as '25%', "
     "got '101%'"),
    ("serial float", ONE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: 1.5}\n",
     "e.yml:9: rollout.waves.0.serial: wave w: serial must be a number of hosts >= 1 or a percentage such as '25%', "
     "got 1.5"),
    ("wave without hosts", ONE + "rollout:\n  waves:\n    - {name: w}\n",
     "e.yml:9: rollout.waves.0.hosts: wave w needs a list of hosts"),
    ("wave hosts empty", ONE + "rollout:\n  waves:\n    - {name: w, hosts: []}\n",
     "e.yml:9: rollout.waves.0.hosts: wave w needs a list of hosts"),
    ("wave hosts text", ONE + "rollout:\n  waves:\n    - {name: w, hosts: a}\n",
     "e.yml:9: rollout.waves.0.hosts: wave w needs a list of hosts"),
    ("derived group clash by profile",
     "profile: tiny-llama\n" + ONE + "  profile_tiny_llama:\n    gpu: {count: 1}\n    hosts:\n      b: {}\n",
     "e.yml:8: groups.profile_tiny_llama: group name profile_tiny_llama clashes with a derived group (gpu_*, "
     "interconnect_*, profile_*, wave_*, canary); rename it"),
]


@pytest.mark.parametrize("body,message", [(b, m) for _, b, m in EXACT], ids=[i for i, _, _ in EXACT])
def test_refusals_whole_message(body, message):
    if body is None:
        text = "- a\n" if "(top)" in message else ONE
    else:
        text = "plugin: fleet\n" + body
    with pytest.raises(FleetError) as e:
        fleet.parse(textwrap.dedent(text), "e.yml", PROFILES)
    assert str(e.value) == message


@pytest.mark.parametrize("serial", [1, 7, "1%", "9%", "10%", "99%", "100%"])
def test_serial_edges_accepted(serial):
    text = "plugin: fleet\n" + ONE + f"rollout:\n  waves:\n    - {{name: w, hosts: [a], serial: '{serial}'}}\n"
    if isinstance(serial, int):
        text = text.replace(f"'{serial}'", str(serial))
    assert fleet.parse(text, "s", None)["rollout"]["waves"][0]["serial"] == serial


@pytest.mark.parametrize("mfp", [0, 100, 0.5, 99.9])
def test_max_fail_percentage_edges_accepted(mfp):
    text = "plugin: fleet\n" + ONE + f"rollout: {{max_fail_percentage: {mfp}}}\n"
    assert fleet.parse(text, "m", None)["rollout"]["max_fail_percentage"] == mfp


def test_duplicate_keys_name_both_lines_and_the_source():
    with pytest.raises(FleetError) as e:
        fleet.parse("plugin: fleet\n" + ONE + "groups: {}\n", "d.yml", None)
    assert str(e.value) == ("d.yml: line 7: duplicate key 'groups' (first at line 2); each host and group may "
                            "appear once")
    # the same key in different mappings is not a duplicate
    two = TWO.replace("a: {}", "a: {vars: {x: 1}}").replace("b: {}", "b: {vars: {x: 2}}")
    assert fleet.parse("plugin: fleet\n" + two, "d", None)["hosts"]["b"]["x"] == 2


def test_line_numbers_of_nested_fields():
    text = "plugin: fleet\n" + ONE + "rollout:\n  waves:\n    - name: w\n      hosts:\n        - a\n        - zz\n"
    with pytest.raises(FleetError) as e:
        fleet.parse(text, "n.yml", None)
    assert str(e.value) == "n.yml:10: rollout.waves.0.hosts: wave w names host 'zz', which no group defines"
    lines = fleet.load_text(text, "n.yml")[1]
    assert lines[("rollout", "waves", 0, "hosts", 1)] == 12 and lines[("groups", "g", "hosts", "a")] == 6
    assert lines[()] == 1 and lines[("rollout",)] == 7
    assert fleet.load_text("", "empty")[0] == {} and fleet.load_text("", "empty")[1] == {}


MORE = [
    ("fleet profile", "profile: nope\n" + ONE,
     "e.yml:2: profile: profile 'nope' does not exist; known: kimi-k2.5-int4, tiny-llama, tiny-llama-b "
     "(profiles/<name>.yml)"),
    ("interconnect", ONE.replace("{count: 1}", "{count: 1, interconnect: ib}"),
     "e.yml:4: groups.g.gpu.interconnect: interconnect 'ib' is not one of mixed, none, nvlink, pcie, single"),
    ("canary later",
     TWO + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n    - {name: w2, canary: true, hosts: [b]}\n",
     "e.yml:11: rollout.waves.1.canary: only the first wave can be the canary (w2 is wave 2)"),
    ("host in no wave", TWO + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n",
     "e.yml:9: rollout.waves: hosts in no wave: b (every host needs a wave, or leave rollout.waves out)"),
    ("mfp just over", ONE + "rollout: {max_fail_percentage: 100.5}\n",
     "e.yml:7: rollout.max_fail_percentage: must be 0-100, got 100.5"),
]


@pytest.mark.parametrize("body,message", [(b, m) for _, b, m in MORE], ids=[i for i, _, _ in MORE])
def test_more_refusals_whole_message(body, message):
    with pytest.raises(FleetError) as e:
        fleet.parse("plugin: fleet\n" + body, "e.yml", PROFILES)
    assert str(e.value) == message


def test_small_values_accepted_and_group_names_keep_case():
    r = fleet.parse("plugin: fleet\n" + ONE.replace("{count: 1}", "{count: 1, memory_gib: 0.5, kind: H200}"), "s", None)
    assert r["hosts"]["a"]["modelfleet_gpu_memory_gib"] == 0.5 and r["groups"]["gpu_H200"]["hosts"] == ["a"]


def test_inventory_options_pass_through():
    opts = ("compose: {a: b}\nkeyed_groups: [{key: x}]\nconditional_groups: {big: 'true'}\nstrict: false\n"
            "cache: true\n")
    r = fleet.parse("plugin: fleet\n" + opts + ONE, "o", None)
    assert r["options"] == {"compose": {"a": "b"}, "keyed_groups": [{"key": "x"}],
                            "conditional_groups": {"big": "true"}, "strict": False}


def test_models_root_is_checked_as_spelled_not_resolved_on_the_controller(tmp_path):
    """The fleet file names folders on the hosts: a controller symlink of the same name says nothing about
    them (the hosts resolve their own root when they plan)."""
    link = tmp_path / "models"
    link.symlink_to("/etc")
    r = fleet.parse("plugin: fleet\n" + ONE.replace("    gpu:", f"    models_root: {link}\n    gpu:"), "r", None)
    assert r["hosts"]["a"]["modelfleet_models_root"] == str(link)


def test_an_empty_file_points_at_the_file():
    with pytest.raises(FleetError) as e:
        fleet.parse("", "empty.yml", None)
    assert str(e.value) == "empty.yml: plugin: must be 'modelfleet.fleet.fleet' (or its short name 'fleet')"


def test_a_text_without_a_source_is_called_fleet():
    with pytest.raises(FleetError) as e:
        fleet.parse("plugin: x\n")
    assert str(e.value) == "<fleet>:1: plugin: must be 'modelfleet.fleet.fleet' (or its short name 'fleet')"


def test_messages_that_list_several_names():
    with pytest.raises(FleetError) as e:
        fleet.parse("plugin: fleet\n" + ONE.replace("    gpu:", "    profile: p\n    gpu:"), "l.yml", set())
    assert str(e.value) == "l.yml:4: groups.g.profile: profile 'p' does not exist; known: (none) (profiles/<name>.yml)"
    three = TWO.replace("b: {}", "b: {}\n      c: {}")
    with pytest.raises(FleetError) as e:
        fleet.parse("plugin: fleet\n" + three + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n", "l.yml", None)
    assert str(e.value) == ("l.yml:10: rollout.waves: hosts in no wave: b, c (every host needs a wave, or leave "
                            "rollout.waves out)")

"""The fleet inventory plugin: good fleet files, bad ones (each error message asserted), and
`ansible-inventory --list/--graph` on the shipped fleets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet
from ansible_collections.modelfleet.fleet.plugins.plugin_utils.fleet import FleetError

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {p.stem for p in (ROOT / "profiles").glob("*.yml")}
ANSIBLE_INVENTORY = str(Path(sys.executable).with_name("ansible-inventory"))

GOOD = """\
plugin: modelfleet.fleet.fleet
models_root: /models
connection: {ansible_connection: ssh, ansible_user: root}
vars: {modelfleet_note: fleet}
groups:
  rtx:
    profile: kimi-k2.5-int4
    gpu: {kind: rtx-pro-6000-blackwell, count: 8, memory_gib: 96, interconnect: pcie}
    vars: {modelfleet_note: group}
    hosts:
      gpu-01: {address: 10.0.0.11}
      gpu-02: {address: 10.0.0.12, port: 2222, user: ops, vars: {modelfleet_note: host}}
  h200:
    profile: minimax-m2.5-fp8
    models_root: /data/models
    gpu: {kind: h200, count: 8, memory_gib: 141, interconnect: nvlink}
    hosts:
      h200-01: {}
rollout:
  waves:
    - {name: canary, canary: true, hosts: [gpu-01]}
    - {name: rest, hosts: [gpu-02, h200-01], serial: 1}
  max_fail_percentage: 25
"""


def test_good_fleet_hosts_groups_and_vars():
    r = fleet.parse(GOOD, "good.fleet.yml", PROFILES)
    h1, h2, h3 = r["hosts"]["gpu-01"], r["hosts"]["gpu-02"], r["hosts"]["h200-01"]
    assert h1["ansible_host"] == "10.0.0.11" and h1["ansible_user"] == "root" and h1["ansible_connection"] == "ssh"
    assert h2["ansible_port"] == 2222 and h2["ansible_user"] == "ops" and h2["modelfleet_note"] == "host"
    assert h1["modelfleet_note"] == "group" and h3["modelfleet_note"] == "fleet"
    assert h1["modelfleet_gpu_count"] == 8 and h1["modelfleet_interconnect"] == "pcie"
    assert h3["modelfleet_models_root"] == "/data/models" and h1["modelfleet_models_root"] == "/models"
    assert h1["modelfleet_canary"] is True and h1["modelfleet_wave_index"] == 0
    assert h3["modelfleet_wave"] == "rest" and h3["modelfleet_canary"] is False
    g = {k: v["hosts"] for k, v in r["groups"].items()}
    assert g["rtx"] == ["gpu-01", "gpu-02"] and g["h200"] == ["h200-01"]
    assert g["gpu_rtx_pro_6000_blackwell"] == ["gpu-01", "gpu-02"] and g["gpu_h200"] == ["h200-01"]
    assert g["interconnect_nvlink"] == ["h200-01"] and g["interconnect_pcie"] == ["gpu-01", "gpu-02"]
    assert g["profile_kimi_k2_5_int4"] == ["gpu-01", "gpu-02"]
    assert g["wave_canary"] == ["gpu-01"] and g["canary"] == ["gpu-01"] and g["wave_rest"] == ["gpu-02", "h200-01"]
    assert r["rollout"]["max_fail_percentage"] == 25 and r["rollout"]["waves"][1]["serial"] == 1


def _bad(body: str) -> str:
    text = "plugin: fleet\n" + textwrap.dedent(body)
    with pytest.raises(FleetError) as e:
        fleet.parse(text, "bad.fleet.yml", PROFILES)
    return str(e.value)


ONE = """\
groups:
  g:
    gpu: {count: 1}
    hosts:
      a: {}
"""

MULTI = """\
groups:
  g:
    gpu: {count: 1}
    multi_host: {layout: pp, nodes: 2}
    hosts:
      a: {vars: {vllm_service_group_address: 10.9.0.1}}
      b: {vars: {vllm_service_group_address: 10.9.0.2}}
"""

BAD = [
    ("unknown top key", "groupz: {}\n" + ONE, r"bad.fleet.yml:2: groupz: unknown key 'groupz' in the fleet file"),
    ("unknown host key", ONE.replace("a: {}", "a: {adress: 1.2.3.4}"),
     r"bad.fleet.yml:6: groups.g.hosts.a.adress: unknown key 'adress' in host a; allowed: address"),
    ("unknown gpu key", ONE.replace("{count: 1}", "{count: 1, vram: 96}"),
     r"bad.fleet.yml:4: groups.g.gpu.vram: unknown key 'vram' in gpu"),
    ("profile missing", ONE.replace("    gpu:", "    profile: kimi-k3\n    gpu:"),
     r"bad.fleet.yml:4: groups.g.profile: profile 'kimi-k3' does not exist; known: .*kimi-k2.5-int4"),
    ("gpu count zero", ONE.replace("{count: 1}", "{count: 0}"),
     r"bad.fleet.yml:4: groups.g.gpu.count: GPU count must be a positive integer, got 0"),
    ("gpu count string", ONE.replace("{count: 1}", "{count: eight}"),
     r"groups.g.gpu.count: GPU count must be a positive integer, got 'eight'"),
    ("gpu count float", ONE.replace("{count: 1}", "{count: 1.5}"), r"got 1.5"),
    ("no gpu count", ONE.replace("    gpu: {count: 1}\n", ""),
     r"bad.fleet.yml:5: groups.g.hosts.a.gpu: no GPU count for this host"),
    ("duplicate host across groups", ONE + "  h:\n    gpu: {count: 1}\n    hosts:\n      a: {}\n",
     r"bad.fleet.yml:10: groups.h.hosts.a: duplicate host a: already in group g"),
    ("duplicate host key in a group", ONE + "      a: {}\n",
     r"line 7: duplicate key 'a' \(first at line 6\)"),
    ("two waves", ONE.replace("a: {}", "a: {}\n      b: {}")
     + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n    - {name: w2, hosts: [a, b]}\n",
     r"rollout.waves.1.hosts: host a is in two exclusive waves: w1 and w2"),
    ("wave names unknown host", ONE + "rollout:\n  waves:\n    - {name: w1, hosts: [a, zz]}\n",
     r"wave w1 names host 'zz', which no group defines"),
    ("host in no wave",
     ONE.replace("a: {}", "a: {}\n      b: {}") + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n",
     r"hosts in no wave: b"),
    ("canary not first", ONE.replace("a: {}", "a: {}\n      b: {}")
     + "rollout:\n  waves:\n    - {name: w1, hosts: [a]}\n    - {name: c, canary: true, hosts: [b]}\n",
     r"only the first wave can be the canary \(c is wave 2\)"),
    ("bad interconnect", ONE.replace("{count: 1}", "{count: 1, interconnect: infiniband}"),
     r"interconnect 'infiniband' is not one of mixed, none, nvlink, pcie, single"),
    ("relative models root", ONE.replace("    gpu:", "    models_root: models\n    gpu:"),
     r"groups.g.models_root: 'models' is relative; give an absolute path"),
    ("root models root", ONE.replace("    gpu:", "    models_root: /\n    gpu:"),
     r"groups.g.models_root: '/' is /; models are never planned or deleted there"),
    ("dotdot models root", ONE.replace("    gpu:", "    models_root: /models/../etc\n    gpu:"),
     r"groups.g.models_root: '/models/../etc' contains '..'"),
    ("system models root", ONE.replace("    gpu:", "    models_root: /boot\n    gpu:"),
     r"groups.g.models_root: '/boot' is the system folder /boot"),
    ("address like an option", ONE.replace("a: {}", "a: {address: '-oProxyCommand=sh'}"),
     r"groups.g.hosts.a.address: address '-oProxyCommand=sh' is not a host name or an IP address"),
    ("bad port", ONE.replace("a: {}", "a: {port: 70000}"), r"groups.g.hosts.a.port: port must be 1-65535"),
    ("connection key", ONE.replace("    gpu:", "    connection: {user: root}\n    gpu:"),
     r"groups.g.connection.user: connection keys are Ansible connection variables"),
    ("no groups", "models_root: /m\n", r"groups: a fleet needs at least one group with hosts"),
    ("group clashes with derived", ONE.replace("  g:\n", "  canary:\n") + "rollout:\n  waves:\n"
     "    - {name: w, canary: true, hosts: [a]}\n", r"groups.canary: group name canary clashes with a derived group"),
    ("max fail percentage", ONE + "rollout: {max_fail_percentage: 150}\n", r"must be 0-100, got 150"),
    ("not yaml", "groups: [\n", r"bad.fleet.yml: not valid YAML"),
    ("multi-host unknown key", MULTI.replace("nodes: 2", "nodes: 2, tp: 8"),
     r"bad.fleet.yml:5: groups.g.multi_host.tp: unknown key 'tp' in group g's multi_host; allowed: layout, nodes, "
     r"port"),
    ("multi-host layout", MULTI.replace("layout: pp", "layout: tp"),
     r"groups.g.multi_host.layout: layout must be pp .* or dp .*, got 'tp'"),
    ("multi-host one node", MULTI.replace("nodes: 2", "nodes: 1"),
     r"groups.g.multi_host.nodes: nodes .* must be a whole number >= 2, got 1; a replica on one host needs no"),
    ("multi-host nodes a string", MULTI.replace("nodes: 2", "nodes: two"), r"got 'two'"),
    ("multi-host port", MULTI.replace("nodes: 2", "nodes: 2, port: 80"),
     r"groups.g.multi_host.port: the group port must be 1024-65535, got 80"),
    ("multi-host hosts not a multiple", MULTI.replace("nodes: 2", "nodes: 3"),
     r"groups.g.multi_host.nodes: group g has 2 host\(s\), not a multiple of nodes 3: each replica takes 3 hosts; "
     r"add 1 host\(s\), or change nodes"),
    ("multi-host odd host out", MULTI + "      c: {vars: {vllm_service_group_address: 10.9.0.3}}\n",
     r"group g has 3 host\(s\), not a multiple of nodes 2: each replica takes 2 hosts; add 1 host\(s\) or remove 1"),
    ("multi-host member without an address", MULTI.replace("b: {vars: {vllm_service_group_address: 10.9.0.2}}",
                                                           "b: {}"),
     r"bad.fleet.yml:8: groups.g.hosts.b: host b is a member of multi-host replica g and has no group address: set "
     r"vars.vllm_service_group_address"),
    ("multi-host members on two ports",
     MULTI.replace("b: {vars: {vllm_service_group_address: 10.9.0.2}}",
                   "b: {vars: {vllm_service_group_address: 10.9.0.2, vllm_service_port: 8001}}"),
     r"groups.g.hosts.b: the members of replica g set different vllm_service_port values \(a: None, b: 8001\)"
     r"|the members of replica g set different"),
    ("multi-host members with one address",
     MULTI.replace("multi_host: {layout: pp, nodes: 2}", "multi_host: {layout: pp, nodes: 2}\n    vars: "
                   "{vllm_service_group_address: 10.9.0.9}").replace(
                       "{vars: {vllm_service_group_address: 10.9.0.1}}", "{}").replace(
                       "{vars: {vllm_service_group_address: 10.9.0.2}}", "{}"),
     r"groups.g.hosts.b: hosts a and b of replica g have one group address \(10.9.0.9\): each member needs its own"),
    ("multi-host members with two profiles",
     MULTI.replace("b: {vars: {vllm_service_group_address: 10.9.0.2}}",
                   "b: {profile: tiny-llama, vars: {vllm_service_group_address: 10.9.0.2}}"),
     r"groups.g.hosts.b: the members of replica g declare different profiles \(a: None, b: tiny-llama\): its hosts "
     r"serve one model"),
    ("multi-host members in two waves",
     MULTI + "rollout:\n  waves:\n    - {name: c, canary: true, hosts: [a]}\n    - {name: r, hosts: [b]}\n",
     r"rollout.waves: the members of multi-host replica g are in different waves \(a: c, b: r\); a replica is "
     r"deployed as one"),
]


@pytest.mark.parametrize("body,pattern", [(b, p) for _, b, p in BAD], ids=[i for i, _, _ in BAD])
def test_bad_fleet_files(body, pattern):
    import re

    msg = _bad(body)
    assert re.search(pattern, msg), msg


def test_wrong_plugin_name():
    with pytest.raises(FleetError, match=r"plugin: must be 'modelfleet.fleet.fleet'"):
        fleet.parse("plugin: yaml\n" + ONE, "x.fleet.yml", PROFILES)


def _inventory(*args, inventory: Path):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return subprocess.run([ANSIBLE_INVENTORY, "-i", str(inventory), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_ansible_inventory_list_local_fleet():
    r = _inventory("--list", inventory=ROOT / "inventory" / "local" / "local.fleet.yml")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    hv = data["_meta"]["hostvars"]
    assert sorted(hv) == ["mf-node-1", "mf-node-2", "mf-node-3"]
    assert hv["mf-node-1"]["modelfleet_canary"] is True and hv["mf-node-2"]["modelfleet_wave"] == "rest"
    # reached over SSH on loopback, each host at its own port (scripts/fleet.sh reads them from the same file)
    assert hv["mf-node-3"]["ansible_connection"] == "ssh"
    assert [(hv[h]["ansible_host"], hv[h]["ansible_port"]) for h in sorted(hv)] == [
        ("127.0.0.1", 22201), ("127.0.0.1", 22202), ("127.0.0.1", 22203)]
    assert data["canary"]["hosts"] == ["mf-node-1"]
    assert sorted(data["wave_rest"]["hosts"]) == ["mf-node-2", "mf-node-3"]


def test_ansible_inventory_seed_fleet_and_graph():
    inv = ROOT / "inventory" / "seed" / "rtx-pro-6000.fleet.yml"
    r = _inventory("--list", inventory=inv)
    assert r.returncode == 0, r.stderr
    hv = json.loads(r.stdout)["_meta"]["hostvars"]["gpu-01"]
    assert hv["modelfleet_gpu_count"] == 8 and hv["modelfleet_gpu_memory_gib"] == 96
    assert hv["modelfleet_interconnect"] == "pcie" and hv["modelfleet_profile"] == "kimi-k2.5-int4"
    g = _inventory("--graph", inventory=inv)
    assert "@interconnect_pcie:" in g.stdout and "@profile_kimi_k2_5_int4:" in g.stdout


def test_ansible_inventory_compose_keyed_groups_and_errors(tmp_path):
    f = tmp_path / "c.fleet.yml"
    f.write_text(GOOD + textwrap.dedent("""\
        compose:
          modelfleet_total_gpu_gib: modelfleet_gpu_count * modelfleet_gpu_memory_gib
        keyed_groups:
          - key: modelfleet_gpu_count | string
            prefix: gpus
        conditional_groups:
          big_memory: modelfleet_gpu_memory_gib > 100
        """))
    r = _inventory("--list", inventory=f)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["_meta"]["hostvars"]["gpu-01"]["modelfleet_total_gpu_gib"] == 768
    assert sorted(data["gpus_8"]["hosts"]) == ["gpu-01", "gpu-02", "h200-01"]
    assert data["big_memory"]["hosts"] == ["h200-01"]
    bad = tmp_path / "b.fleet.yml"
    bad.write_text("plugin: fleet\n" + ONE.replace("{count: 1}", "{count: -2}"))
    r = _inventory("--list", inventory=bad)
    assert "groups.g.gpu.count: GPU count must be a positive integer, got -2" in r.stderr


@pytest.mark.parametrize(("port", "ok"), [(0, False), (1, True), (65535, True), (65536, False), ("true", False),
                                          ("'22'", False)])
def test_host_port_edges(port, ok):
    text = GOOD.replace("port: 2222", f"port: {port}")
    if ok:
        assert fleet.parse(text, "p.fleet.yml", PROFILES)["hosts"]["gpu-02"]["ansible_port"] == port
    else:
        with pytest.raises(FleetError, match=r"p\.fleet\.yml:\d+: groups\.rtx\.hosts\.gpu-02\.port"):
            fleet.parse(text, "p.fleet.yml", PROFILES)


def test_multi_host_replicas_heads_and_the_endpoint():
    """A group with multi_host makes replicas of `nodes` hosts in file order, the first of each the head; the endpoint
    balances over the heads only (a headless member serves no HTTP) and only heads are drained from it."""
    text = ("plugin: fleet\n"
            + MULTI.replace("nodes: 2}", "nodes: 2, port: 29600}\n    endpoint: {host: e, port: 8080}")
            + "      c: {vars: {vllm_service_group_address: 10.9.0.3}}\n"
              "      d: {vars: {vllm_service_group_address: 10.9.0.4}}\n"
              "  edge:\n    gpu: {count: 1}\n    hosts:\n      e: {}\n")
    r = fleet.parse(text, "multi.fleet.yml", PROFILES)
    sg = {h: r["hosts"][h].get("modelfleet_serving_group") for h in r["hosts"]}
    assert sg["a"] == sg["b"] == {"name": "g-1", "layout": "pp", "nodes": 2, "port": 29600, "hosts": ["a", "b"],
                                  "head": "a"}
    assert sg["c"] == sg["d"] == {"name": "g-2", "layout": "pp", "nodes": 2, "port": 29600, "hosts": ["c", "d"],
                                  "head": "c"}
    assert sg["e"] is None
    assert r["hosts"]["e"]["modelfleet_endpoints"] == [{"name": "g", "port": 8080, "model": "g", "hosts": ["a", "c"]}]
    assert [h for h in "abcd" if "modelfleet_endpoint" in r["hosts"][h]] == ["a", "c"]
    # one replica of the group's size keeps the group's name
    one = fleet.parse("plugin: fleet\n" + MULTI, "one.fleet.yml", PROFILES)
    assert one["hosts"]["b"]["modelfleet_serving_group"]["name"] == "g"

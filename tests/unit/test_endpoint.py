"""The fleet endpoint's rule (module_utils endpoint): which replicas an endpoint names, the HAProxy configuration
(checked by the real `haproxy -c`), values that would add a directive refused, a refused file never put in place,
and the fleet file's `endpoint` key."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import endpoint
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import EndpointError
from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet
from ansible_collections.modelfleet.fleet.plugins.plugin_utils.fleet import FleetError

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _members(**urls):
    return {h: {"outcome": {"url": u, "served_name": "kimi-k2.5"}, "api_key": "k3y"} for h, u in urls.items()}


def _front(**kw):
    (fe,) = endpoint.frontends([{"name": "llama", "port": 8080, "hosts": ["gpu-01", "gpu-02", "gpu-03"]}],
                               _members(**kw))
    return fe


def _haproxy_check(text, tmp_path):
    assert os.path.exists(HAPROXY), "haproxy is not installed (scripts/setup.sh installs it)"
    cfg = tmp_path / "h.cfg"
    cfg.write_text(text)
    return subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)


def test_frontends_name_the_deployed_replicas_and_say_why_others_are_left_out():
    fe = _front(**{"gpu-01": "http://10.0.0.11:8000", "gpu-02": "http://[fd00::12]:8001"})
    assert fe["backends"] == [{"name": "gpu-01", "address": "10.0.0.11", "port": 8000},
                              {"name": "gpu-02", "address": "[fd00::12]", "port": 8001}]
    assert fe["served_name"] == "kimi-k2.5" and fe["api_key"] == "k3y"
    assert [x["host"] for x in fe["left_out"]] == ["gpu-03"] and "not serving from this run" in fe["left_out"][0]["why"]


def test_replicas_of_one_endpoint_must_serve_one_name_with_one_key():
    members = _members(**{"gpu-01": "http://10.0.0.11:8000", "gpu-02": "http://10.0.0.12:8000"})
    members["gpu-02"]["outcome"]["served_name"] = "minimax"
    with pytest.raises(EndpointError, match=r"serve different names \(gpu-01: 'kimi-k2.5', gpu-02: 'minimax'\); give "
                                            r"the endpoint a model name they all answer to"):
        endpoint.frontends([{"name": "llama", "port": 8080, "hosts": ["gpu-01", "gpu-02"]}], members)
    members["gpu-02"]["outcome"]["served_name"] = "kimi-k2.5"
    members["gpu-02"]["api_key"] = "other"
    with pytest.raises(EndpointError, match="different API keys"):
        endpoint.frontends([{"name": "llama", "port": 8080, "hosts": ["gpu-01", "gpu-02"]}], members)


@pytest.mark.parametrize("url", ["https://10.0.0.11:8000", "http://10.0.0.11:8000/v1", "http://10.0.0.11:99999",
                                 "10.0.0.11:8000", "http://a b:8000"])
def test_a_replica_url_that_is_not_http_address_port_is_refused(url):
    with pytest.raises(EndpointError, match="gpu-01"):
        _front(**{"gpu-01": url})


def test_render_is_accepted_by_haproxy_and_checks_each_replica_by_a_completion(tmp_path):
    fe = _front(**{"gpu-01": "http://10.0.0.11:8000", "gpu-02": "http://10.0.0.12:8000"})
    text = endpoint.render([fe], check_interval=2, check_timeout=10, fall=3, user=None,
                           admin_socket=str(tmp_path / "admin.sock"))
    res = _haproxy_check(text, tmp_path)
    assert res.returncode == 0 and "WARNING" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert "http-check send meth POST uri /v1/completions" in text
    assert """body '{"model":"kimi-k2.5","prompt":"ping","max_tokens":1}'""" in text
    assert "hdr Authorization 'Bearer k3y'" in text and "http-check expect status 200" in text
    assert "inter 2000ms" in text and "fall 3" in text and "timeout check 10000ms" in text
    assert "observe layer4 error-limit 1 on-error mark-down" in text  # a dead replica leaves at its first refusal
    # a request is kept to be sent again only when it came whole, and fits one buffer (256 KiB by default)
    assert "option http-buffer-request" in text and "tune.bufsize 262144" in text
    assert re.findall(r"^    server (\S+) (\S+)$", text, re.M) == [("gpu-01", "10.0.0.11:8000"),
                                                                     ("gpu-02", "10.0.0.12:8000")]


def test_an_endpoint_without_replicas_is_still_valid(tmp_path):
    (fe,) = endpoint.frontends([{"name": "llama", "port": 8080, "hosts": ["gpu-01"]}], {})
    res = _haproxy_check(endpoint.render([fe], user=None, admin_socket=str(tmp_path / "a.sock")), tmp_path)
    assert res.returncode == 0, res.stderr


BAD_VALUES = [
    ("served name with a newline", {"served_name": "x'\n    user root"}, "served name"),
    ("served name with a quote", {"served_name": "x' hdr X y"}, "served name"),
    ("api key with a space", {"api_key": "a b"}, "API key"),
    ("api key with a newline", {"api_key": "a\nglobal"}, "API key"),
    ("frontend name", {"name": "llama\nlisten x"}, "endpoint name"),
    ("frontend port", {"port": 0}, "port must be an integer 1-65535"),
    ("frontend port bool", {"port": True}, "port must be an integer 1-65535"),
    ("replica address", {"backends": [{"name": "gpu-01", "address": "10.0.0.11 backup", "port": 8000}]}, "address"),
    ("replica name", {"backends": [{"name": "gpu 01", "address": "10.0.0.11", "port": 8000}]}, "replica name"),
    ("replica twice", {"backends": [{"name": "a", "address": "10.0.0.11", "port": 8000},
                                    {"name": "a", "address": "10.0.0.12", "port": 8000}]}, "appears twice"),
    ("replica on the endpoint's own loopback port",
     {"backends": [{"name": "a", "address": "127.0.0.1", "port": 8080}]}, "also replica a's on loopback"),
]


@pytest.mark.parametrize(("change", "words"), [(c, w) for _, c, w in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES])
def test_a_value_that_would_add_a_directive_is_refused(change, words):
    fe = dict(_front(**{"gpu-01": "http://10.0.0.11:8000"}), **change)
    with pytest.raises(EndpointError, match=re.escape(words)):
        endpoint.render([fe])


def test_two_endpoints_on_one_port_are_refused():
    fe = _front(**{"gpu-01": "http://10.0.0.11:8000"})
    with pytest.raises(EndpointError, match="port 8080 is already another endpoint's"):
        endpoint.render([fe, dict(fe, name="other")])


@pytest.mark.parametrize(("kw", "words"), [({"bind_address": "0.0.0.0 ssl"}, "bind address"),
                                           ({"check_interval": 0}, "check interval"), ({"fall": 0}, "fall"),
                                           ({"admin_socket": "run/x.sock"}, "absolute path"),
                                           ({"retry_request_kib": 8}, "from 16"), ({"retry_request_kib": 5000}, "4096"),
                                           ({"retry_request_kib": True}, "retry_request_kib"),
                                           ({"retry_request_kib": "256"}, "retry_request_kib")])
def test_bad_settings_are_refused(kw, words):
    with pytest.raises(EndpointError, match=words):
        endpoint.render([_front(**{"gpu-01": "http://10.0.0.11:8000"})], **kw)


def test_install_puts_an_accepted_file_in_place_root_only_and_again_changes_nothing(tmp_path):
    path = tmp_path / "haproxy.cfg"
    text = endpoint.render([_front(**{"gpu-01": "http://10.0.0.11:8000"})], user=None,
                           admin_socket=str(tmp_path / "a.sock"))
    assert endpoint.install(str(path), text, haproxy=HAPROXY, check=True) == (True, "")
    assert not path.exists()  # check mode writes nothing
    assert endpoint.install(str(path), text, haproxy=HAPROXY) == (True, "")
    assert path.read_text() == text and (path.stat().st_mode & 0o777) == 0o600
    assert endpoint.install(str(path), text, haproxy=HAPROXY) == (False, text)
    assert sorted(os.listdir(tmp_path)) == ["haproxy.cfg"]


def test_a_file_haproxy_refuses_is_never_put_in_place(tmp_path):
    path = tmp_path / "haproxy.cfg"
    good = endpoint.render([_front(**{"gpu-01": "http://10.0.0.11:8000"})], user=None,
                           admin_socket=str(tmp_path / "a.sock"))
    endpoint.install(str(path), good, haproxy=HAPROXY)
    # what a newer render could get wrong (here a directive HAProxy does not know): refused, with its words
    bad = good.replace("    balance leastconn", "    balance leastconn\n    no-such-directive 1")
    with pytest.raises(EndpointError, match=r"haproxy -c refused .* not put in place .*no-such-directive"):
        endpoint.install(str(path), bad, haproxy=HAPROXY)
    assert path.read_text() == good and sorted(os.listdir(tmp_path)) == ["haproxy.cfg"]
    with pytest.raises(EndpointError, match="is not installed"):
        endpoint.install(str(path), bad, haproxy=str(tmp_path / "no-haproxy"))
    assert path.read_text() == good


def test_parse_stat_refuses_what_is_not_haproxys_csv():
    with pytest.raises(EndpointError, match="not HAProxy's show stat output"):
        endpoint.parse_stat("Unknown command\n")


FLEET = """\
plugin: fleet
gpu: {count: 1}
groups:
  llama:
    profile: tiny-llama
    endpoint: {host: b, port: 8080}
    hosts:
      a: {vars: {vllm_service_port: 8000}}
      b: {}
  other:
    profile: tiny-llama-b
    endpoint: {host: b, port: 8081}
    hosts:
      c: {}
"""
PROFILES = {p.stem for p in (ROOT / "profiles").glob("*.yml")}


def test_the_fleet_file_puts_each_groups_endpoint_on_the_host_it_names():
    r = fleet.parse(FLEET, "f.fleet.yml", PROFILES)
    assert r["hosts"]["b"]["modelfleet_endpoints"] == [
        {"name": "llama", "port": 8080, "model": "llama", "hosts": ["a", "b"]},
        {"name": "other", "port": 8081, "model": "other", "hosts": ["c"]}]
    assert "modelfleet_endpoints" not in r["hosts"]["a"] and r["groups"]["endpoints"]["hosts"] == ["b"]
    assert r["hosts"]["a"]["modelfleet_endpoint"] == {"host": "b", "name": "llama", "model": "llama"}
    assert r["hosts"]["c"]["modelfleet_endpoint"] == {"host": "b", "name": "other", "model": "other"}
    # each replica answers to its endpoint's model name besides its profile's own: the name stays when the
    # group's profile changes
    assert [r["hosts"][h]["vllm_service_served_aliases"] for h in "abc"] == [["llama"], ["llama"], ["other"]]


def test_an_endpoints_model_name_is_given_to_every_replica_once_beside_the_names_they_have():
    text = FLEET.replace("{host: b, port: 8080}", "{host: b, port: 8080, model: chat}").replace(
        "a: {vars: {vllm_service_port: 8000}}", "a: {vars: {vllm_service_port: 8000, vllm_service_served_aliases: "
                                                "[legacy, chat]}}")
    r = fleet.parse(text, "f.fleet.yml", PROFILES)
    assert r["hosts"]["b"]["modelfleet_endpoints"][0]["model"] == "chat"
    assert r["hosts"]["a"]["vllm_service_served_aliases"] == ["legacy", "chat"]
    assert r["hosts"]["b"]["vllm_service_served_aliases"] == ["chat"]
    assert "vllm_service_served_aliases" not in fleet.parse(FLEET.replace("    endpoint: {host: b, port: 8081}\n", ""),
                                                            "f.fleet.yml", PROFILES)["hosts"]["c"]


def test_a_switch_of_model_keeps_the_endpoint_when_every_replica_answers_to_its_model_name():
    members = _members(**{"gpu-01": "http://10.0.0.11:8000", "gpu-02": "http://10.0.0.12:8000"})
    members["gpu-01"]["outcome"]["served_model_names"] = ["kimi-k2.5", "chat"]
    members["gpu-02"]["outcome"].update(served_name="minimax", served_model_names=["minimax", "chat"])
    (fe,) = endpoint.frontends([{"name": "g", "port": 8080, "model": "chat", "hosts": ["gpu-01", "gpu-02"]}], members)
    assert fe["served_name"] == "chat" and [b["name"] for b in fe["backends"]] == ["gpu-01", "gpu-02"]
    # a replica that does not answer to it (deployed without the fleet file's alias) is refused by name
    members["gpu-02"]["outcome"]["served_model_names"] = ["minimax"]
    with pytest.raises(EndpointError, match=r"replica gpu-02 does not answer to the endpoint's model name 'chat' "
                                            r"\(it serves 'minimax'\)"):
        endpoint.frontends([{"name": "g", "port": 8080, "model": "chat", "hosts": ["gpu-01", "gpu-02"]}], members)
    # an outcome from before the names were kept: its one served name
    del members["gpu-02"]["outcome"]["served_model_names"]
    members["gpu-02"]["outcome"]["served_name"] = "chat"
    assert endpoint.frontends([{"name": "g", "port": 8080, "model": "chat", "hosts": ["gpu-02"]}],
                              members)[0]["backends"][0]["name"] == "gpu-02"


@pytest.mark.parametrize(("old", "new", "words"), [
    ("{host: b, port: 8080}", "{host: zz, port: 8080}",
     r"groups.llama.endpoint.host: endpoint host 'zz' is not a host"),
    ("{host: b, port: 8080}", "{host: b, port: 0}", r"groups.llama.endpoint.port: endpoint port must be 1-65535"),
    ("{host: b, port: 8081}", "{host: b, port: 8080}", r"port 8080 on b is already group llama's endpoint"),
    ("{host: b, port: 8080}", "{host: a, port: 8000}", r"port 8000 is the vLLM port of a"),
    ("{host: b, port: 8080}", "{host: b, port: 8080, tls: true}", r"unknown key 'tls' in group llama's endpoint"),
    ("{host: b, port: 8080}", "{host: b, port: 8080, model: 'a b'}",
     r"groups.llama.endpoint.model: the endpoint's model name 'a b' \(by default the group's name\) must be 1-63"),
    ("  llama:", "  " + "l" * 64 + ":", r"model name '" + "l" * 64 + "' .* set endpoint.model to such a name"),
    ("  other:", "  endpoints:", r"group name endpoints clashes with the derived group"),
])
def test_bad_endpoints_in_a_fleet_file_name_the_line_and_the_fix(old, new, words):
    with pytest.raises(FleetError, match=words):
        fleet.parse(FLEET.replace(old, new), "f.fleet.yml", PROFILES)

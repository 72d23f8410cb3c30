"""The vllm_service unit template rendered by Ansible for the Kimi profile: systemd-analyze verifies
it, and its offline security exposure is within the goal (<= 4.0)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

REV = "0123456789abcdef0123456789abcdef01234567"


def render(tmp_path, devices: str, template: str | None = None, expect_ok: bool = True, **more) -> str:
    """The unit as the role renders it (scripts/device/render_unit.yml: role defaults and vars, vllm_unit)."""
    out = tmp_path / f"modelfleet-vllm@kimi-k2.5-{devices}.service"
    extra = {"render_root": str(ROOT), "render_out": str(out), "render_python": "/usr/bin/python3",
             "render_devices": devices, "render_profile": str(ROOT / "profiles" / "kimi-k2.5-int4.yml"),
             "render_gpu_count": 8, "render_model_dir": f"/models/moonshotai--Kimi-K2.5/{REV}",
             "ansible_python_interpreter": sys.executable}
    if template:
        extra["render_template"] = template
    extra.update(more)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    r = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local",
                        str(ROOT / "scripts" / "device" / "render_unit.yml"), "-e", json.dumps(extra)],
                       capture_output=True, text=True, env=env)
    if not expect_ok:
        assert r.returncode != 0 and not out.exists(), r.stdout[-3000:]
        return r.stdout + r.stderr
    assert r.returncode == 0, r.stdout[-3000:]
    return out.read_text()


@pytest.mark.parametrize("devices", ["nvidia", "cpu"])
def test_rendered_unit_verifies_and_is_hardened(tmp_path, devices):
    text = render(tmp_path, devices)
    unit = tmp_path / f"modelfleet-vllm@kimi-k2.5-{devices}.service"
    assert f"--revision {REV}" in text and "--tool-call-parser kimi_k2" in text and "Restart=always" in text
    assert "TimeoutStartSec=775" in text  # 180 s + 595 GB at 1 GB/s
    assert "VLLM_API_KEY" not in text and "HF_TOKEN" not in text  # secrets only in the EnvironmentFile
    v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
    s = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", s.stdout)
    assert m, s.stdout[-2000:]
    exposure = float(m.group(1))
    print(f"systemd-analyze security exposure ({devices}): {exposure}")
    assert exposure <= 4.0


@pytest.mark.parametrize("devices", ["nvidia", "cpu"])
def test_rendered_unit_points_every_cache_into_its_writable_folder(tmp_path, devices):
    """Issue 27: every cache variable vLLM and its kernel libraries read is set by the rendered unit and lies in
    a ReadWritePaths entry (the only writable place under ProtectSystem=strict and ProtectHome=yes)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import unit_file
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
        CACHE_ENVIRONMENT,
        cache_problems,
    )

    text = render(tmp_path, devices)
    assert unit_file.last(text, "ProtectSystem") == "strict" and unit_file.last(text, "ProtectHome") == "yes"
    writable = unit_file.path_list(text, "ReadWritePaths")
    assert writable == ["/var/cache/modelfleet/vllm/kimi-k2.5"]
    env = unit_file.environment(text)
    for name, _, _ in CACHE_ENVIRONMENT:
        assert unit_file.is_within(env[name], writable[0]), name
    assert env["HOME"] == writable[0] == unit_file.last(text, "WorkingDirectory")
    assert cache_problems(text) == []


@pytest.mark.parametrize("more,needle", [
    ({"vllm_service_environment": {"A": "x\nUser=root\nExecStartPre=+/bin/sh -c id"}}, "A contains a newline"),
    ({"vllm_service_environment": {"BAD-KEY": "1"}}, "is not a variable name"),
    ({"vllm_service_environment": {"TRITON_CACHE_DIR": "/root/.triton"}}, "TRITON_CACHE_DIR is set by modelfleet"),
    ({"vllm_service_api_key": "k\nHF_TOKEN=leak"}, "vllm_service_api_key contains a newline"),
    ({"vllm_service_cache_root": "/var/cache/x\nUser=root"}, "contains a newline"),
    ({"render_model_dir": "/models/x\nUser=root"}, "newline"),
])
def test_unsafe_values_are_refused_before_anything_is_written(tmp_path, more, needle):
    """Issue 19: a newline (or a bad name) in a rendered value fails the computation step, by name, and no
    unit file is written (the role's later tasks - stop, install, start - never run)."""
    out = render(tmp_path, "nvidia", expect_ok=False, **more)
    assert needle in out and "Traceback" not in out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_group_members_unit_starts_its_part_and_lets_only_the_group_in(tmp_path, rank):
    """Issue 24: a member of a pipeline group of 2 (the group_members filter's entry, from the inventory's group
    addresses and interface): vLLM's serve entry through the role's launcher, its rank's arguments, its address
    and interface in the environment, the group's addresses (its own included) and nothing else beyond loopback
    let through, and the whole control group killed with it. systemd-analyze verifies it."""
    sys.path.insert(0, str(ROOT / "plugins" / "filter"))
    from group import group_members

    hostvars = {"g1": {"vllm_service_group_address": "10.9.0.1", "vllm_service_group_ifname": "ens5"},
                "g2": {"vllm_service_group_address": "10.9.0.2", "vllm_service_group_ifname": "ens5"}}
    plan = {"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2}
    member = group_members(plan, ["g1", "g2"], hostvars, 8000, 29500)[rank]
    text = render(tmp_path, "nvidia", render_member=member)
    flat = " ".join(text.replace("\\\n", " ").split())
    assert "ExecStart=/usr/bin/python3 /opt/modelfleet/vllm-serve/modelfleet-vllm-serve.py --model" in flat
    assert (f"--pipeline-parallel-size 2 --nnodes 2 --node-rank {rank} --master-addr 10.9.0.1 --master-port 29500"
            in flat)
    assert ("--headless" in flat) == (rank == 1)
    for env in (f"VLLM_HOST_IP=10.9.0.{rank + 1}", "GLOO_SOCKET_IFNAME=ens5", "NCCL_SOCKET_IFNAME=ens5"):
        assert f"Environment={env}" in text
    allow = next(line for line in text.splitlines() if line.startswith("IPAddressAllow="))
    assert "IPAddressDeny=any" in text and set(allow.split("=", 1)[1].split()) == {"localhost", "10.9.0.1/32",
                                                                                   "10.9.0.2/32"}
    assert "KillMode=control-group" in text
    unit = tmp_path / "modelfleet-vllm@kimi-k2.5-nvidia.service"
    v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr


def test_the_group_members_filter_refuses_what_the_inventory_does_not_give():
    sys.path.insert(0, str(ROOT / "plugins" / "filter"))
    from ansible.errors import AnsibleFilterError
    from group import group_members

    plan = {"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2}
    with pytest.raises(AnsibleFilterError, match=r"g2: no group address \(vllm_service_group_address\)"):
        group_members(plan, ["g1", "g2"], {"g1": {"vllm_service_group_address": "10.9.0.1"}, "g2": {}}, 8000)
    with pytest.raises(AnsibleFilterError, match="the layout needs 2 hosts and the group has 1"):
        group_members(plan, ["g1"], {"g1": {"vllm_service_group_address": "10.9.0.1"}}, 8000)

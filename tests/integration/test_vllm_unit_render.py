"""The vllm_service unit template rendered by Ansible for the Kimi profile: systemd-analyze verifies
it, and its offline security exposure is within the goal (<= 4.0)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

REV = "0123456789abcdef0123456789abcdef01234567"
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {root}/roles/vllm_service/defaults/main.yml
    - ansible.builtin.set_fact:
        vllm_service_profile: "{{{{ lookup('file', '{root}/profiles/kimi-k2.5-int4.yml') | from_yaml }}}}"
        vllm_service_model_dir: /models/moonshotai--Kimi-K2.5/{rev}
        vllm_service_revision: {rev}
        vllm_service_devices: {devices}
    - ansible.builtin.include_vars: {root}/roles/vllm_service/vars/main.yml
    - vllm_unit:
        python: /usr/bin/python3
        model_dir: "{{{{ vllm_service_model_dir }}}}"
        profile: "{{{{ vllm_service_profile }}}}"
        plan: {{tensor_parallel_size: 8, expert_parallel: false}}
        revision: {rev}
        gpu_count: 8
        model_bytes: 595148192736
      register: __vllm_service_unit
    - ansible.builtin.template:
        src: {root}/roles/vllm_service/templates/vllm.service.j2
        dest: {out}/modelfleet-vllm@kimi-k2.5.service
        mode: "0644"
"""


@pytest.mark.parametrize("devices", ["nvidia", "cpu"])
def test_rendered_unit_verifies_and_is_hardened(tmp_path, devices):
    play = tmp_path / "render.yml"
    play.write_text(PLAY.format(root=ROOT, rev=REV, out=tmp_path, devices=devices))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    r = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(play),
                        "-e", f"ansible_python_interpreter={sys.executable}"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    unit = tmp_path / "modelfleet-vllm@kimi-k2.5.service"
    text = unit.read_text()
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

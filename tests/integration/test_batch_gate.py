"""The gate after each batch of deploy_model.yml's Switch play (issue 21: each wave its own max_fail_percentage),
run by real ansible-playbook: the plan from deploy_plan, the play's own variables (playbooks/vars/rollout.yml)
and gate (role modelfleet_deploy, tasks_from batch_gate), on four hosts reached with the local connection. Only
the per-host path is a stand-in (a command that fails on the hosts named broken); molecule/fleet runs the real
one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.rollout import deploy_plan

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

HOSTS = ["h1", "h2", "h3", "h4"]

PLAYBOOK = f"""
- name: The plan, as the preflight publishes it
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Publish it
      ansible.builtin.set_fact:
        modelfleet_rollout_plan: "{{{{ plan }}}}"
        __mf_profiles: {{p: {{}}}}
        __mf_checkpoints: {{p: {{}}}}

- name: Switch, as deploy_model.yml runs it
  hosts: rollout
  gather_facts: false
  serial: "{{{{ hostvars['localhost'].modelfleet_rollout_plan.rest_serial }}}}"
  max_fail_percentage: 100
  vars_files: [{ROOT}/playbooks/vars/rollout.yml]
  tasks:
    - name: Serve
      block:
        - name: Say that the host's path ran
          ansible.builtin.debug:
            msg: "path ran on {{{{ inventory_hostname }}}}"

        - name: The host's path (fails on the hosts named broken)
          ansible.builtin.command: "{{{{ 'false' if inventory_hostname in broken else 'true' }}}}"
          changed_when: false
      rescue:
        - name: Record the failure
          ansible.builtin.set_fact:
            __mf_failure: "{{{{ ansible_failed_result.msg | default('') }}}}"

    - name: The gate
      ansible.builtin.import_role:
        name: modelfleet.fleet.modelfleet_deploy
        tasks_from: batch_gate

- name: Run summary (deploy_model.yml's last play; the run's exit status comes from it)
  hosts: rollout
  gather_facts: false
  tasks:
    - name: Summarise
      ansible.builtin.debug:
        msg: "summary of {{{{ inventory_hostname }}}}"
"""


def run_gate(tmp_path, waves, broken, default_mfp=0):
    plan = deploy_plan({h: "p" for h in HOSTS}, {"waves": waves, "max_fail_percentage": default_mfp})
    inv = tmp_path / "inventory.yml"
    inv.write_text(json.dumps({"all": {"children": {"rollout": {"hosts": {h: {} for h in plan["rest_hosts"]}}},
                                       "vars": {"ansible_connection": "local",
                                                "ansible_python_interpreter": sys.executable}}}))
    pb = tmp_path / "gate.yml"
    pb.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    r = subprocess.run(["ansible-playbook", "-i", str(inv), str(pb), "-e", json.dumps({"plan": plan,
                                                                                       "broken": broken})],
                       capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    recap = {m.group(1): m.group(2) for m in re.finditer(r"^(h\d)\s+:\s+(.*)$", out, re.M)}
    flat = " ".join(out.split())
    ran = {h: f"path ran on {h}" in flat for h in HOSTS}
    return r.returncode, flat, recap, ran


def test_a_failure_within_the_waves_percentage_lets_the_rollout_go_on(tmp_path):
    rc, out, recap, ran = run_gate(tmp_path, [{"name": "pair", "hosts": ["h1", "h2"], "max_fail_percentage": 50},
                                              {"name": "last", "hosts": ["h3", "h4"]}], broken=["h2"])
    assert rc == 2  # a host failed: the run says so (also when the gate ended the play: the last play says it)
    assert ("wave pair (wave 1 of 2, batch 1 of 1): h2 (p) failed; 1 of 2 host(s) of the batch failed, within "
            "the wave's max_fail_percentage 50%: the rollout goes on") in out, out[-2000:]
    assert "failed=1" in recap["h2"] and "failed=0" in recap["h1"]
    assert ran == {"h1": True, "h2": True, "h3": True, "h4": True}  # the next wave ran
    assert "failed=0" in recap["h3"] and "failed=0" in recap["h4"]


def test_a_failure_beyond_it_stops_the_later_waves_and_fails_no_other_host(tmp_path):
    rc, out, recap, ran = run_gate(tmp_path, [{"name": "pair", "hosts": ["h1", "h2"]},
                                              {"name": "last", "hosts": ["h3", "h4"], "max_fail_percentage": 50}],
                                   broken=["h2"])
    assert rc == 2
    assert ("rollout stopped in wave pair (wave 1 of 2, batch 1 of 1): h2 (p) failed; the batches and waves after "
            "it were not started") in out, out[-2000:]
    # h1 finished its own path and is not counted as failed; the next wave never started
    assert "failed=0" in recap["h1"] and "failed=1" in recap["h2"]
    assert not ran["h3"] and not ran["h4"], recap


def test_a_later_batch_of_the_same_wave_never_starts(tmp_path):
    rc, out, recap, ran = run_gate(tmp_path, [{"name": "one-by-one", "hosts": HOSTS, "serial": 2,
                                               "max_fail_percentage": 49}], broken=["h1"])
    assert rc == 2 and "rollout stopped in wave one-by-one (wave 1 of 1, batch 1 of 2): h1 (p) failed" in out
    assert not ran["h3"] and not ran["h4"], recap


def test_a_batch_where_every_host_failed_stops_even_at_100_percent(tmp_path):
    rc, out, recap, ran = run_gate(tmp_path, [{"name": "pair", "hosts": ["h1", "h2"], "max_fail_percentage": 100},
                                              {"name": "last", "hosts": ["h3", "h4"]}], broken=["h1", "h2"])
    assert rc == 2 and "rollout stopped in wave pair" in out, out[-2000:]
    assert not ran["h3"] and not ran["h4"], recap

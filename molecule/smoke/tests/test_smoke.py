"""testinfra checks for the smoke scenario: systemd is PID 1, the unit is active and enabled, runs as
its own user, and its port answers HTTP."""

import pytest

# each host's port (molecule.yml host_vars): the scenario runs on the host network
PORTS = {"gpu-node-1": 8091, "gpu-node-2": 8092}


def test_systemd_is_pid1(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), state


def test_unit_active_and_enabled(host):
    svc = host.service("modelfleet-smoke")
    assert svc.is_running
    assert svc.is_enabled


def test_runs_as_service_user(host):
    user = host.run("systemctl show -p User --value modelfleet-smoke").stdout.strip()
    assert user == "modelfleet-smoke"
    pid = host.run("systemctl show -p MainPID --value modelfleet-smoke").stdout.strip()
    assert pid != "0"
    assert host.process.get(pid=int(pid)).user == "modelfleet-smoke"


def test_port_listening_and_answers(host):
    port = PORTS[host.backend.get_hostname()]
    assert host.socket(f"tcp://127.0.0.1:{port}").is_listening
    # the host network is shared by both hosts: this port is the one this host's unit was given
    assert f"http.server {port} " in host.run("systemctl show -p ExecStart --value modelfleet-smoke").stdout
    out = host.run(f"curl -fsS http://127.0.0.1:{port}/")
    assert out.rc == 0, out.stderr
    assert "modelfleet smoke" in out.stdout


@pytest.mark.parametrize("prop,value", [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict")])
def test_unit_hardening(host, prop, value):
    assert host.run(f"systemctl show -p {prop} --value modelfleet-smoke").stdout.strip() == value

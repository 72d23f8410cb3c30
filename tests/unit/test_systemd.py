"""The one systemd helper (issue 21): listing and showing services through a fake systemctl that answers like
the real one, its errors, and the callers that now use it (host state, deploy record, the unit name's inverse)."""

from __future__ import annotations

import subprocess

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import deploy_record, host_state
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.systemd import (
    SystemdError,
    list_units,
    parse_show,
    show,
    show_unit,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
    UNIT_GLOB,
    served_name_of,
    unit_name,
)


class Systemctl:
    """Answers list-units with `listing` and show with `shows[unit]` blocks, in the order asked."""

    def __init__(self, listing="", shows=None, rc=0, err=""):
        self.listing, self.shows, self.rc, self.err, self.calls = listing, shows or {}, rc, err, []

    def __call__(self, argv, **kw):
        assert kw == {"capture_output": True, "text": True}
        self.calls.append(argv)
        if self.rc:
            return subprocess.CompletedProcess(argv, self.rc, "", self.err)
        if argv[1] == "list-units":
            return subprocess.CompletedProcess(argv, 0, self.listing, "")
        units = argv[5:]  # systemctl show --no-pager -p PROPS UNIT...
        return subprocess.CompletedProcess(argv, 0, "\n\n".join(self.shows.get(u, f"Id={u}") for u in units), "")


LISTING = ("modelfleet-vllm@a.service loaded active running vLLM a\n"
           "modelfleet-vllm@b.service loaded activating auto-restart vLLM b\n"
           "ssh.service loaded active running OpenBSD Secure Shell server\n"
           "  \n")


def test_list_units_asks_for_services_in_every_state_or_one_and_parses_the_columns():
    run = Systemctl(LISTING)
    assert list_units(run=run) == [
        {"unit": "modelfleet-vllm@a.service", "load": "loaded", "active": "active", "sub": "running"},
        {"unit": "modelfleet-vllm@b.service", "load": "loaded", "active": "activating", "sub": "auto-restart"},
        {"unit": "ssh.service", "load": "loaded", "active": "active", "sub": "running"}]
    assert run.calls[0] == ["systemctl", "list-units", "--type=service", "--all", "--no-legend", "--plain",
                            "--no-pager"]
    list_units([UNIT_GLOB], state="active", run=run)
    assert run.calls[1] == ["systemctl", "list-units", "--type=service", "--state=active", "--no-legend", "--plain",
                            "--no-pager", "modelfleet-vllm@*.service"]


def test_a_failing_or_missing_systemctl_is_an_error_never_an_empty_answer():
    with pytest.raises(SystemdError) as e:
        list_units(run=Systemctl(rc=1, err="Failed to connect to bus: No such file or directory\n"))
    assert str(e.value) == "systemctl list-units exited 1: Failed to connect to bus: No such file or directory"
    with pytest.raises(SystemdError) as e:
        show(["a.service"], ("Id",), run=Systemctl(rc=4, err="x" * 300))
    assert str(e.value) == "systemctl show exited 4: " + "x" * 200

    def absent(argv, **kw):
        raise FileNotFoundError(2, "No such file or directory", "systemctl")

    with pytest.raises(SystemdError) as e:
        show_unit("a.service", ("Id",), run=absent)
    assert str(e.value) == "[Errno 2] No such file or directory: 'systemctl'"


def test_parse_show_blocks_and_repeated_keys():
    assert parse_show("Id=a\nEnvironment=X=1\nEnvironment=Y=2\n\n\nId=b\nWorkingDirectory=/w\nnot a property") == [
        {"Id": "a", "Environment": "X=1\nY=2"}, {"Id": "b", "WorkingDirectory": "/w"}]
    assert parse_show("") == [] and parse_show("\n\n") == []


def test_show_keeps_only_what_was_asked_in_the_order_given_and_asks_nothing_for_no_unit():
    run = Systemctl(shows={"b.service": "Id=b.service\nActiveState=active\nOther=1",
                           "a.service": "Id=a.service\nActiveState=failed"})
    assert show(["b.service", "a.service"], ("Id", "ActiveState"), run=run) == [
        {"Id": "b.service", "ActiveState": "active"}, {"Id": "a.service", "ActiveState": "failed"}]
    assert run.calls[0] == ["systemctl", "show", "--no-pager", "-p", "Id,ActiveState", "b.service", "a.service"]
    assert show([], ("Id",), run=run) == [] and len(run.calls) == 1
    assert show_unit("b.service", ("ActiveState",), run=run) == {"ActiveState": "active"}


@pytest.mark.parametrize("name", ["tiny-llama", "kimi-k2.5", "a", "A_b.c-d"])
def test_the_served_name_is_the_unit_names_inverse(name):
    assert served_name_of(unit_name(name)) == name


@pytest.mark.parametrize("unit", ["ssh.service", "modelfleet-vllm@.service", "modelfleet-vllm@a b.service",
                                  "modelfleet-vllm@a.socket", "xmodelfleet-vllm@a.service"])
def test_other_units_have_no_served_name(unit):
    assert served_name_of(unit) is None


def test_host_state_lists_each_modelfleet_unit_with_its_model_and_port():
    exec_start = ("{ path=/opt/modelfleet/vllm/bin/python ; argv[]=/opt/modelfleet/vllm/bin/python -m "
                  "vllm.entrypoints.openai.api_server --model /models/o--m/{rev} --port 18501 ; ignore_errors=no }")
    a, b = "modelfleet-vllm@a.service", "modelfleet-vllm@b.service"
    run = Systemctl(f"{a} loaded active running A\n{b} loaded failed failed B\n",
                    {a: f"Id={a}\nActiveState=active\nSubState=running\nMainPID=42\nNRestarts=1\n"
                        "ExecStart=" + exec_start.replace("{rev}", "1" * 40),
                     b: f"Id={b}\nActiveState=failed\nSubState=failed\nMainPID=0\nNRestarts=0\nExecStart=/bin/false"})
    units = host_state.units(run)
    assert [(u["unit"], u["served_model_name"], u["active"], u["port"], u["model_dir"]) for u in units] == [
        ("modelfleet-vllm@a.service", "a", True, 18501, "/models/o--m/" + "1" * 40),
        ("modelfleet-vllm@b.service", "b", False, None, None)]
    assert run.calls[0][-1] == UNIT_GLOB


@pytest.mark.parametrize("exec_start, port", [("python -m vllm serve /m --port 8000", 8000),
                                              ("python -m vllm serve /m --port=8001 --host 127.0.0.1", 8001),
                                              ("python -m vllm serve /m", None), ("x --port", None),
                                              ("x --port abc", None)])
def test_port_from_exec_start(exec_start, port):
    assert host_state.port_from_exec_start(exec_start) == port


def test_the_deploy_record_asks_for_active_modelfleet_units_only():
    run = Systemctl("modelfleet-vllm@b.service loaded active running B\nmodelfleet-vllm@a.service loaded active "
                    "running A\n")
    assert deploy_record.active_units(run) == ["modelfleet-vllm@a.service", "modelfleet-vllm@b.service"]
    assert "--state=active" in run.calls[0] and run.calls[0][-1] == UNIT_GLOB

"""The start-up verdict: a server this run started that exits before it is ready is a failed start at once,
not after Restart= has repeated it up to the start limit; a unit found running judges only its failed state."""

from __future__ import annotations

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.readiness import start_verdict

STARTING = {"ActiveState": "activating", "SubState": "start", "NRestarts": "0", "Result": "success",
            "ExecMainCode": "0", "ExecMainStatus": "0"}


def test_a_server_still_starting_is_not_dead():
    assert start_verdict(STARTING, 0) == (False, "")
    assert start_verdict(dict(STARTING, ActiveState="active", SubState="running"), 0) == (False, "")


def test_the_first_exit_before_ready_is_a_failed_start():
    # between the exit and the restart systemd says auto-restart; NRestarts is still 0
    dead, why = start_verdict(dict(STARTING, SubState="auto-restart", ExecMainCode="1", ExecMainStatus="2"), 0)
    assert dead and "exited before it was ready (exit status 2)" in why and "restarted it 1 time(s)" in why
    dead, why = start_verdict(dict(STARTING, NRestarts="1"), 0)
    assert dead and "allowed before ready: 0" in why and "(exit not recorded)" in why


@pytest.mark.parametrize(("props", "allowed", "dead"), [
    ({"NRestarts": "1"}, 1, False),
    ({"NRestarts": "1", "SubState": "auto-restart"}, 1, True),
    ({"NRestarts": "2"}, 1, True),
    ({"NRestarts": "7"}, -1, False),                        # found running: older restarts are history
    ({"ActiveState": "failed", "Result": "start-limit-hit"}, -1, True),
    ({"ActiveState": "failed", "Result": "exit-code"}, 3, True),
    ({"NRestarts": "garbage"}, 0, False),
])
def test_restarts_allowed_and_history(props, allowed, dead):
    assert start_verdict(dict(STARTING, **props), allowed)[0] is dead


def test_a_signal_is_named_as_a_signal():
    dead, why = start_verdict(dict(STARTING, ActiveState="failed", Result="signal", ExecMainCode="2",
                                   ExecMainStatus="9"), 0)
    assert dead and "killed by signal 9" in why and "signal" in why



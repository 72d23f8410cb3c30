"""Which model a serving unit serves, read from systemd's ExecStart property (host_state, behind
`modelfleet status` and the deploy's fast path)."""

from __future__ import annotations

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.host_state import model_from_exec_start


@pytest.mark.parametrize("exec_start,model", [
    ("{ path=/opt/v/bin/python ; argv[]=/opt/v/bin/python -m vllm.entrypoints.openai.api_server --model /models/a "
     "--port 8000 ; ignore_errors=no ; start_time=[n/a] }", "/models/a"),
    ("{ path=/usr/bin/vllm ; argv[]=/usr/bin/vllm serve /models/b --tensor-parallel-size 8 ; }", "/models/b"),
    ("{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m http.server 8080 ; }", None),
    # the argv ends at " ;": what follows (another field) is not part of the command line
    ("{ path=/v/bin/vllm ; argv[]=/v/bin/vllm serve ; ignore_errors=no /models/z ; }", None),
    ("{ path=/v/bin/vllm ; argv[]=/v/bin/vllm serve --model=/models/c --port 1 ; }", "/models/c"),
    ("{ path=/v/bin/vllm ; argv[]=/v/bin/vllm serve --port 1 --model /models/d ; }", "/models/d"),
    ("{ path=/v/bin/vllm ; argv[]=/v/bin/vllm serve --port 1 --model ; }", None),  # no value after --model
    ("/v/bin/vllm serve /models/e", "/models/e"),  # a plain command line (no property braces)
    ("/v/bin/python -m other serve /models/f", None),  # not vLLM
    ("", None),
])
def test_model_from_exec_start(exec_start, model):
    assert model_from_exec_start(exec_start) == model

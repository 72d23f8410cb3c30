"""The vLLM command line from the Kimi profile and the planner, and the inputs refused before
anything is stopped."""

from __future__ import annotations

import re

import pytest
from ansible.module_utils.modelfleet.profiles import load_profile
from ansible.module_utils.modelfleet.vllm_unit import (
    ServeError,
    server_argv,
    start_timeout_seconds,
    systemd_quote,
    unit_name,
)

from tests.conftest import ROOT

KIMI = load_profile("kimi-k2.5-int4", str(ROOT / "profiles"))
REV = "0123456789abcdef0123456789abcdef01234567"
PLAN = {"tensor_parallel_size": 8, "expert_parallel": False}


def test_kimi_argv_is_the_seeds_command_pinned():
    argv = server_argv(python="/opt/modelfleet/vllm/bin/python", model_dir=f"/models/moonshotai--Kimi-K2.5/{REV}",
                       profile=KIMI, plan=PLAN, host="127.0.0.1", port=8000, revision=REV, gpu_count=8)
    s = " ".join(argv)
    assert "--tensor-parallel-size 8" in s and "--enable-expert-parallel" not in s
    assert "--tool-call-parser kimi_k2" in s and "--reasoning-parser kimi_k2" in s
    assert "--enable-auto-tool-choice" in s and "--trust-remote-code" in s
    assert f"--revision {REV}" in s and f"--code-revision {REV}" in s
    assert "--kv-cache-dtype auto" in s and "--served-model-name kimi-k2.5" in s


def test_minimax_gets_expert_parallel():
    mm = load_profile("minimax-m2.5-fp8", str(ROOT / "profiles"))
    argv = server_argv(python="p", model_dir="/m", profile=mm, plan={"tensor_parallel_size": 8,
                       "expert_parallel": True}, host="127.0.0.1", port=8000, revision=REV, gpu_count=8)
    assert "--enable-expert-parallel" in argv


@pytest.mark.parametrize("kw,needle", [
    ({"gpu_count": 4}, "larger than the 4 GPU(s)"),
    ({"host": "0.0.0.0"}, "API key is required"),
    ({"port": 70000}, "not a TCP port"),
    ({"revision": "main"}, "no 40-hex revision"),
])
def test_refused_before_anything_is_stopped(kw, needle):
    args = dict(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="127.0.0.1", port=8000, revision=REV,
                gpu_count=8)
    args.update(kw)
    with pytest.raises(ServeError, match=re.escape(needle)):
        server_argv(**args)


def test_non_loopback_with_key_is_fine():
    argv = server_argv(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="0.0.0.0", port=8000, revision=REV,
                       gpu_count=8, api_key_set=True)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"


def test_timeout_sized_from_the_model():
    assert start_timeout_seconds(595_148_192_736, 1e9) == 180 + 595
    with pytest.raises(ServeError):
        start_timeout_seconds(1, 0)


def test_unit_name_and_quoting():
    assert unit_name("kimi-k2.5") == "modelfleet-vllm@kimi-k2.5.service"
    with pytest.raises(ServeError):
        unit_name("bad name/../x")
    assert systemd_quote("a b") == '"a b"' and systemd_quote("50%") == "50%%" and systemd_quote("$X") == "$$X"


def test_exec_lines_one_flag_per_line():
    from ansible.module_utils.modelfleet.vllm_unit import exec_lines

    lines = exec_lines(["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m x",
                        "--enable-auto-tool-choice", "--port", "8000"])
    assert lines == ["/v/bin/python -m vllm.entrypoints.openai.api_server", '--model "/m x"',
                     "--enable-auto-tool-choice", "--port 8000"]

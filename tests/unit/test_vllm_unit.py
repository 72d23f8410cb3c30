"""The vLLM command line from the Kimi profile and the planner, and the inputs refused before
anything is stopped."""

from __future__ import annotations

import re

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.profiles import load_profile
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
    ServeError,
    server_argv,
    start_timeout_seconds,
    systemd_quote,
    unit_name,
    unit_path,
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


LAUNCHER = "/opt/modelfleet/bin/modelfleet-vllm-serve.py"


def _members():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group

    plan = {"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2}
    return group.members(plan, [{"host": "gpu-01", "address": "10.0.0.11"}, {"host": "gpu-02", "address": "10.0.0.12"}],
                         http_port=8000)


def test_a_group_member_starts_through_the_serve_launcher_with_its_group_arguments():
    head, follower = _members()
    args = dict(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="0.0.0.0", port=8000, revision=REV,
                gpu_count=8, api_key_set=True, launcher=LAUNCHER)
    single = server_argv(**{k: v for k, v in args.items() if k != "launcher"})
    for m in (head, follower):
        argv = server_argv(**args, member=m)
        # the launcher replaces the api_server module; every single-host argument stays, the group's follow
        n = len(m["args"])
        assert argv[:2] == ["p", LAUNCHER] and argv[2:-n] == single[3:] and argv[-n:] == m["args"]
    assert "--headless" in server_argv(**args, member=follower) and "--headless" not in server_argv(**args, member=head)


@pytest.mark.parametrize("change,needle", [
    ({"launcher": None}, "give its absolute path"),
    ({"launcher": "modelfleet-vllm-serve.py"}, "give its absolute path"),
    ({"member": {"role": "worker", "args": []}}, "not one of group.members' entries"),
    ({"member": {"role": "head", "args": ["--nnodes", 2]}}, "not one of group.members' entries"),
    ({"member": "head"}, "not one of group.members' entries"),
    ({"member": {"host": "gpu-02", "role": "headless", "args": ["--nnodes", "2"]}}, "disagree"),
    ({"member": {"host": "gpu-01", "role": "head", "args": ["--headless"]}}, "disagree"),
])
def test_a_member_that_is_not_derived_is_refused(change, needle):
    args = dict(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="127.0.0.1", port=8000, revision=REV,
                launcher=LAUNCHER, member=_members()[1])
    args.update(change)
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
    assert unit_path("kimi-k2.5") == "/etc/systemd/system/modelfleet-vllm@kimi-k2.5.service"
    with pytest.raises(ServeError):
        unit_name("bad name/../x")
    assert systemd_quote("a b") == '"a b"' and systemd_quote("50%") == "50%%" and systemd_quote("$X") == "$$X"


def test_exec_lines_one_flag_per_line():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import exec_lines

    lines = exec_lines(["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m x",
                        "--enable-auto-tool-choice", "--port", "8000"])
    assert lines == ["/v/bin/python -m vllm.entrypoints.openai.api_server", '--model "/m x"',
                     "--enable-auto-tool-choice", "--port 8000"]


# --- the unit's environment: every run-time cache inside the one writable folder (issue 27) ---

def test_cache_environment_covers_every_documented_cache_inside_the_folder():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.unit_file import is_within
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
        CACHE_ENVIRONMENT,
        cache_environment,
    )

    env = cache_environment("/var/cache/modelfleet/vllm/kimi-k2.5/")
    names = [n for n, _, _ in CACHE_ENVIRONMENT]
    for must in ("HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT",
                 "CUDA_CACHE_PATH", "FLASHINFER_WORKSPACE_BASE", "HF_HOME"):
        assert must in names
    assert list(env) == names and len(set(env.values())) == len(env)  # one folder each, none shared
    assert env["HOME"] == "/var/cache/modelfleet/vllm/kimi-k2.5"
    assert all(is_within(v, env["HOME"]) for v in env.values())


@pytest.mark.parametrize("bad", ["relative/dir", "/", "//", "/var/cache/../etc", "/var/cache/x\nUser=root", ""])
def test_cache_folder_refused(bad):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import cache_environment

    with pytest.raises(ServeError, match="vllm_service_cache_root|cache folder"):
        cache_environment(bad)


def test_unit_environment_keeps_caches_and_refuses_unsafe_extras():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import unit_environment

    env = unit_environment("/c/m", {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": 1, "X": True})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["X"] == "true" and env["HF_HUB_OFFLINE"] == "1"
    for extra, match in [({"TRITON_CACHE_DIR": "/root/.triton"}, "TRITON_CACHE_DIR is set by modelfleet"),
                         ({"HOME": "/root"}, "HOME is set by modelfleet"),
                         ({"BAD-NAME": "1"}, "not a variable name"),
                         ({"1X": "1"}, "not a variable name"),
                         ({"A": "x\nUser=root"}, "A contains a newline"),
                         ({"A": "x\rB"}, "carriage return"),
                         ({"A": "x\0"}, "NUL"),
                         ({"A": {"nested": 1}}, "string or a number")]:
        with pytest.raises(ServeError, match=match):
            unit_environment("/c/m", extra)


@pytest.mark.parametrize("value", ["plain", "with space", 'say "hi"', "it's", "back\\slash", "50%", "$HOME",
                                   "tab\there", "a=b=c", ""])
def test_environment_assignment_reads_back_as_written(value):
    """What systemd reads back from the rendered Environment= word is exactly the value given."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import unit_file
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import environment_assignment

    line = environment_assignment("K", value)
    assert "\n" not in line
    assert unit_file.environment(f"[Service]\nEnvironment={line}\n") == {"K": value}


def test_cache_problems_catch_the_unit_before_the_fix(fixtures_dir):
    """The unit that failed on the H200 (HOME read-only, no Triton cache variable) is caught; the one after
    the fix is clean. Both were rendered by the role's template on the GPU machine."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
        CACHE_ENVIRONMENT,
        cache_problems,
    )

    d = fixtures_dir / "device" / "h200-unit-cache-check"
    before = cache_problems((d / "unit-before.service").read_text())
    assert any(p.startswith("TRITON_CACHE_DIR is not set") for p in before)
    assert any(p.startswith("HOME is not set") for p in before)
    assert cache_problems((d / "unit-after.service").read_text()) == []
    moved = (d / "unit-after.service").read_text().replace("ReadWritePaths=/var/cache/modelfleet/vllm/kimi-k2.5",
                                                           "ReadWritePaths=/var/cache/modelfleet/vllm/other")
    assert len(cache_problems(moved)) == len(CACHE_ENVIRONMENT)  # every variable now outside the writable folder


# --- issue 19: only safe values reach the unit or the environment file ---

@pytest.mark.parametrize("key,needle", [("k\nHF_TOKEN=x", "a newline"), ("k\r", "carriage return"),
                                        ("a b", "a blank"), ('k"', "'\"'"), ("k\\", "'\\\\\\\\'"), ("$HOME", "'\\$'"),
                                        ("#k", "comment"), ("k\x00", "NUL")])
def test_api_key_refused_when_it_would_not_be_one_literal_assignment(key, needle):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import check_api_key

    with pytest.raises(ServeError, match=f"vllm_service_api_key.*{needle}|{needle}.*vllm_service_api_key"):
        check_api_key(key)
    check_api_key("sk-" + "0123456789abcdef" * 4)  # a usual key passes


@pytest.mark.parametrize("name", ["kimi\n", "kimi\nUser=root", "a" * 64, "-x", "a b", "a%b"])
def test_served_names_with_a_trailing_newline_or_junk_refused(name):
    with pytest.raises(ServeError, match="served model name"):
        unit_name(name)


def test_revision_with_a_trailing_newline_is_not_a_commit():
    args = dict(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="127.0.0.1", port=8000, revision=REV + "\n")
    with pytest.raises(ServeError, match="40-hex"):
        server_argv(**args)


@pytest.mark.parametrize("path,word", [("/models/a/b", "/models/a/b"), ("/models/my model", '"/models/my model"'),
                                       ("/models/50%", "/models/50%%")])
def test_path_settings_read_back_as_the_path(path, word):
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import unit_file
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import path_setting

    assert path_setting(path, "model folder") == word
    assert unit_file.path_list(f"[Service]\nReadOnlyPaths={word}\n", "ReadOnlyPaths") == [path]
    with pytest.raises(ServeError, match="one line"):
        path_setting(path + "\nUser=root", "model folder")
    with pytest.raises(ServeError, match="absolute"):
        path_setting("relative", "model folder")


def test_exec_start_argument_with_a_newline_refused():
    with pytest.raises(ServeError, match="newline"):
        systemd_quote("--served-model-name=x\nExecStartPre=+/bin/sh")


def test_traffic_allowed_only_with_loopback_and_the_configured_networks():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import allowed_networks

    assert allowed_networks("127.0.0.1", []) == ["localhost"]
    assert allowed_networks("0.0.0.0", ["10.0.0.0/16", "fd00::/64 "]) == ["localhost", "10.0.0.0/16", "fd00::/64"]
    assert allowed_networks("0.0.0.0", ["10.0.0.7/16"]) == ["localhost", "10.0.0.0/16"]
    with pytest.raises(ServeError, match="vllm_service_allowed_networks is empty"):
        allowed_networks("0.0.0.0", [])
    for bad in ("banana", "10.0.0.0/40", "10.0.0.0/16\nUser=root", 5):
        with pytest.raises(ServeError, match="vllm_service_allowed_networks"):
            allowed_networks("0.0.0.0", [bad])


@pytest.mark.parametrize(("port", "ok"), [(0, False), (1, True), (65535, True), (65536, False), (True, False)])
def test_port_edges(port, ok):
    args = dict(python="p", model_dir="/m", profile=KIMI, plan=PLAN, host="127.0.0.1", port=port, revision=REV,
                gpu_count=8)
    if ok:
        argv = server_argv(**args)
        assert argv[argv.index("--port") + 1] == str(port)
    else:
        with pytest.raises(ServeError, match="not a TCP port"):
            server_argv(**args)


def test_expert_parallel_and_extra_args_extend_the_command_not_replace_it():
    mm = load_profile("minimax-m2.5-fp8", str(ROOT / "profiles"))
    mm = dict(mm, vllm=dict(mm["vllm"], extra_args=["--max-num-seqs", "64"]))
    argv = server_argv(python="p", model_dir="/m", profile=mm, plan={"tensor_parallel_size": 8,
                       "expert_parallel": True}, host="127.0.0.1", port=8000, revision=REV, gpu_count=8)
    assert argv[0] == "p" and "--model" in argv and "--enable-expert-parallel" in argv
    assert argv[-2:] == ["--max-num-seqs", "64"]

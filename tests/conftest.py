"""Shared fixtures: the tiny model, the local hub server and vLLM CPU (the collection's pure logic is imported
as ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.*, through the editable install).
Harness servers are real processes on loopback, started once per session and ended by PID."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = ROOT / "tests" / "fixtures"


def run_local_play(play: Path, popen: bool = False):
    """ansible-playbook on this machine (local connection, this Python, the project's ansible.cfg): its completed
    process, or with popen the running one (output in .stdout, stderr with it)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(play),
           "-e", f"ansible_python_interpreter={sys.executable}"]
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)


def ansible_module(name: str, args: dict, check=False, popen=False, extra_env: dict | None = None):
    """One of the collection's modules run by `ansible localhost` (local connection, this Python, the project's
    ansible.cfg, the JSON callback): (rc, the module's result, the whole output); with popen, the process."""
    import json

    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", HF_HUB_DISABLE_TELEMETRY="1", **(extra_env or {}))
    env.pop("HF_TOKEN", None)
    cmd = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", f"modelfleet.fleet.{name}",
           "-a", json.dumps(args),
           "-e", f"ansible_python_interpreter={sys.executable}"] + (["--check"] if check else [])
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    res = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return r.returncode, res, r.stdout + r.stderr


def property_examples(n: int) -> int:
    """A property test's example count, scaled by MODELFLEET_PROPERTY_SCALE (scripts/mutation.sh runs each
    mutant with a fraction of them; every other run uses n)."""
    scale = float(os.environ.get("MODELFLEET_PROPERTY_SCALE") or 1)
    return max(10, int(n * scale))


@contextlib.contextmanager
def lo_addresses(*addresses: str):
    """Add addresses of the documentation range to `lo` for a test (a group's members must have non-loopback
    addresses) and remove them after; skips without root. Each address is held under an exclusive file lock for
    the test's length, so two tests that use the same address (on two xdist workers) take turns instead of one
    failing on the other's `ip addr add` ("File exists") or losing its address when the other removes it; an
    address left on `lo` by a killed run is taken over (`ip addr replace`)."""
    import fcntl
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("adding group addresses to lo needs root")
    with contextlib.ExitStack() as stack:
        for a in sorted(set(addresses)):  # one order for every test: two tests never wait on each other in a ring
            lock = stack.enter_context(open(Path(tempfile.gettempdir()) / f"modelfleet-lo-{a}.lock", "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        for a in addresses:
            subprocess.run(["ip", "addr", "replace", f"{a}/32", "dev", "lo"], check=True, capture_output=True)
            stack.callback(subprocess.run, ["ip", "addr", "del", f"{a}/32", "dev", "lo"], check=False,
                           capture_output=True)
        yield addresses


TINY_REPO = "modelfleet-test/tiny-llama"
TINY_REPO_B = "modelfleet-test/tiny-llama-b"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def kimi(tmp_path_factory) -> dict:
    """The facts of the shape-faithful Kimi-K2.5 INT4 checkpoint (64 sparse shards), as inspect_local reads them."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import inspect_local

    from modelfleet.harness.synthetic import write_checkpoint

    d = tmp_path_factory.mktemp("kimi-facts")
    ck = FIXTURES / "checkpoints"
    write_checkpoint(ck / "kimi-k2.5-tensor-inventory.md", ck / "kimi-k2.5-config.json", d)
    return inspect_local(str(d))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from modelfleet.harness.tiny_model import build

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    build(out, seed=0, shards=3)
    return out


@pytest.fixture(scope="session")
def hub(tmp_path_factory, tiny_model):
    """The local hub server with two repos (A: seed 0, B: seed 1), each with two commits and tag v1."""
    from modelfleet.harness.hub_repo import publish
    from modelfleet.harness.servers import start_hub
    from modelfleet.harness.tiny_model import build

    base = tmp_path_factory.mktemp("hub")
    mirrors = base / "mirrors"
    b_model = base / "tiny-b"
    build(b_model, seed=1, shards=2, name="tiny-llama-b")
    repos = {TINY_REPO: publish(tiny_model, mirrors, TINY_REPO), TINY_REPO_B: publish(b_model, mirrors, TINY_REPO_B)}
    fail_file, rate_file, stall_file = base / "hub-down", base / "hub-rate", base / "hub-stall"
    latency_file = base / "hub-latency"
    srv = start_hub(mirrors, base, fail_file=str(fail_file), rate_file=str(rate_file), stall_file=str(stall_file),
                    latency_file=str(latency_file))
    srv.extra.update(repos=repos, mirrors=mirrors, fail_file=fail_file, rate_file=rate_file, stall_file=stall_file,
                     latency_file=latency_file)
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, tiny_model):
    from modelfleet.harness.servers import start_vllm

    logs = tmp_path_factory.mktemp("vllm")
    # Its start-up runs beside molecule/fleet's tail in scripts/test.sh, sharing the cores with that lane's
    # three serving containers (a cold compile there took over 300 s on a slow CI machine): the start-up's
    # time limit counts only once the machine is quiet.
    srv = start_vllm(tiny_model, "tiny-llama", logs, shared=_machine_shared)
    try:
        _wait_for_quiet_machine()
        yield srv
    finally:
        srv.stop()


def _machine_shared() -> bool:
    """True while scripts/test.sh still runs other work beside the exclusive tests (its quiet file is not written
    yet and the script is alive)."""
    flag, pid = os.environ.get("MODELFLEET_QUIET_FILE"), os.environ.get("MODELFLEET_QUIET_PID")
    if not flag or os.path.exists(flag):
        return False
    if pid:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
    return True


def _wait_for_quiet_machine() -> None:
    """scripts/test.sh starts the exclusive tests' server while molecule/fleet still runs (its start-up uses
    the core the other lane left idle) and names a file it writes once nothing else runs
    (MODELFLEET_QUIET_FILE), and its own PID (MODELFLEET_QUIET_PID): nothing is measured before the file
    exists; if that script is gone, the file never comes and the tests stop here instead of waiting forever."""
    flag, pid = os.environ.get("MODELFLEET_QUIET_FILE"), os.environ.get("MODELFLEET_QUIET_PID")
    if not flag:
        return
    import time

    while not os.path.exists(flag):
        if pid:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                pytest.fail(f"waited for {flag} (the machine quiet) but scripts/test.sh (pid {pid}) is gone")
        time.sleep(1)


def exclusive_problems(items) -> list[str]:
    """The tests that use the shared vLLM server (`vllm_server`) without the `exclusive` mark: in the shared step
    they would start it beside every other test, where its start-up ran out of time (CI, 6c0ebca: a helper placed
    between a test and its decorators took the mark away)."""
    return [item.nodeid for item in items
            if "vllm_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("exclusive") is None]


def pytest_collection_modifyitems(config, items):
    problems = exclusive_problems(items)
    if problems:
        raise pytest.UsageError("these tests use the shared vLLM server (vllm_server) and are not marked "
                                f"@pytest.mark.exclusive: {', '.join(problems)}; mark them (scripts/test.sh runs "
                                "exclusive tests last, alone, with that server)")


BAD_INPUT_AREAS = {"test_cli": "CLI", "test_module": "modules run as modules", "test_fleet_file": "fleet files",
                   "test_profile": "profiles", "test_unit_rendering": "unit rendering"}


def pytest_terminal_summary(terminalreporter):
    """The bad-input suite's cases per area and outcome (issue 19), also under pytest-xdist."""
    counts: dict = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if "test_bad_input.py::" not in nodeid or getattr(rep, "when", "call") not in ("call", "setup"):
                continue
            if rep.when == "setup" and outcome == "passed":
                continue
            func = nodeid.split("::", 1)[1].split("[", 1)[0]
            area = BAD_INPUT_AREAS.get(func, func)
            counts.setdefault(area, {}).setdefault(outcome, 0)
            counts[area][outcome] += 1
    if counts:
        total = sum(sum(v.values()) for v in counts.values())
        terminalreporter.write_sep("-", f"bad-input suite: {total} cases")
        for area, by in sorted(counts.items()):
            terminalreporter.write_line(f"  {area:24s} " + ", ".join(f"{n} {o}" for o, n in sorted(by.items())))

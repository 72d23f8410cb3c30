"""The fleet after: check mode on the fresh fleet (nothing), deploy tiny-llama-b, an unchanged re-run
(the fast path), the fleet file (two-models.fleet.yml: fleet-1 and fleet-2 swap to tiny-llama, fleet-3 keeps
tiny-llama-b; waves canary -> rest one host at a time), the same with the fast path off (every step, nothing
changed), a wave that fails after the canary (broken-wave.fleet.yml: the waves after it never start), a
service stopped by hand on fleet-3 and a re-run (fleet-1/2 skip, fleet-3 repaired), group llama switched to
tiny-llama-b under load through its endpoint (model-switch.fleet.yml), and a broken profile on the canary
(rollout stopped, canary rolled back to tiny-llama-b, the other hosts untouched)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

PORTS = {"fleet-1": 18501, "fleet-2": 18502, "fleet-3": 18503}
# what each host serves at the end: tiny-llama-b everywhere (model-switch.fleet.yml; the canary's broken deploy
# rolled back), and the model name of its group's endpoint (the group's name), which every replica answers to
SERVES = {"fleet-1": "tiny-llama-b", "fleet-2": "tiny-llama-b", "fleet-3": "tiny-llama-b"}
ENDPOINT_MODEL = {"fleet-1": "llama", "fleet-2": "llama", "fleet-3": "llama_b"}
LLAMA = "modelfleet-vllm@tiny-llama.service"
LLAMA_B = "modelfleet-vllm@tiny-llama-b.service"
EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")
# check, converge, idempotence, fleet file, its full re-run, the broken wave, drift re-run, the model switch,
# newline (refused after the preflight's inspection), broken: each run's preflight reads each profile's small
# files once on the controller
DEPLOY_RUNS = 10


def _figure(text):
    """A figure the verifier measured: printed, and kept in .cache/molecule-fleet-figures.txt, which
    scripts/test.sh prints in the scenario's report (pytest shows a passed test's output nowhere)."""
    print(text)
    folder = os.path.join(os.environ.get("MOLECULE_PROJECT_DIRECTORY", "."), ".cache")
    if os.path.isdir(folder):
        with open(os.path.join(folder, "molecule-fleet-figures.txt"), "a") as f:
            f.write(text + "\n")


def _name(host):
    return host.backend.get_hostname()


def _served(host):
    return SERVES[_name(host)]


def _other(host, name):
    """Another host of the scenario, reached the way `host` is."""
    return host.get_host(f"ansible://{name}", ansible_inventory=host.backend.ansible_inventory
                         or os.environ.get("MOLECULE_INVENTORY_FILE"))


def _unit(host):
    return f"modelfleet-vllm@{_served(host)}.service"


def _names(host):
    """What the host's server lists in /v1/models: its profile's name first, then its endpoint's model name."""
    return [_served(host), ENDPOINT_MODEL[_name(host)]]


def _models(host, timeout=600):
    port = PORTS[_name(host)]
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        out = host.run(f"curl -fsS http://127.0.0.1:{port}/v1/models")
        if out.rc == 0:
            return [m["id"] for m in json.loads(out.stdout)["data"]]
        time.sleep(3)
    raise AssertionError(f"{_name(host)}: no server on {port} after {timeout} s")


def test_check_mode_on_the_fresh_fleet_changed_nothing(host):
    """What a deploy creates (venv, model folders, units) is the same before and after the check-mode run: the
    serving image already holds the vLLM venv; no model and no unit exist on the fresh fleet."""
    before = host.file("/root/before_check_mode.txt").content_string.strip()
    assert host.file("/root/after_check_mode.txt").content_string.strip() == before
    assert before in ("", "/opt/modelfleet/vllm"), before


def test_every_host_serves_its_groups_model_after_the_fleet_file_and_the_failed_rollouts(host):
    assert _models(host) == _names(host)
    assert host.service(_unit(host)).is_running
    assert not host.service(LLAMA).is_running


def test_no_unit_carries_the_broken_argument(host):
    out = host.run("grep -l -- --no-such-vllm-flag /etc/systemd/system/modelfleet-vllm@*.service")
    assert out.stdout.strip() == ""


def test_each_model_is_complete_on_the_hosts_that_served_it_and_nowhere_else(host):
    # tiny-llama-b everywhere (the first deploy); tiny-llama only where the fleet file served it (kept after the
    # switch back: the fallback is not deleted)
    for repo, where in (("modelfleet-test--tiny-llama", ("fleet-1", "fleet-2")),
                        ("modelfleet-test--tiny-llama-b", tuple(PORTS))):
        out = host.run(f"ls -d /models/{repo}/*/.modelfleet/complete")
        assert (out.rc == 0) == (_name(host) in where), f"{_name(host)}: {repo} {out.rc}"


def test_every_file_on_every_host_matches_the_lock_and_came_host_to_host(host):
    """Peer distribution (issue 23): every file of every complete model hashes to its lock entry on every host;
    the hosts that received a model got it host to host - tiny-llama-b, which both other hosts received in the
    first deploy, in a chain: one from the origin fleet-1, the other from that one (which one is first follows the
    play's host order) - and no transfer key is left on any host."""
    name = _name(host)
    for repo in ("modelfleet-test--tiny-llama", "modelfleet-test--tiny-llama-b"):
        out = host.run(f"ls -d /models/{repo}/*/.modelfleet/complete")
        if out.rc != 0:
            continue
        final = out.stdout.strip().rsplit("/.modelfleet/", 1)[0]
        lock = json.loads(host.file(f"{final}/.modelfleet/lock.json").content_string)
        for f in lock["files"]:
            path = f"{final}/{f['name']}"
            if f.get("sha256"):
                got, want = host.run(f"sha256sum {path}").stdout.split()[0], f["sha256"]
            else:  # a small git file: its blob id, sha1 of "blob <size>\0" + the bytes, as git computes it
                blob = f"{{ printf 'blob %d\\0' $(stat -c %s {path}); cat {path}; }} | sha1sum"
                got = host.run(blob).stdout.split()[0]
                want = f["blob_id"]
            assert got == want, (name, f["name"], got, want)
        status = json.loads(host.file(f"/models/.status/{repo}@{lock['revision']}.json").content_string)
        if name == "fleet-1":  # the canary took both models from the hub
            assert status.get("via") != "peer", status
        else:
            assert status["via"] == "peer" and status["state"] == "complete", status
            assert status["dropped"] == [] and len(status["sources"]) == 1, (name, repo, status)
            assert status["sources"][0] in PORTS and status["sources"][0] != name, (name, repo, status)
            if repo.endswith("-b"):
                other = ({"fleet-2", "fleet-3"} - {name}).pop()
                theirs = json.loads(_other(host, other).file(
                    f"/models/.status/{repo}@{lock['revision']}.json").content_string)["sources"]
                chain = {name: status["sources"], other: theirs}
                assert chain in ({"fleet-2": ["fleet-1"], "fleet-3": ["fleet-2"]},
                                 {"fleet-3": ["fleet-1"], "fleet-2": ["fleet-3"]}), chain
    keys = host.run("cat /var/lib/modelfleet-peer/.ssh/authorized_keys 2>/dev/null").stdout
    assert "ssh-ed25519" not in keys and "modelfleet peer" not in keys, keys
    assert host.run("find /run/modelfleet-peer -type f 2>/dev/null").stdout.strip() == ""


def _plain(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_rollout_stopped_at_the_canary():
    raw = _plain(open(os.path.join(EPHEMERAL, "broken.out")).read())
    out = " ".join(raw.split())  # the YAML callback wraps long messages
    assert "did not become ready" in out and "rolled back" in out
    # the canary play was the only one with hosts left, so ansible-playbook ends there; had a later play
    # run, its gate would have failed every other host with this message before touching it
    assert "PLAY [Distribute" not in out or "rollout stopped: the canary wave (fleet-1) did not pass" in out
    # the failure names the wave (a plain inventory: the canary group, then the rest)
    assert "rollout stopped in wave canary (wave 1 of 2, batch 1 of 1): fleet-1 (tiny-llama) failed" in out
    recap = {line.split()[0]: line for line in raw.splitlines() if line.startswith("fleet-")}
    for h in ("fleet-2", "fleet-3"):
        assert h not in recap or "changed=0" in recap[h], recap[h]
    assert "failed=1" in recap["fleet-1"]


def test_other_hosts_untouched_by_the_broken_deploy(host):
    if _name(host) == "fleet-1":
        return
    # their tiny-llama-b server never restarted
    assert host.file(f"/etc/systemd/system/{LLAMA_B}").exists
    restarts = host.run(f"systemctl show -p NRestarts --value {_unit(host)}").stdout.strip()
    assert restarts == "0"


def test_hub_sent_one_copy_per_model_for_three_hosts(host):
    if _name(host) != "fleet-1":
        return
    endpoint = open(os.path.join(EPHEMERAL, "hub", "endpoint")).read().strip()
    stats = json.loads(urllib.request.urlopen(endpoint + "/_modelfleet/stats").read())
    weights = small = whole_weights = whole_small = 0
    for repo in ("modelfleet-test--tiny-llama", "modelfleet-test--tiny-llama-b"):
        lock = json.loads(host.run(f"cat /models/{repo}/*/.modelfleet/lock.json").stdout)
        prefix = f"/{lock['repo_id']}/resolve/{lock['revision']}/"
        for f in lock["files"]:
            whole = stats["whole_by_path"].get(prefix + f["name"], 0)
            if f["name"].endswith(".safetensors"):
                # the weights went out whole exactly once for three hosts (three copies would be 3x)
                assert whole == f["size"], (f["name"], whole, f["size"])
                weights, whole_weights = weights + f["size"], whole_weights + whole
            else:
                small, whole_small = small + f["size"], whole_small + whole
    # the rest: small files (config.json ...) the controller's preflight reads once per deploy run, never per
    # host, and the header-only Range reads (206) of the inspection, counted apart
    assert whole_small <= DEPLOY_RUNS * small, (whole_small, small)
    assert stats["bytes_served"] - stats["ranged_bytes"] < whole_weights + DEPLOY_RUNS * small + 65536, stats


def test_benchmark_reports_written(host):
    out = host.run("ls /var/lib/modelfleet/bench/done/")
    assert "tiny-llama-b@" in out.stdout
    assert ("tiny-llama@" in out.stdout) == (ENDPOINT_MODEL[_name(host)] == "llama"), out.stdout


def _recap(raw):
    return {line.split()[0]: line for line in raw.splitlines() if line.startswith("fleet-")}


def _said(out, host, start):
    """The messages a debug task printed for `host` that begin with `start` (YAML callback, wrapped)."""
    return re.findall(r"\[" + host + r"\] => msg: [>|\-'\" ]*(" + start + r"[^\[]*)", out)


def _cli_run():
    """The run folder of the side effect's `modelfleet deploy`: the one its own last line names ("run <id>: ...
    artifacts: <folder>"), which must be in the state folder the side effect gave it."""
    out = _plain(open(os.path.join(EPHEMERAL, "fleet_file.out")).read())
    m = re.search(r"^run (\S+): \S+, rc=\d+, [0-9.]+ s; artifacts: (\S+)$", out, re.M)
    assert m, out[-2000:]
    run_id, run_dir = m.groups()
    runs = os.path.join(EPHEMERAL, "state-fleet-file", "runs")
    assert os.path.dirname(run_dir) == runs and run_id in os.listdir(runs), (run_dir, os.listdir(runs))
    return run_dir, run_id


def _batches(run_dir, run_id):
    """[(play, hosts)] in the order they ran, from ansible-runner's events alone: Ansible starts a play again for
    each batch of its serial (one play-start event per batch), and the hosts of a batch are those with task
    results before the next play start."""
    folder = os.path.join(run_dir, "artifacts", run_id, "job_events")
    events = sorted((json.load(open(os.path.join(folder, f))) for f in os.listdir(folder) if f.endswith(".json")),
                    key=lambda e: e["counter"])
    batches = []
    for e in events:
        data = e.get("event_data", {})
        if e["event"] == "playbook_on_play_start":
            batches.append((data.get("play", ""), []))
        elif e["event"].startswith("runner_on_") and batches and data.get("host") not in batches[-1][1]:
            batches[-1][1].append(data.get("host"))
    return batches


def test_the_cli_deploy_ran_the_declared_batches_in_order_and_size():
    """Issue 21: `modelfleet deploy` with no profile named; the run's own events show the canary (fleet-1), then
    the rest wave one host at a time in the file's order (fleet-3, then fleet-2)."""
    batches = _batches(*_cli_run())
    waves = [(play.split(" - ")[0], sorted(hosts)) for play, hosts in batches
             if play.startswith(("Canary wave", "Switch"))]
    assert waves == [("Canary wave", ["fleet-1"]), ("Switch", ["fleet-3"]), ("Switch", ["fleet-2"])], batches


def test_the_fleet_file_converged_both_groups_in_its_declared_waves():
    """Issue 21: one deploy with no profile named; the plan printed first (by the CLI), then the batches in the
    file's order and size (canary, then fleet-3 alone, then fleet-2 alone); each host its group's model (checked
    on the hosts above), the hub one copy of each (test_hub_sent_one_copy_per_model_for_three_hosts)."""
    cli = " ".join(_plain(open(os.path.join(EPHEMERAL, "fleet_file.out")).read()).split())
    plan = cli.index("== rollout plan ==")
    for line in ("wave 1 canary (canary): 1 host(s), all at once, max 0% failed per batch",
                 "batch 1: fleet-1 (tiny-llama)", "wave 2 rest: 2 host(s), serial 1, max 0% failed per batch",
                 "batch 1: fleet-3 (tiny-llama-b)", "batch 2: fleet-2 (tiny-llama)"):
        assert cli.index(line, plan) > plan, line
    assert "== deploy summary ==" in cli
    run_dir, run_id = _cli_run()
    raw = _plain(open(os.path.join(run_dir, "artifacts", run_id, "stdout")).read())
    out = " ".join(raw.split())
    first = out.index("wave rest (2 of 2), batch 1 of 2: fleet-3")
    second = out.index("wave rest (2 of 2), batch 2 of 2: fleet-2")
    assert first < second
    # the canary's play ran before both batches; nothing was named on the command line
    assert out.index("PLAY [Canary wave") < first and "modelfleet_profile_name" not in out
    recap = _recap(raw)
    assert sorted(recap) == ["fleet-1", "fleet-2", "fleet-3"]
    for h in PORTS:
        assert "failed=0" in recap[h] and "unreachable=0" in recap[h], recap[h]
    # fleet-1 and fleet-2 swapped (full path); fleet-3 was already serving its group's model
    for h in ("fleet-1", "fleet-2"):
        assert _said(out, h, "full path:"), h


def test_a_failed_wave_stopped_the_waves_after_it_and_named_itself():
    """broken-wave.fleet.yml: the canary passes (up to date), fleet-3's wave fails before its unit changes,
    fleet-2's wave never starts."""
    raw = _plain(open(os.path.join(EPHEMERAL, "broken_wave.out")).read())
    out = " ".join(raw.split())
    assert ("rollout stopped in wave llama-b (wave 2 of 3, batch 1 of 1): fleet-3 (tiny-llama-b) failed; the "
            "batches and waves after it were not started") in out, out[-3000:]
    assert "0.31.9" in out  # the reason: the vLLM version asked for is outside the profile's range
    assert _said(out, "fleet-1", "up to date: tiny-llama at")
    assert "wave llama-b (2 of 3), batch 1 of 1: fleet-3" in out
    assert "wave llama-rest (3 of 3)" not in out  # no batch of the wave after it ran
    recap = _recap(raw)
    assert "failed=1" in recap["fleet-3"] and "failed=0" in recap["fleet-2"] and "changed=0" in recap["fleet-2"]


def test_full_rerun_with_the_fast_path_off_ran_every_step_and_changed_nothing():
    raw = _plain(open(os.path.join(EPHEMERAL, "full_rerun.out")).read())
    out = " ".join(raw.split())
    assert "TASK [modelfleet.fleet.nvidia_env : " in out
    assert "TASK [modelfleet.fleet.vllm_service : Wait for readiness" in out
    for h in PORTS:
        assert "changed=0" in _recap(raw)[h] and "failed=0" in _recap(raw)[h], _recap(raw)[h]
        assert _said(out, h, "full path: modelfleet_fast_path is off"), h
        assert not _said(out, h, "up to date")


def test_drift_rerun_skipped_the_current_hosts_and_repaired_fleet_3():
    raw = _plain(open(os.path.join(EPHEMERAL, "drift_rerun.out")).read())
    out = " ".join(raw.split())
    recap = _recap(raw)
    for h in ("fleet-1", "fleet-2"):
        assert _said(out, h, "up to date: tiny-llama at"), h
        assert "changed=0" in recap[h] and "failed=0" in recap[h], recap[h]
    why = _said(out, "fleet-3", "full path:")
    assert why and "modelfleet-vllm@tiny-llama-b.service is not active" in why[0], why
    assert "failed=0" in recap["fleet-3"] and "changed=0" not in recap["fleet-3"], recap["fleet-3"]


def test_a_rolling_switch_to_another_model_under_load_through_the_endpoint_lost_no_request():
    """Issue 25: both replicas of group llama switched from tiny-llama to tiny-llama-b (model-switch.fleet.yml), one
    at a time, each drained from the endpoint first and put back after ready, under 2 requests a second through
    the endpoint that name its model (llama): none failed. The endpoint's configuration stayed as it was (its
    checks ask for llama, which both models answer to); fleet-3's group was left alone."""
    raw = _plain(open(os.path.join(EPHEMERAL, "rolling.out")).read())
    out = " ".join(raw.split())
    recap = _recap(raw)
    for h in ("fleet-1", "fleet-2"):
        assert "failed=0" in recap[h] and "changed=0" not in recap[h], recap[h]
        assert _said(out, h, "full path:"), h
        said = _said(out, h, "drained from endpoint llama on fleet-1: idle after")
        assert said and "back in the endpoint after" in said[0], (h, said)
    assert _said(out, "fleet-3", "up to date: tiny-llama-b at") and "failed=0" in recap["fleet-3"], recap["fleet-3"]
    assert "endpoint not changed" not in out  # every replica served: the endpoint role ran ...
    assert re.search(r"TASK \[modelfleet\.fleet\.fleet_endpoint : Write the configuration[^\]]*\] [*]* ok: "
                     r"\[fleet-1\]", out), "the endpoint's configuration changed"  # ... and found nothing to change
    hours, minutes, seconds = re.findall(r"seconds (\d+):(\d+):([\d.]+)", raw)[-1]  # the command's delta
    switch_s = 3600 * int(hours) + 60 * int(minutes) + float(seconds)
    reports = json.loads(re.search(r"\{.*\}", open(os.path.join(EPHEMERAL, "rolling-load.out")).read(),
                                   re.S).group(0))["reports"]
    (point,) = json.load(open(reports["json"]))["points"]
    _figure(f"rolling switch of 2 replicas to another model in {switch_s:.0f} s under load through the endpoint: "
            f"{point['sent']} "
          f"requests sent, {point['completed']} completed, {point['failed']} failed")
    assert point["failed"] == 0 and point["completed"] == point["sent"], point.get("errors")
    assert point["sent"] >= switch_s * 2 * 0.7, (point["sent"], switch_s)  # the load lasted the whole switch


def test_a_unit_value_with_a_newline_was_refused_before_anything_was_written(host):
    """Issue 19: an environment value with a newline (which would have added User=root and an ExecStartPre to
    the unit) fails the controller's preflight by name; no play reaches a host, no unit file holds it."""
    raw = _plain(open(os.path.join(EPHEMERAL, "newline.out")).read())
    out = " ".join(raw.split())
    assert "INJECTED contains a newline" in out, out[-2000:]
    assert "PLAY [Canary wave" not in out and "PLAY [Switch" not in out
    assert "changed=" not in "".join(v for k, v in _recap(raw).items()) or all(
        "changed=0" in v for v in _recap(raw).values())
    assert host.run("grep -rl INJECTED /etc/systemd/system /etc/modelfleet").stdout.strip() == ""


def test_deploy_record_is_root_only_and_matches_the_unit(host):
    record = f"/var/lib/modelfleet/deployed/{_served(host)}.json"
    rec_file = host.file(record)
    assert rec_file.exists and rec_file.user == "root" and rec_file.mode == 0o600
    assert host.file(os.path.dirname(record)).mode == 0o700
    rec = json.loads(rec_file.content_string)
    assert re.fullmatch(r"[0-9a-f]{64}", rec["inputs_digest"])
    assert rec["unit"] == _unit(host) and rec["url"].endswith(f":{PORTS[_name(host)]}")
    unit_bytes = host.file(f"/etc/systemd/system/{_unit(host)}").content
    assert rec["unit_sha256"] == hashlib.sha256(unit_bytes).hexdigest()
    # only the digest of the inputs is kept: no profile, no variables (they may hold a token)
    assert "variables" not in rec_file.content_string and "hf_fetch_endpoint" not in rec_file.content_string


# --- carried over from molecule/vllm_service (the role's own checks, now on the fleet's hosts) ---

def _url(host):
    return f"http://127.0.0.1:{PORTS[_name(host)]}"


def _complete(host):
    body = json.dumps({"model": _served(host), "prompt": "the fleet", "max_tokens": 5})
    out = host.run(f"curl -fsS {_url(host)}/v1/completions -H 'Content-Type: application/json' -d '{body}'")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def test_runs_as_the_service_user_and_listens_on_loopback(host):
    assert _models(host) == _names(host)
    pid = host.run(f"systemctl show -p MainPID --value {_unit(host)}").stdout.strip()
    assert host.process.get(pid=int(pid)).user == "modelfleet-vllm"
    assert host.socket(f"tcp://127.0.0.1:{PORTS[_name(host)]}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORTS[_name(host)]}").is_listening
    env = host.file(f"/etc/modelfleet/{_served(host)}.env")
    assert env.mode == 0o600 and env.user == "root"
    assert "HF_TOKEN" not in env.content_string  # the server runs offline: no hub credential (issue 19)


def test_hardening_exposure(host):
    out = host.run(f"systemd-analyze security {_unit(host)}").stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    _figure(f"{_name(host)}: systemd-analyze security exposure of the live unit: {exposure}")
    assert exposure <= 4.0


def test_every_cache_of_the_live_unit_is_in_its_writable_folder(host):
    """Issue 27 on a real systemd: the unit's environment puts every cache under its ReadWritePaths."""
    env = host.run(f"systemctl show -p Environment --value {_unit(host)}").stdout.split()
    rw = host.run(f"systemctl show -p ReadWritePaths --value {_unit(host)}").stdout.split()
    cache = f"/var/cache/modelfleet/vllm/{_served(host)}"
    assert rw == [cache], rw
    got = dict(e.split("=", 1) for e in env)
    for name in ("HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT",
                 "CUDA_CACHE_PATH", "FLASHINFER_WORKSPACE_BASE"):
        assert got[name] == cache or got[name].startswith(cache + "/"), (name, got.get(name))


def test_the_next_waves_started_with_the_canarys_compile_caches(host):
    """The canary's compile caches travelled to the hosts that serve the same thing (same vLLM, model and
    arguments less the listener) and were unpacked only because the key was the host's own: tiny-llama's from
    the fleet file's canary, tiny-llama-b's (fleet-3) from the first deploy's."""
    cache = f"/var/cache/modelfleet/vllm/{_served(host)}"
    key = host.file(f"{cache}/.modelfleet-compile-key").content_string.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", key), key
    origin = host.file(f"{cache}/.modelfleet-compile-origin")
    assert origin.exists and origin.content_string.split() == ["fleet-1", key]
    # compiled code travelled (inductor's cache); the unit serves with it
    assert host.file(f"{cache}/torchinductor").is_directory
    if _name(host) == "fleet-1":
        assert host.file(f"/var/lib/modelfleet/compile-cache/{key}.tar.gz").is_file
        assert os.path.exists(os.path.join(EPHEMERAL, "compile-cache", f"{key}.tar.gz"))


def test_real_completion(host):
    assert _models(host) == _names(host)
    r = _complete(host)
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["text"]


def test_benchmark_role_wrote_results_and_reports(host):
    from pathlib import Path

    outcome = json.loads(host.run(f"cat /var/lib/modelfleet/bench/done/{_served(host)}@*.json").stdout)
    assert outcome["levels"] == [1, 2]
    assert [p["max_concurrency"] for p in outcome["points"]] == [1, 2]
    for p in outcome["points"]:
        assert p["output_throughput"] > 0
        if p["valid"]:
            assert p["reconcile_diff"] <= 0.02
    # Three servers and their clients share two cores here: a client that finds itself starved marks its
    # point invalid with the reason (the benchmark client's figures are checked alone on the machine by
    # tests/integration/test_bench_vllm.py). The headline never counts an invalid point.
    single = next(p for p in outcome["points"] if p["max_concurrency"] == 1)
    if single["valid"]:
        assert outcome["headline"]["single_stream_output_tok_s"] == pytest.approx(single["output_throughput"], abs=0.01)
        assert single["output_throughput"] > 0
    else:
        assert single["invalid_reasons"] and outcome["headline"]["single_stream_output_tok_s"] is None
        assert "single stream not measured" in outcome["headline_text"]
    valid = [p["output_throughput"] for p in outcome["points"] if p["valid"]]
    assert outcome["headline"]["peak_output_tok_s"] == (pytest.approx(max(valid), abs=0.01) if valid else None)
    on_host = json.loads(host.file(outcome["host_result"]).content_string)
    assert on_host["provenance"]["unit"] == _unit(host) and on_host["provenance"]["vllm_version"].startswith("vllm")
    assert on_host["provenance"]["server_environment"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_API_KEY" not in on_host["provenance"]["server_environment"]
    reports = Path(EPHEMERAL) / "bench"
    name = f"{_name(host)}--{_served(host)}"
    for ext in ("json", "csv", "png", "html"):
        assert (reports / f"{name}.{ext}").stat().st_size > 200, ext
    assert name in (reports / "comparison.md").read_text()


def test_swap_stopped_the_first_model_before_starting_the_second(host):
    """The MiniMax -> Kimi shape, both ways on fleet-2 (fleet-1 rolled back and is killed below; fleet-3 never
    swapped): tiny-llama-b was stopped before tiny-llama started on the same port (the fleet file), and tiny-llama
    was stopped before tiny-llama-b started again (the model switch)."""
    if _name(host) != "fleet-2":
        return

    def mono(unit, prop):
        return int(host.run(f"systemctl show -p {prop} --value {unit}").stdout.strip() or 0)

    b_stopped = mono(LLAMA_B, "InactiveEnterTimestampMonotonic")
    a_started = mono(LLAMA, "ExecMainStartTimestampMonotonic")
    a_stopped = mono(LLAMA, "InactiveEnterTimestampMonotonic")
    b_started = mono(LLAMA_B, "ExecMainStartTimestampMonotonic")
    assert 0 < b_stopped <= a_started < a_stopped <= b_started, (b_stopped, a_started, a_stopped, b_started)
    assert not host.service(LLAMA).is_running and host.service(LLAMA_B).is_running


def test_the_canary_rollback_says_why_and_serves_again(host):
    if _name(host) != "fleet-1":
        return
    raw = " ".join(_plain(open(os.path.join(EPHEMERAL, "broken.out")).read()).split())
    assert "no-such-vllm-flag" in raw or "unrecognized arguments" in raw  # the journal says why
    # judged at its first exit, not after Restart= had repeated it up to the start limit
    assert "the server exited before it was ready" in raw and "allowed before ready: 0" in raw
    assert "--no-such-vllm-flag" not in host.file(f"/etc/systemd/system/{LLAMA}").content_string
    # the swap rolled back: the model it served before, under both its names
    assert _models(host) == _names(host) and host.service(_unit(host)).is_running


# the fleet file's endpoints (issue 25), both on fleet-1: port, the model name its clients use, the replicas
ENDPOINTS = {"llama": (18600, "llama", {"fleet-1", "fleet-2"}), "llama_b": (18601, "llama_b", {"fleet-3"})}
_SHOW_STAT = """python3 - <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("/run/modelfleet-endpoint/admin.sock")
s.sendall(b"show stat\\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
sys.stdout.write(data.decode())
EOF"""


def _endpoint_states(balancer):
    """The balancer's own view of each replica (HAProxy's show stat on its admin socket, on fleet-1)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import parse_stat

    out = balancer.run(_SHOW_STAT)
    assert out.rc == 0, out.stderr
    return {b: {r: v["status"] for r, v in servers.items()} for b, servers in parse_stat(out.stdout).items()}


def _through_endpoint(balancer, name):
    """One completion through an endpoint: (HTTP status, the replica that answered)."""
    port, served, _dummy = ENDPOINTS[name]
    body = json.dumps({"model": served, "prompt": "the fleet", "max_tokens": 3})
    out = balancer.run(f"curl -sS -m 60 -D - -o /dev/null -w 'status=%{{http_code}}' "
                       f"http://127.0.0.1:{port}/v1/completions -H 'Content-Type: application/json' -d '{body}'")
    replica = re.findall(r"(?im)^x-modelfleet-replica: (\S+)", out.stdout)
    return re.findall(r"status=(\d+)", out.stdout)[-1:] == ["200"], (replica or [None])[0]


def test_each_endpoint_serves_its_group_from_every_replica(host):
    """Issue 25: one address per group; every replica takes requests (joined by a passed real-completion check)."""
    if _name(host) != "fleet-1":
        return
    assert host.service("modelfleet-endpoint.service").is_running
    cfg = host.file("/etc/modelfleet/endpoint/haproxy.cfg")
    assert cfg.mode == 0o600 and cfg.user == "root"
    want = {name: {r: "UP" for r in replicas} for name, (_port, _served, replicas) in ENDPOINTS.items()}
    # membership follows readiness with the checks' lag: a replica restarted last (the canary's rollback, just
    # before) joins after its next passed check (every 10 s, each up to 20 s on this loaded machine)
    deadline = time.monotonic() + 120
    while _endpoint_states(host) != want and time.monotonic() < deadline:
        time.sleep(2)
    assert _endpoint_states(host) == want
    for name, (_port, _served, replicas) in ENDPOINTS.items():
        answers = [_through_endpoint(host, name) for _ in range(6)]
        assert all(ok for ok, _r in answers) and {r for _ok, r in answers} == replicas, (name, answers)


def _start_load(name, port, served, seconds):
    """`modelfleet bench` on the controller through an endpoint: 2 requests a second, open loop, until the stop
    file appears (or `seconds` have passed); (process, stop file, output file)."""
    stop, out = os.path.join(EPHEMERAL, f"{name}.stop"), os.path.join(EPHEMERAL, f"{name}-load.out")
    if os.path.exists(stop):
        os.remove(stop)
    exe = shutil.which("modelfleet") or os.path.join(os.path.dirname(sys.executable), "modelfleet")
    argv = [exe, "bench", "--url", f"http://127.0.0.1:{port}", "--model", served, "--request-rate", "2",
            "--levels", "8", "--per-level", str(int(seconds * 2)), "--input-len", "16", "--output-len", "8",
            "--warmup", "0", "--stop-file", stop, "--out", os.path.join(EPHEMERAL, f"{name}-load"),
            "--name", name, "--json"]
    return subprocess.Popen(argv, stdout=open(out, "w"), stderr=subprocess.STDOUT), stop, out


def _end_load(proc, stop, out):
    """Stop the load (the requests in flight finish); its one point: sent, completed, failed, errors."""
    open(stop, "w").write("done\n")
    proc.wait(180)
    text = open(out).read()
    found = re.search(r"\{.*\}", text, re.S)
    assert found, text[-2000:]
    (point,) = json.load(open(json.loads(found.group(0))["reports"]["json"]))["points"]
    return point


def test_kill_9_of_the_engine_under_load_recovers_by_itself_and_the_endpoint_counts_what_it_cost(host):
    """Last, and on the canary only (the other hosts' NRestarts are checked above to be 0). Issue 25: under 2
    requests a second through group llama's endpoint, kill -9 of fleet-1's vLLM: it leaves the endpoint at the
    first refused connection (within the 10-s check interval), the requests it held are counted - at most those
    it held at the kill (what had no answer started is sent again to fleet-2) - and fleet-2 carries the load
    alone for 10 s more. Then, without load (under it, the restart took 341 s on this harness: fleet-2's busy
    worker holds a core), systemd restarts fleet-1 and it joins the endpoint again and answers through it."""
    if _name(host) != "fleet-1":
        return
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import parse_stat

    assert _models(host) == _names(host)
    unit = _unit(host)
    port, served, _replicas = ENDPOINTS["llama"]
    pid = host.run(f"systemctl show -p MainPID --value {unit}").stdout.strip()
    before = int(host.run(f"systemctl show -p NRestarts --value {unit}").stdout.strip())
    load = _start_load("kill", port, served, 400)
    try:
        deadline = time.monotonic() + 120  # the load reaches both replicas
        while time.monotonic() < deadline and min(
                v["total"] for v in parse_stat(host.run(_SHOW_STAT).stdout)["llama"].values()) < 3:
            time.sleep(1)
        out = host.run(_SHOW_STAT + f"\nkill -9 {pid}")  # its requests in flight, read just before the kill
        t = time.monotonic()
        held = parse_stat(out.stdout)["llama"]["fleet-1"]["current"]
        while not _endpoint_states(host)["llama"]["fleet-1"].startswith("DOWN") and time.monotonic() - t < 60:
            time.sleep(0.2)
        left = time.monotonic() - t
        down = _endpoint_states(host)["llama"]["fleet-1"]
        time.sleep(10)  # the load goes on, all of it to fleet-2
    finally:
        point = _end_load(*load)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        new = host.run(f"systemctl show -p MainPID --value {unit}").stdout.strip()
        if new not in ("0", pid) and host.run(f"curl -fsS {_url(host)}/v1/models").rc == 0:
            break
        time.sleep(2)
    healthy = time.monotonic() - t
    deadline = time.monotonic() + 120
    while _endpoint_states(host)["llama"]["fleet-1"] != "UP" and time.monotonic() < deadline:
        time.sleep(1)
    back = time.monotonic() - t
    answers = [_through_endpoint(host, "llama") for _ in range(6)]
    _figure(f"kill -9 of fleet-1's engine under 2 req/s through endpoint llama: {point['sent']} requests sent, "
            f"{point['failed']} failed ({held} held by fleet-1 at the kill); left the endpoint after {left:.1f} s; "
            f"healthy again after {healthy:.0f} s and back in the endpoint after {back:.0f} s (without load)")
    assert down.startswith("DOWN") and left < 10, (down, left)  # the first refused connection took it out
    assert point["failed"] <= held and point["completed"] + point["failed"] == point["sent"], point.get("errors")
    assert all(ok for ok, _r in answers) and "fleet-1" in {r for _ok, r in answers}, answers  # it takes requests
    after = int(host.run(f"systemctl show -p NRestarts --value {unit}").stdout.strip())
    assert after == before + 1
    assert _complete(host)["usage"]["completion_tokens"] == 5


def test_every_host_runs_the_watchdog_for_its_served_unit(host):
    assert host.service("modelfleet-watchdog.timer").is_running
    desc = host.file(f"/etc/modelfleet/watchdog/{_served(host)}.json")
    assert desc.mode == 0o600 and desc.user == "root"
    assert json.loads(desc.content_string)["unit"] == _unit(host)


def test_the_watchdog_restarts_an_engine_that_stopped_generating_while_health_answers(host):
    """Last, and on fleet-2 only (fleet-1 is killed above): SIGSTOP of vLLM's engine process - /health still answers
    200 and the process never exits, so Restart= never fires; the watchdog's real completions time out, it restarts
    the unit, and the unit serves again."""
    if _name(host) != "fleet-2":
        return
    unit = _unit(host)
    assert _complete(host)["usage"]["completion_tokens"] == 5
    invocation = host.run(f"systemctl show -p InvocationID --value {unit}").stdout.strip()
    restarts = host.run(f"systemctl show -p NRestarts --value {unit}").stdout.strip()
    engine = host.run("pgrep -f '^VLLM::EngineCore'").stdout.split()
    assert len(engine) == 1, engine
    host.run(f"kill -STOP {engine[0]}")
    t = time.monotonic()
    health = host.run(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {_url(host)}/health").stdout
    hung = host.run(f"curl -sS -m 5 {_url(host)}/v1/completions -H 'Content-Type: application/json' "
                    f"-d '{json.dumps({'model': _served(host), 'prompt': 'x', 'max_tokens': 1})}'")
    assert health == "200" and hung.rc != 0  # what the watchdog exists for: healthy by /health, generating nothing
    # the endpoint's own check is a real completion too: fleet-2 leaves it, and its requests go to fleet-1
    balancer = _other(host, "fleet-1")
    deadline = time.monotonic() + 150
    # HAProxy says "UP 1/2" after one failed check of two, "DOWN" once it takes no more requests
    while not _endpoint_states(balancer)["llama"]["fleet-2"].startswith("DOWN") and time.monotonic() < deadline:
        time.sleep(1)
    left = time.monotonic() - t
    states = _endpoint_states(balancer)["llama"]
    assert states["fleet-2"].startswith("DOWN") and states["fleet-1"] == "UP", ("fleet-2 did not leave", states)
    answers = [_through_endpoint(balancer, "llama") for _ in range(4)]
    assert answers == [(True, "fleet-1")] * 4, answers
    deadline = time.monotonic() + 300  # up to 10 + 30 + 10 + 30 s to notice, then the stop
    while time.monotonic() < deadline:
        now = host.run(f"systemctl show -p InvocationID --value {unit}").stdout.strip()
        if now and now != invocation:
            break
        time.sleep(2)
    noticed = time.monotonic() - t
    assert now != invocation, ("the watchdog did not restart the unit in 300 s", host.run(
        "journalctl -u modelfleet-watchdog.service --no-pager -o cat -n 20").stdout)
    _models(host)
    assert _complete(host)["usage"]["completion_tokens"] == 5
    deadline = time.monotonic() + 60
    while _endpoint_states(balancer)["llama"]["fleet-2"] != "UP" and time.monotonic() < deadline:
        time.sleep(1)
    assert _endpoint_states(balancer)["llama"]["fleet-2"] == "UP", "fleet-2 did not join the endpoint again"
    assert _through_endpoint(balancer, "llama")[0]
    _figure(f"engine stopped: left the endpoint after {left:.0f} s; watchdog restarted the unit after {noticed:.0f} s; "
          f"serving again and back in the endpoint after {time.monotonic() - t:.0f} s")
    journal = host.run("journalctl -u modelfleet-watchdog.service --no-pager -o cat").stdout
    assert f"{unit}: restarting: 2 real completions failed in a row" in journal and "timed out" in journal
    state = json.loads(host.file(f"/var/lib/modelfleet-watchdog/{unit}.json").content_string)
    assert "timed out" in state["last_restart"]["reason"]
    assert host.run(f"systemctl show -p NRestarts --value {unit}").stdout.strip() == restarts  # not Restart='s doing
    assert host.run(f"test -d /proc/{engine[0]}").rc != 0  # the stopped engine is gone with the old unit

"""The fleet after: check mode on the fresh fleet (nothing), deploy tiny-llama-b, an unchanged re-run,
the swap to tiny-llama, and a broken profile on the canary (rollout stopped, canary rolled back, the
other hosts untouched)."""

import json
import os
import time
import urllib.request

PORTS = {"fleet-1": 18501, "fleet-2": 18502, "fleet-3": 18503}
UNIT = "modelfleet-vllm@tiny-llama.service"
OTHER = "modelfleet-vllm@tiny-llama-b.service"
EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")


def _name(host):
    return host.backend.get_hostname()


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
    assert host.file("/root/after_check_mode.txt").content_string.strip() == ""


def test_every_host_serves_tiny_llama_after_the_swap_and_the_failed_rollout(host):
    assert _models(host) == ["tiny-llama"]
    assert host.service(UNIT).is_running
    assert not host.service(OTHER).is_running


def test_no_unit_carries_the_broken_argument(host):
    out = host.run("grep -l -- --no-such-vllm-flag /etc/systemd/system/modelfleet-vllm@*.service")
    assert out.stdout.strip() == ""


def test_both_models_are_on_disk_complete(host):
    for repo in ("modelfleet-test--tiny-llama", "modelfleet-test--tiny-llama-b"):
        out = host.run(f"ls -d /models/{repo}/*/.modelfleet/complete")
        assert out.rc == 0, f"{_name(host)}: {repo} not complete"


def _plain(text):
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_rollout_stopped_at_the_canary():
    raw = _plain(open(os.path.join(EPHEMERAL, "broken.out")).read())
    out = " ".join(raw.split())  # the YAML callback wraps long messages
    assert "did not become ready" in out and "rolled back" in out
    # the canary play was the only one with hosts left, so ansible-playbook ends there; had a later play
    # run, its gate would have failed every other host with this message before touching it
    assert "PLAY [Distribute" not in out or "rollout stopped: the canary fleet-1 did not pass" in out
    recap = {line.split()[0]: line for line in raw.splitlines() if line.startswith("fleet-")}
    for h in ("fleet-2", "fleet-3"):
        assert h not in recap or "changed=0" in recap[h], recap[h]
    assert "failed=1" in recap["fleet-1"]


def test_other_hosts_untouched_by_the_broken_deploy(host):
    if _name(host) == "fleet-1":
        return
    # their tiny-llama-b unit file is still the one from the first deploy, the server never restarted
    assert host.file(f"/etc/systemd/system/{OTHER}").exists
    restarts = host.run(f"systemctl show -p NRestarts --value {UNIT}").stdout.strip()
    assert restarts == "0"


def test_hub_sent_one_copy_per_model_for_three_hosts(host):
    if _name(host) != "fleet-1":
        return
    endpoint = open(os.path.join(EPHEMERAL, "hub", "endpoint")).read().strip()
    stats = json.loads(urllib.request.urlopen(endpoint + "/_modelfleet/stats").read())
    total = whole_total = 0
    for repo in ("modelfleet-test--tiny-llama", "modelfleet-test--tiny-llama-b"):
        lock = json.loads(host.run(f"cat /models/{repo}/*/.modelfleet/lock.json").stdout)
        total += lock["total_bytes"]
        prefix = f"/{lock['repo_id']}/resolve/{lock['revision']}/"
        for f in lock["files"]:
            whole = stats["whole_by_path"].get(prefix + f["name"], 0)
            whole_total += whole
            if f["name"].endswith(".safetensors"):
                # the weights went out whole exactly once for three hosts (three copies would be 3x)
                assert whole == f["size"], (f["name"], whole, f["size"])
    # the rest: small files the controller's preflight also reads (config.json ...) on each of its four runs,
    # and the header-only Range reads (206) of the inspection, counted apart - far below a second copy
    assert total <= whole_total < 1.1 * total, (whole_total, total)
    assert stats["bytes_served"] - stats["ranged_bytes"] < 1.1 * total, (stats, total)


def test_benchmark_reports_written(host):
    out = host.run("ls /var/lib/modelfleet/bench/done/")
    assert "tiny-llama@" in out.stdout and "tiny-llama-b@" in out.stdout

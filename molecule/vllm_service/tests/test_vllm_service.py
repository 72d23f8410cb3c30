"""vllm_service with real vLLM CPU: the unit, its user and hardening, readiness by a real completion,
the swap, the rollback of a broken profile, and recovery from kill -9."""

import json
import re
import time

UNIT = "modelfleet-vllm@tiny-llama.service"
OTHER = "modelfleet-vllm@tiny-llama-b.service"
PORT = 18301


def _wait_ready(host, timeout=900):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        out = host.run(f"curl -fsS http://127.0.0.1:{PORT}/v1/models")
        if out.rc == 0 and "tiny-llama" in out.stdout:
            return time.monotonic() - t
        time.sleep(3)
    raise AssertionError(f"not ready after {timeout} s: {host.run('journalctl -u ' + UNIT + ' -n 20 -o cat').stdout}")


def _complete(host):
    body = json.dumps({"model": "tiny-llama", "prompt": "the fleet", "max_tokens": 5})
    out = host.run(f"curl -fsS http://127.0.0.1:{PORT}/v1/completions -H 'Content-Type: application/json' -d '{body}'")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def test_rollback_kept_the_previous_model_serving(host):
    msg = host.file("/root/rollback_failure.txt").content_string
    assert "did not become ready" in msg and "rolled back" in msg
    assert "no-such-vllm-flag" in msg or "unrecognized arguments" in msg  # the journal says why
    unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    assert "--no-such-vllm-flag" not in unit  # the previous unit file is back
    _wait_ready(host)
    assert host.service(UNIT).is_running


def test_swap_stopped_the_first_model(host):
    out = json.loads(host.file("/root/vllm_outcome.json").content_string)
    assert out["unit"] == UNIT and OTHER in out["stopped"]
    assert not host.service(OTHER).is_running


def test_runs_as_the_service_user_and_listens_on_loopback(host):
    _wait_ready(host)
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert host.process.get(pid=int(pid)).user == "modelfleet-vllm"
    assert host.socket(f"tcp://127.0.0.1:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening
    env = host.file("/etc/modelfleet/tiny-llama.env")
    assert env.mode == 0o600 and env.user == "root"


def test_hardening_exposure(host):
    out = host.run(f"systemd-analyze security {UNIT}").stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    print(f"systemd-analyze security exposure of the live unit: {exposure}")
    assert exposure <= 4.0


def test_real_completion(host):
    _wait_ready(host)
    r = _complete(host)
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["text"]


def test_kill_9_of_the_engine_recovers_by_itself(host):
    _wait_ready(host)
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    before = int(host.run(f"systemctl show -p NRestarts --value {UNIT}").stdout.strip())
    host.run(f"kill -9 {pid}")
    t = time.monotonic()
    time.sleep(2)
    took = _wait_ready(host) + (time.monotonic() - t - 0)
    print(f"healthy again {took:.0f} s after kill -9 of the engine (pid {pid})")
    after = int(host.run(f"systemctl show -p NRestarts --value {UNIT}").stdout.strip())
    assert after == before + 1
    assert _complete(host)["usage"]["completion_tokens"] == 5


def test_benchmark_role_wrote_results_and_reports(host):
    import os
    from pathlib import Path

    outcome = json.loads(host.file("/root/bench_outcome.json").content_string)
    assert outcome["levels"] == [1, 2, 4]
    assert [p["max_concurrency"] for p in outcome["points"]] == [1, 2, 4]
    for p in outcome["points"]:
        assert p["output_throughput"] > 0
        if p["valid"]:
            assert p["reconcile_diff"] <= 0.02
    assert outcome["headline"]["single_stream_output_tok_s"] > 0
    on_host = json.loads(host.file(outcome["host_result"]).content_string)
    assert on_host["provenance"]["unit"] == UNIT and on_host["provenance"]["vllm_version"].startswith("vllm")
    assert on_host["provenance"]["server_environment"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_API_KEY" not in on_host["provenance"]["server_environment"]
    reports = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "bench"
    name = "vllm-node--tiny-llama"
    for ext in ("json", "csv", "png", "html"):
        assert (reports / f"{name}.{ext}").stat().st_size > 200, ext
    assert "vllm-node--tiny-llama" in (reports / "comparison.md").read_text()

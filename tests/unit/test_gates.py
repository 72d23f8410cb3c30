"""The host gates before anything is downloaded (issue 21: one home for each rule): a usable GPU, the driver's
minimum, the compute capability range, FP8 KV cache on SM120 (the planner's rule), and the vLLM version range
with its upper bounds (the Jinja check it replaces only looked at `>=`)."""

from __future__ import annotations

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gates import GateError, environment_problems
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import sm120_fp8_kv_problem

RTX = {"gpu_count": 8, "driver_version": "580.95.05", "compute_capabilities": ["12.0"], "reason": ""}
H200 = {"gpu_count": 8, "driver_version": "580.159.04", "compute_capabilities": ["9.0"], "reason": ""}


def profile(version=">=0.11,<0.14", kv="auto", **constraints):
    return {"name": "p", "vllm": {"version": version, "kv_cache_dtype": kv}, "constraints": constraints}


def test_a_host_inside_every_gate_goes_ahead():
    assert environment_problems("gpu-01", RTX, profile(), vllm_version="0.13.2") == []
    assert environment_problems("gpu-01", H200, profile(min_compute_capability="9.0", max_compute_capability="12.0",
                                                         min_driver_version="570"), vllm_version="0.11.0") == []


@pytest.mark.parametrize("version,ok", [("0.13.9", True), ("0.14.0", False), ("0.19.1", False), ("0.10.2", False),
                                        ("0.11", True)])
def test_the_vllm_range_honours_both_bounds(version, ok):
    got = environment_problems("gpu-01", RTX, profile(), vllm_version=version)
    assert got == ([] if ok else [f"vLLM {version} does not satisfy the profile's range >=0.11,<0.14; set "
                                  "nvidia_env_vllm_version inside it"])


def test_a_cpu_host_checks_only_the_vllm_range():
    none = {"gpu_count": 0, "compute_capabilities": [], "reason": "no nvidia-smi"}
    assert environment_problems("cpu-node", none, profile(">=0.32.0", kv="fp8"), "cpu", "0.32.0") == []
    assert environment_problems("cpu-node", none, profile(">=0.32.0"), "cpu", "0.31.9") == [
        "vLLM 0.31.9 does not satisfy the profile's range >=0.32.0; set nvidia_env_vllm_version inside it"]


def test_no_gpu_is_named_with_its_reason_and_the_fix():
    none = {"gpu_count": 0, "compute_capabilities": [], "reason": "nvidia-smi not found"}
    assert environment_problems("gpu-01", none, profile(), vllm_version="0.13.0") == [
        "gpu-01 has no usable NVIDIA GPU (nvidia-smi not found). Install the driver (nvidia_env_install_driver: true, "
        "or by hand) or set nvidia_env_accelerator: cpu for a CPU host"]


def test_an_old_driver_from_the_variable_or_the_profile():
    assert environment_problems("gpu-01", RTX, profile(), vllm_version="0.13.0", min_driver_version="580.100") == [
        "driver 580.95.05 on gpu-01 is older than the required 580.100; upgrade the driver before deploying"]
    assert environment_problems("gpu-01", RTX, profile(min_driver_version="590"), vllm_version="0.13.0") == [
        "driver 580.95.05 on gpu-01 is older than the required 590; upgrade the driver before deploying"]
    # the variable wins over the profile
    assert environment_problems("gpu-01", RTX, profile(min_driver_version="590"), vllm_version="0.13.0",
                                min_driver_version="575") == []


def test_the_compute_capability_range_and_blackwell():
    mixed = dict(H200, compute_capabilities=["12.0", "9.0"])
    assert environment_problems("gpu-01", mixed, profile(min_compute_capability="10.0"), vllm_version="0.13.0") == [
        "GPUs on gpu-01 have compute capability 9.0, 12.0, but the profile p needs 10.0 to any; nothing was "
        "downloaded"]
    assert environment_problems("gpu-01", RTX, profile(max_compute_capability="10.0"), vllm_version="0.13.0") == [
        "GPUs on gpu-01 have compute capability 12.0, but the profile p needs any to 10.0; nothing was downloaded"]
    assert environment_problems("gpu-01", H200, profile(requires_blackwell=True), vllm_version="0.13.0") == [
        "GPUs on gpu-01 have compute capability 9.0, but the profile p needs any to any and a Blackwell GPU "
        "(>= 10.0) for NVFP4; nothing was downloaded"]
    # 10.0 compares as a version, not as text ("10.0" < "9.0" as strings)
    assert environment_problems("gpu-01", dict(H200, compute_capabilities=["10.0"]),
                                profile(min_compute_capability="9.0"), vllm_version="0.13.0") == []


def test_fp8_kv_on_sm120_is_the_planners_rule():
    msg = ("kv_cache_dtype fp8 on SM120 (compute capability 12.0) is known broken in vLLM; set "
           "vllm.kv_cache_dtype: auto in the profile")
    assert environment_problems("gpu-01", RTX, profile(kv="FP8"), vllm_version="0.13.0") == [msg]
    assert environment_problems("gpu-01", H200, profile(kv="fp8"), vllm_version="0.13.0") == []
    assert sm120_fp8_kv_problem("fp8_e4m3", ["9.0", "12.0"]).startswith("kv_cache_dtype fp8_e4m3 on SM120")
    assert sm120_fp8_kv_problem("auto", ["12.0"]) is None


def test_every_failed_gate_is_named_in_order():
    got = environment_problems("gpu-01", RTX, profile(kv="fp8", min_driver_version="590"), vllm_version="0.19.0")
    assert [p.split(" ")[0] for p in got] == ["driver", "kv_cache_dtype", "vLLM"]


def test_bad_inputs_are_errors_not_passes():
    with pytest.raises(GateError):
        environment_problems("gpu-01", RTX, profile(), accelerator="tpu")
    with pytest.raises(PlanError):
        environment_problems("gpu-01", dict(RTX, compute_capabilities=["twelve"]), profile())

"""The gates a host passes before anything is downloaded or started (nvidia_env's preflight, module
`environment_gates`), each rule in one place: a usable GPU, the driver's minimum, the profile's compute
capability range (and Blackwell for NVFP4), FP8 KV cache refused on SM120 (the planner's rule,
`planner.sm120_fp8_kv_problem`), and the vLLM version to install inside the profile's range, upper bounds included."""

from __future__ import annotations

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import (
    compute_capability,
    sm120_fp8_kv_problem,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.profiles import version_satisfies


class GateError(ModelfleetError):
    """The inputs of the gates are malformed (not a failed gate: those are returned as problems)."""


def environment_problems(host: str, gpu_facts: dict, profile: dict | None, accelerator: str = "nvidia",
                         vllm_version: str | None = None, min_driver_version: str | None = None) -> list[str]:
    """Every failed gate, in the order a person would fix them; empty when the host may go ahead."""
    if accelerator not in ("nvidia", "cpu"):
        raise GateError(f"accelerator {accelerator!r} is neither nvidia nor cpu")
    profile = profile or {}
    constraints = profile.get("constraints") or {}
    vllm = profile.get("vllm") or {}
    problems = []
    if accelerator == "nvidia":
        ccs = sorted(gpu_facts.get("compute_capabilities") or [], key=compute_capability)
        if int(gpu_facts.get("gpu_count") or 0) <= 0:
            problems.append(f"{host} has no usable NVIDIA GPU ({gpu_facts.get('reason') or 'none found'}). Install "
                            "the driver (nvidia_env_install_driver: true, or by hand) or set nvidia_env_accelerator: "
                            "cpu for a CPU host")
            return problems
        need = min_driver_version or constraints.get("min_driver_version") or ""
        have = str(gpu_facts.get("driver_version") or "")
        if need and not (have and version_satisfies(have, f">={need}")):
            problems.append(f"driver {have or 'unknown'} on {host} is older than the required {need}; upgrade the "
                            "driver before deploying")
        low, high = constraints.get("min_compute_capability"), constraints.get("max_compute_capability")
        blackwell = bool(constraints.get("requires_blackwell"))
        if ccs and ((low and compute_capability(ccs[0]) < compute_capability(low))
                    or (high and compute_capability(ccs[-1]) > compute_capability(high))
                    or (blackwell and compute_capability(ccs[0]) < (10, 0))):
            problems.append(f"GPUs on {host} have compute capability {', '.join(ccs)}, but the profile "
                            f"{profile.get('name', '')} needs {low or 'any'} to {high or 'any'}"
                            + (" and a Blackwell GPU (>= 10.0) for NVFP4" if blackwell else "")
                            + "; nothing was downloaded")
        fp8 = sm120_fp8_kv_problem(vllm.get("kv_cache_dtype", "auto"), ccs)
        if fp8:
            problems.append(fp8)
    spec = vllm.get("version")
    if spec and vllm_version and not version_satisfies(str(vllm_version), spec):
        problems.append(f"vLLM {vllm_version} does not satisfy the profile's range {spec}; set "
                        "nvidia_env_vllm_version inside it")
    return problems

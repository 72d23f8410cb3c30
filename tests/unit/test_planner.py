"""The planner's arithmetic and decisions on the real Kimi-K2.5 and MiniMax layouts and configs."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import config_facts, inspect_local
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import (
    expert_tp_problem,
    kv_bytes_per_token,
    plan,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GiB

from tests.conftest import FIXTURES

CK = FIXTURES / "checkpoints"
SEED_HOST = {"count": 8, "memory_bytes": 96 * GiB, "interconnect": "pcie", "compute_capability": "12.0"}


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    from modelfleet.harness.synthetic import write_checkpoint

    d = tmp_path_factory.mktemp("minimax-plan")
    write_checkpoint(CK / "minimax-m2.7-tensor-inventory.md", CK / "minimax-m2.7-config.json", d)
    return inspect_local(str(d))


def test_kimi_int4_on_the_seed_host(kimi):
    p = plan(kimi, SEED_HOST)
    assert p["tensor_parallel_size"] == 8 and p["expert_parallel"] is False
    assert any(r.startswith("MLA on PCIe: TP=8, no EP") for r in p["reasons"])
    # MLA latent: (512 + 64) x 61 layers x 2 bytes, the same on every rank
    assert p["kv_bytes_per_token"] == (512 + 64) * 61 * 2 == 70272
    rep = kimi["replicated_bytes"]
    assert p["weight_bytes_per_gpu"] == -(-(595_148_192_736 - rep) // 8) + rep
    room = int(96 * GiB * 0.90) - p["weight_bytes_per_gpu"] - 3 * GiB
    assert p["kv_room_bytes_per_gpu"] == room
    assert p["kv_tokens_capacity"] == room // 70272
    assert p["max_concurrency"] == p["kv_tokens_capacity"] // 2048
    assert p["fits"]


def test_minimax_needs_ep_from_its_own_numbers(minimax):
    assert expert_tp_problem(minimax, 8) == ("expert intermediate size 1536 / TP=8 = 192, not a multiple of the "
                                             "FP8 block size 128")
    assert expert_tp_problem(minimax, 4) is None  # 384 = 3 x 128
    p = plan(minimax, SEED_HOST)
    assert (p["tensor_parallel_size"], p["expert_parallel"]) == (8, True)
    assert p["reasons"][1].startswith("GQA MoE: TP=8 + EP because expert intermediate size 1536")
    # GQA: 8 KV heads split over 8 ranks -> 1 head each: 2 x 1 x 128 x 62 x 2
    assert p["kv_bytes_per_token"] == 2 * 1 * 128 * 62 * 2


def test_nvlink_moe_gets_ep(kimi):
    p = plan(kimi, {**SEED_HOST, "interconnect": "nvlink"})
    assert p["expert_parallel"] is True and "NVLink" in p["reasons"][1]


def test_gqa_kv_heads_replicate_beyond_their_count():
    f = config_facts(json.loads((CK / "qwen3-8b-config.json").read_text()))
    assert kv_bytes_per_token(f, 8, 2) == 2 * 1 * 128 * 36 * 2
    assert kv_bytes_per_token(f, 16, 2) == 2 * 1 * 128 * 36 * 2  # 8 KV heads cannot split 16 ways
    assert kv_bytes_per_token(f, 2, 2) == 2 * 4 * 128 * 36 * 2


def test_does_not_fit_says_by_how_much(kimi):
    p = plan(kimi, {**SEED_HOST, "count": 4})
    assert not p["fits"] and p["shortfall_bytes_per_gpu"] > 0
    assert "does NOT fit" in p["reasons"][-1] and "short by" in p["reasons"][-1]


def test_fp8_kv_on_sm120_refused(kimi):
    with pytest.raises(PlanError, match="SM120"):
        plan(kimi, SEED_HOST, kv_cache_dtype="fp8")
    assert plan(kimi, {**SEED_HOST, "compute_capability": "9.0"}, kv_cache_dtype="fp8")["kv_dtype_bytes"] == 1


@pytest.mark.parametrize("gpus,needle", [
    ({"count": 0, "memory_bytes": GiB}, "positive integer"),
    ({"count": 8, "memory_bytes": -1}, "positive number of bytes"),
    ({"count": 8, "memory_bytes": GiB, "interconnect": "infiniband"}, "interconnect must be"),
])
def test_bad_gpu_facts(kimi, gpus, needle):
    with pytest.raises(PlanError, match=needle):
        plan(kimi, gpus)


def test_profile_tp_larger_than_gpus(kimi):
    with pytest.raises(PlanError, match="larger than the GPU count"):
        plan(kimi, SEED_HOST, {"vllm": {"tensor_parallel_size": 16}})


def test_profile_forbids_ep_but_tp_cannot_shard(minimax):
    with pytest.raises(PlanError, match="forbids EP"):
        plan(minimax, SEED_HOST, {"vllm": {"expert_parallel": False}})


def test_cli_plan_json(kimi, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    d = kimi["source"]["path"]
    r = subprocess.run([sys.executable, "-m", "modelfleet.cli", "plan", d, "--gpus", "8", "--gpu-memory-gib", "96",
                        "--interconnect", "pcie", "--json"], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("kv_bytes_per_token", "weight_bytes_per_gpu", "kv_tokens_capacity", "tensor_parallel_size",
                "expert_parallel", "reasons"):
        assert key in out
    assert out["tensor_parallel_size"] == 8

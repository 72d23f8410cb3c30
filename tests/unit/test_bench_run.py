"""The vllm_bench workflow as a function (issue 21: modules are shells): parameters that cannot run, check mode,
the provenance without secrets, and the baseline gate that keeps the failing result on disk - with a stand-in
for the sweep only (the real client against real vLLM is tests/integration/test_bench_vllm.py's)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.bench_run import (
    BenchRunError,
    run_benchmark,
    server_environment,
)

pytest.importorskip("httptools")  # bench_client's dependency (the project venv has it)


def _params(tmp_path, **kw):
    p = {"url": "http://127.0.0.1:9/", "served_name": "m", "api_key": "sk-secret", "endpoint": "completions",
         "input_len": 16, "output_len": 8, "vocab_size": 0, "max_concurrency": 2, "concurrency_levels": None,
         "request_rate": 0.0, "per_level": 2, "min_prompts": 4, "max_prompts": 2000, "warmup": 0, "processes": 1,
         "kv_tokens_capacity": 0, "goodput_ttft_ms": None, "goodput_tpot_ms": None, "reconcile_tolerance": 0.02,
         "max_client_cpu_fraction": 0.9, "max_loop_lag_p99_ms": 25, "seed": 0, "provenance": {"model_repo": "o/m"},
         "server_pid": 0, "result_path": str(tmp_path / "out" / "r.json"), "baseline": None,
         "baseline_tolerance": 0.1}
    p.update(kw)
    return p


def _sweep(seen):
    def sweep(cfg, *, levels, **kw):
        seen.update(cfg=cfg, levels=levels, **kw)
        points = [{"max_concurrency": c, "output_throughput": 10.0 * c, "median_ttft_ms": 5.0, "median_tpot_ms": 1.0,
                   "median_e2el_ms": 10.0 * c, "reconcile_diff": 0, "valid": True, "invalid_reasons": [],
                   "beyond_kv_bound": False} for c in levels]
        return {"points": points, "headline": bench.headline(points), "knee": bench.find_knee(points),
                "started_at": 0}
    return sweep


@pytest.mark.parametrize("kw, says", [({"input_len": 0}, "input_len must be at least 1, got 0"),
                                      ({"request_rate": -1.0}, "request_rate must be >= 0, got -1.0")])
def test_parameters_that_cannot_run_are_named_before_any_request(tmp_path, kw, says):
    seen = {}
    with pytest.raises(BenchRunError) as e:
        run_benchmark(_params(tmp_path, **kw), sweep=_sweep(seen))
    assert says in str(e.value) and e.value.details["levels"] == [] and not seen


def test_check_mode_says_what_it_would_do_and_sends_nothing(tmp_path):
    seen = {}
    res = run_benchmark(_params(tmp_path), check_mode=True, sweep=_sweep(seen))
    assert res == {"changed": False, "levels": [1, 2], "result_path": str(tmp_path / "out" / "r.json"),
                   "msg": "would benchmark m at http://127.0.0.1:9/ with concurrency [1, 2]"}
    assert not seen and not (tmp_path / "out").exists()


def test_a_run_writes_its_result_with_provenance_and_the_client_settings(tmp_path):
    seen = {}
    res = run_benchmark(_params(tmp_path), sweep=_sweep(seen))
    assert seen["levels"] == [1, 2] and seen["cfg"]["base_url"] == "http://127.0.0.1:9"
    assert seen["cfg"]["api_key"] == "sk-secret" and seen["request_rate"] is None
    saved = json.loads((tmp_path / "out" / "r.json").read_text())
    assert saved["headline"] == res["headline"] == {"single_stream_output_tok_s": 10.0, "peak_output_tok_s": 20.0,
                                                     "peak_concurrency": 2, "peak_output_tok_s_ci": None}
    prov = saved["provenance"]
    assert prov["model_repo"] == "o/m" and prov["benchmarked_at"] == "1970-01-01T00:00:00Z"
    assert "sk-secret" not in (tmp_path / "out" / "r.json").read_text()


def test_a_result_below_the_baseline_fails_and_is_kept(tmp_path):
    with pytest.raises(BenchRunError) as e:
        run_benchmark(_params(tmp_path, baseline={"peak_output_tok_s": 100.0}), sweep=_sweep({}))
    assert str(e.value).startswith("benchmark below the baseline: peak_output_tok_s: 20.0 < 90.0")
    assert e.value.details["gate"]["passed"] is False
    assert json.loads((tmp_path / "out" / "r.json").read_text())["gate"]["passed"] is False
    ok = run_benchmark(_params(tmp_path, baseline={"peak_output_tok_s": 21.0}), sweep=_sweep({}))
    assert ok["gate"]["passed"] is True


def test_the_servers_environment_keeps_tuning_variables_and_drops_secrets(tmp_path):
    env = tmp_path / "environ"
    env.write_bytes(b"\0".join([b"VLLM_CPU_KVCACHE_SPACE=1", b"HF_TOKEN=hf_x", b"VLLM_API_KEY=sk", b"PATH=/bin",
                                b"NCCL_IB_DISABLE=1", b"CUDA_SECRET_THING=s"]))
    assert server_environment(1, str(env)) == {"VLLM_CPU_KVCACHE_SPACE": "1", "NCCL_IB_DISABLE": "1"}
    assert server_environment(0) == {} and server_environment(1, str(tmp_path / "absent")) == {}

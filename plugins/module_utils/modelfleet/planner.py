"""The memory / parallelism planner: from checkpoint facts (checkpoint.py), GPU facts and a profile,
decide TP/EP and say how much KV cache room that leaves - before a byte of weights is downloaded.

Formulas (every figure is an int of bytes unless named otherwise):
  weight_bytes_per_gpu = sharded_bytes / TP + replicated_bytes
      replicated: 1-D tensors (norms, biases), MoE routers, MLA's q_a/kv_a projections, vision tower
      (vLLM keeps these whole on every rank); everything else is split TP ways (or EP ways for experts).
  kv_bytes_per_token (per GPU, at the KV cache dtype):
      MLA: (kv_lora_rank + qk_rope_head_dim) * layers * dtype_bytes   - the latent is replicated on every rank
      GQA/MHA: 2 * ceil(kv_heads / TP) * head_dim * layers * dtype_bytes - heads split across ranks
               (when TP > kv_heads, each rank still holds one head: heads are replicated)
  kv_room_bytes_per_gpu = gpu_memory_bytes * gpu_memory_utilization - weight_bytes_per_gpu - overhead_bytes
  kv_tokens_capacity = kv_room_bytes_per_gpu // kv_bytes_per_token
  max_concurrency = kv_tokens_capacity // (input_len + output_len)
"""

from __future__ import annotations

import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GiB, fmt_bytes

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "auto": None}
DEFAULT_OVERHEAD_BYTES = 3 * GiB  # activations, CUDA graphs, NCCL buffers: an estimate, configurable


def _replicated_fraction_bytes(facts: dict) -> int:
    """Bytes vLLM keeps whole on each rank, estimated from tensor kinds when headers were read."""
    rep = facts.get("replicated_bytes")
    return int(rep) if rep is not None else 0


def kv_bytes_per_token(facts: dict, tp: int, kv_dtype_bytes: int, pp: int = 1) -> int:
    """Per GPU: a pipeline stage holds the KV of its own layers only (the most a stage has: ceil(layers / PP))."""
    layers = -(-facts["num_layers"] // pp)
    if facts["attention"] == "mla":
        return (facts["kv_lora_rank"] + (facts.get("qk_rope_head_dim") or 0)) * layers * kv_dtype_bytes
    kv_heads = facts.get("num_key_value_heads") or facts["num_attention_heads"]
    per_rank_heads = -(-kv_heads // tp)
    return 2 * per_rank_heads * facts["head_dim"] * layers * kv_dtype_bytes


def expert_tp_problem(facts: dict, tp: int) -> str | None:
    """Why experts cannot be split `tp` ways by tensor parallelism, or None if they can."""
    if not facts.get("num_experts"):
        return None
    inter = facts.get("moe_intermediate_size") or facts.get("intermediate_size")
    if not inter:
        return None
    if inter % tp:
        return f"expert intermediate size {inter} does not divide by TP={tp}"
    shard = inter // tp
    q = facts.get("quantization") or {}
    block = (q.get("weight_block_size") or [None, None])[0] if q.get("method") == "fp8" else None
    if block and shard % block:
        return (f"expert intermediate size {inter} / TP={tp} = {shard}, not a multiple of the FP8 block "
                f"size {block}")
    group = q.get("group_size")
    if q.get("method") in ("compressed-tensors", "modelopt") and group and shard % group:
        return f"expert intermediate size {inter} / TP={tp} = {shard}, not a multiple of the quant group {group}"
    return None


def compute_capability(value, what: str = "compute capability") -> tuple[int, int] | None:
    """'9.0' -> (9, 0). None/'' -> None. Anything else ('banana', '12', 12.0 as a number) is a PlanError
    naming the form, so the SM120 guard and the profile's limits never compare junk."""
    if value in (None, ""):
        return None
    m = re.match(r"^\s*(\d{1,3})\.(\d{1,3})\s*\Z", value) if isinstance(value, str) else None
    if not m:
        raise PlanError(f"{what} {value!r} is not MAJOR.MINOR (e.g. 9.0 for an H100/H200, 12.0 for an RTX PRO "
                        "6000 Blackwell); nvidia-smi --query-gpu=compute_cap shows it")
    return int(m.group(1)), int(m.group(2))


def sm120_fp8_kv_problem(kv_cache_dtype: str, ccs: list) -> str | None:
    """FP8 KV cache on SM120 (RTX PRO 6000 / RTX 50 Blackwell) is known broken in vLLM."""
    kv = str(kv_cache_dtype or "auto").strip().lower()
    sm120 = [cc for cc in ccs or [] if (compute_capability(cc) or (0, 0))[0] == 12]
    if kv.startswith("fp8") and sm120:
        return (f"kv_cache_dtype {kv} on SM120 (compute capability {', '.join(sm120)}) is known broken in vLLM; "
                "set vllm.kv_cache_dtype: auto in the profile")
    return None


def kv_cache_dtype_name(value) -> str:
    """The KV-cache dtype as vLLM spells it (lower case), or a PlanError listing the accepted ones."""
    name = str(value).strip().lower() if isinstance(value, str) else None
    if name not in DTYPE_BYTES:
        raise PlanError(f"kv_cache_dtype {value!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
    return name


def gpus_from_facts(gf: dict) -> dict:
    """The planner's GPU input from gpu_facts: the smallest GPU's memory, the lowest compute capability."""
    ccs = sorted(gf.get("compute_capabilities") or [], key=compute_capability)
    return {"count": gf.get("gpu_count"), "memory_bytes": gf.get("min_memory_total_bytes"),
            "compute_capability": ccs[0] if ccs else None,
            "interconnect": gf.get("interconnect") if gf.get("interconnect") != "none" else None}


def plan(facts: dict, gpus: dict, profile: dict | None = None, input_len: int = 1024, output_len: int = 1024,
         gpu_memory_utilization: float | None = None, kv_cache_dtype: str | None = None,
         overhead_bytes: int = DEFAULT_OVERHEAD_BYTES, pipeline_parallel_size: int = 1) -> dict:
    """Return the plan. gpus: {count, memory_bytes, compute_capability?, interconnect: pcie|nvlink|mixed|single}
    of one host; pipeline_parallel_size > 1: the model's layers split in that many stages, one host each, with the
    same GPUs (group.layout chooses it)."""
    pp = pipeline_parallel_size
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise PlanError(f"pipeline_parallel_size must be a whole number >= 1, got {pp!r}")
    if pp > 1 and pp > (facts.get("num_layers") or 0):
        raise PlanError(f"pipeline_parallel_size {pp} is more than the model's {facts.get('num_layers')} layers")
    if "gpu_count" in gpus and "memory_bytes" not in gpus:  # gpu_facts' output as it is
        gpus = gpus_from_facts(gpus)
    count = gpus.get("count") or gpus.get("gpu_count")
    mem = gpus.get("memory_bytes")
    if not isinstance(count, int) or count < 1:
        raise PlanError(f"GPU count must be a positive integer, got {count!r}")
    if not isinstance(mem, int) or mem <= 0:
        raise PlanError(f"GPU memory must be a positive number of bytes, got {mem!r}")
    interconnect = gpus.get("interconnect") or ("single" if count == 1 else "pcie")
    if interconnect not in ("pcie", "nvlink", "mixed", "single"):
        raise PlanError(f"interconnect must be pcie, nvlink, mixed or single, got {interconnect!r}")
    if input_len < 1 or output_len < 1:
        raise PlanError("input and output lengths must be >= 1")
    pv = (profile or {}).get("vllm", {})
    cons = (profile or {}).get("constraints", {})
    util = float(gpu_memory_utilization if gpu_memory_utilization is not None
                 else pv.get("gpu_memory_utilization", 0.90))
    if not 0 < util <= 1:
        raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {util}")
    kv_dtype = kv_cache_dtype_name(kv_cache_dtype or pv.get("kv_cache_dtype") or "auto")
    kvb = DTYPE_BYTES.get(kv_dtype) or DTYPE_BYTES.get(str(facts.get("dtype")).lower(), 2)
    reasons: list[str] = []
    warnings: list[str] = []
    cc = gpus.get("compute_capability")
    compute_capability(cc)
    sm120 = sm120_fp8_kv_problem(kv_dtype, [cc] if cc else [])
    if sm120:
        raise PlanError(sm120)
    total = facts.get("tensor_bytes") or facts.get("shard_bytes") or facts.get("total_bytes")
    if not total:
        raise PlanError("the checkpoint facts have no size (tensor_bytes / total_bytes); inspect it first")
    replicated = min(_replicated_fraction_bytes(facts), total)
    sharded = total - replicated

    # --- tensor parallel size
    heads = facts["num_attention_heads"]
    want_tp = pv.get("tensor_parallel_size", "auto")
    if want_tp != "auto":
        if want_tp > count:
            raise PlanError(f"tensor_parallel_size {want_tp} is larger than the GPU count {count}")
        tp = want_tp
        reasons.append(f"TP={tp} from the profile")
    else:
        tp = 1
        while tp * 2 <= count and heads % (tp * 2) == 0:
            tp *= 2
        reasons.append(f"TP={tp}: the largest power of two <= {count} GPUs dividing {heads} attention heads "
                       "(one model per host, all GPUs, for the most KV room)")
    if heads % tp:
        raise PlanError(f"TP={tp} does not divide the {heads} attention heads")

    # --- expert parallel
    moe = bool(facts.get("num_experts"))
    tp_problem = expert_tp_problem(facts, tp) if moe else None
    want_ep = pv.get("expert_parallel", "auto")
    rule = cons.get("expert_parallel", "optional")
    if not moe:
        ep = False
        reasons.append("dense model: no expert parallelism")
    elif rule == "required" or want_ep is True:
        ep = True
        why = tp_problem or "the profile requires it"
        reasons.append(f"{facts['attention'].upper()} MoE: TP={tp} + EP ({why})")
    elif tp_problem:
        if rule == "forbidden" or want_ep is False:
            raise PlanError(f"pure TP={tp} cannot shard the experts ({tp_problem}) and the profile forbids EP")
        ep = True
        reasons.append(f"{facts['attention'].upper()} MoE: TP={tp} + EP because {tp_problem}")
    elif want_ep is False or rule == "forbidden":
        ep = False
        reasons.append(f"{facts['attention'].upper()} MoE: TP={tp}, no EP (the profile says so)")
    elif interconnect in ("pcie", "mixed", "single"):
        ep = False
        link = {"pcie": "PCIe", "mixed": "a mixed PCIe/NVLink", "single": "one GPU"}[interconnect]
        reasons.append(f"{facts['attention'].upper()} on {link}: TP={tp}, no EP (experts split evenly by TP; "
                       "EP's all-to-all token dispatch over PCIe costs more than TP's all-reduce)")
    else:
        ep = True
        reasons.append(f"{facts['attention'].upper()} MoE on NVLink: TP={tp} + EP (all-to-all is cheap over NVLink "
                       "and EP keeps whole experts per GPU)")

    # a pipeline stage holds its own layers: the split weights and the per-layer replicated ones both divide by PP
    weight_per_gpu = -(-sharded // (tp * pp)) + -(-replicated // pp)
    kv_tok = kv_bytes_per_token(facts, tp, kvb, pp)
    budget = int(mem * util)
    room = budget - weight_per_gpu - overhead_bytes
    seq = input_len + output_len
    out = {
        "tensor_parallel_size": tp,
        "expert_parallel": ep,
        "pipeline_parallel_size": pp,
        "gpu_count": count,
        "interconnect": interconnect,
        "gpu_memory_bytes": mem,
        "gpu_memory_utilization": util,
        "kv_cache_dtype": kv_dtype,
        "kv_dtype_bytes": kvb,
        "weight_bytes_total": total,
        "weight_bytes_replicated": replicated,
        "weight_bytes_per_gpu": weight_per_gpu,
        "overhead_bytes_per_gpu": overhead_bytes,
        "memory_budget_bytes_per_gpu": budget,
        "kv_room_bytes_per_gpu": max(room, 0),
        "kv_bytes_per_token": kv_tok,
        "kv_tokens_capacity": max(room, 0) // kv_tok if kv_tok else 0,
        "input_len": input_len,
        "output_len": output_len,
        "max_model_len": pv.get("max_model_len"),
        "reasons": reasons,
        "warnings": warnings,
        "fits": room > 0,
        "formulas": {
            "weight_bytes_per_gpu": ("ceil((weight_bytes_total - replicated) / TP) + replicated" if pp == 1 else
                                     "ceil((weight_bytes_total - replicated) / (TP * PP)) + ceil(replicated / PP)"),
            "kv_bytes_per_token": (("(kv_lora_rank + qk_rope_head_dim) * layers * kv_dtype_bytes (MLA, replicated "
                                    "per rank)" if facts["attention"] == "mla" else
                                    "2 * ceil(kv_heads / TP) * head_dim * layers * kv_dtype_bytes")
                                   + ("" if pp == 1 else ", layers = ceil(layers / PP) per stage")),
            "kv_room_bytes_per_gpu": "gpu_memory_bytes * utilization - weight_bytes_per_gpu - overhead",
            "kv_tokens_capacity": "kv_room_bytes_per_gpu // kv_bytes_per_token",
            "max_concurrency": "kv_tokens_capacity // (input_len + output_len)",
        },
    }
    out["max_concurrency"] = out["kv_tokens_capacity"] // seq
    if room <= 0:
        out["shortfall_bytes_per_gpu"] = -room
        reasons.append(f"does NOT fit: each GPU needs {fmt_bytes(weight_per_gpu + overhead_bytes)} for weights and "
                       f"overhead but has {fmt_bytes(budget)} at utilization {util}; short by {fmt_bytes(-room)} "
                       f"per GPU ({fmt_bytes(-room * tp)} in all)")
    elif pv.get("max_model_len") and out["kv_tokens_capacity"] < pv["max_model_len"]:
        warnings.append(f"KV room holds {out['kv_tokens_capacity']} tokens, less than max_model_len "
                        f"{pv['max_model_len']}: vLLM will refuse to start; lower max_model_len")
    if ep and interconnect == "pcie":
        warnings.append("EP over PCIe: expect all-to-all to bound throughput at high concurrency")
    return out

"""Checkpoint inspection: facts read from config.json, model.safetensors.index.json and every shard's
safetensors header, never from the weights. Works on a local directory or, through huggingface_hub,
on a hub repo at a revision (headers read by bounded streaming GETs with a Range header).

Pure logic + thin I/O helpers; the Ansible module and the CLI are shells over `inspect_local` and
`inspect_hub`."""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from math import prod

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import CheckpointError, ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fastjson import JSONError, loads
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.safetensors_header import (
    DTYPE_BITS,
    decode_length,
    open_regular,
    parse_header,
    read_local_header,
)

MAX_CONFIG_BYTES = 10 * 10**6
MAX_INDEX_BYTES = 100 * 10**6  # a 1T checkpoint's index maps ~200k tensors (~23 MB)
INDEX_NAME = "model.safetensors.index.json"
HEX40 = re.compile(r"^[0-9a-f]{40}\Z")

KNOWN_QUANT_METHODS = ("compressed-tensors", "fp8", "modelopt", "none")
# Tensors that describe a quantized weight rather than hold parameters.
QUANT_META_SUFFIXES = (
    ".weight_scale", ".weight_shape", ".weight_scale_inv", ".weight_scale_2", ".input_scale",
    ".weight_zero_point", ".weight_global_scale", ".input_global_scale", ".k_scale", ".v_scale",
)


# --------------------------------------------------------------------------- config facts
def _text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def _first(d: dict, *keys, default=None):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


def quantization_facts(config: dict, name: str = "config.json") -> dict:
    """Normalise quantization_config (top level or inside text_config) to one shape."""
    qc = config.get("quantization_config") or _text_config(config).get("quantization_config")
    if not qc:
        return {"method": "none", "bits": None, "group_size": None, "symmetric": None, "format": None,
                "ignore": [], "kv_cache_scheme": None, "weight_block_size": None}
    if not isinstance(qc, dict):
        raise CheckpointError(f"{name}: quantization_config is not an object")
    method = qc.get("quant_method")
    out = {"method": method, "bits": None, "group_size": None, "symmetric": None, "format": qc.get("format"),
           "ignore": qc.get("ignore") or qc.get("modules_to_not_convert") or qc.get("exclude_modules") or [],
           "kv_cache_scheme": qc.get("kv_cache_scheme"), "weight_block_size": qc.get("weight_block_size")}
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        if not groups:
            raise CheckpointError(f"{name}: compressed-tensors quantization_config has no config_groups")
        w = (next(iter(groups.values())) or {}).get("weights") or {}
        out.update(bits=w.get("num_bits"), group_size=w.get("group_size"), symmetric=w.get("symmetric"),
                   weight_type=w.get("type"), strategy=w.get("strategy"))
    elif method == "fp8":
        out.update(bits=8, symmetric=True, format=qc.get("fmt", "e4m3"),
                   activation_scheme=qc.get("activation_scheme"))
    elif method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
        out.update(format=algo or None)
        if "NVFP4" in algo or "FP4" in algo:
            out.update(bits=4, group_size=qc.get("group_size") or 16, symmetric=True)
        elif "FP8" in algo:
            out.update(bits=8, symmetric=True)
        kv_algo = qc.get("kv_cache_quant_algo")
        if kv_algo:
            out["kv_cache_scheme"] = {"type": "float", "algo": kv_algo}
    else:
        raise CheckpointError(
            f"{name}: unknown quantization method {method!r} (known: {', '.join(KNOWN_QUANT_METHODS)}); "
            "add support for it or use a checkpoint with a known method"
        )
    return out


def config_facts(config: dict, name: str = "config.json") -> dict:
    if not isinstance(config, dict):
        raise CheckpointError(f"{name}: not a JSON object")
    archs = config.get("architectures")
    if not archs or not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"{name}: no 'architectures' list; is this a transformers model config?")
    tc = _text_config(config)
    heads = _first(tc, "num_attention_heads")
    kv_heads = _first(tc, "num_key_value_heads", default=heads)
    hidden = _first(tc, "hidden_size")
    layers = _first(tc, "num_hidden_layers", "n_layers", "num_layers")
    for key, val in (("hidden_size", hidden), ("num_hidden_layers", layers), ("num_attention_heads", heads)):
        if not isinstance(val, int) or val <= 0:
            raise CheckpointError(f"{name}: {key} is missing or not a positive integer ({val!r})")
    if tc.get("kv_lora_rank"):
        attention = "mla"
    elif kv_heads and kv_heads < heads:
        attention = "gqa"
    else:
        attention = "mha"
    head_dim = _first(tc, "head_dim", default=hidden // heads)
    dtype = _first(tc, "dtype", "torch_dtype", default=_first(config, "dtype", "torch_dtype", default="bfloat16"))
    facts = {
        "architecture": archs[0],
        "architectures": archs,
        "model_type": config.get("model_type"),
        "text_model_type": tc.get("model_type"),
        "attention": attention,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "kv_lora_rank": tc.get("kv_lora_rank"),
        "qk_rope_head_dim": tc.get("qk_rope_head_dim"),
        "num_experts": _first(tc, "n_routed_experts", "num_local_experts", "num_experts", default=0),
        "experts_per_token": _first(tc, "num_experts_per_tok", "num_experts_per_token", default=0),
        "moe_intermediate_size": tc.get("moe_intermediate_size"),
        "intermediate_size": tc.get("intermediate_size"),
        "vocab_size": tc.get("vocab_size"),
        "max_position_embeddings": tc.get("max_position_embeddings"),
        "dtype": dtype,
        "trust_remote_code": bool(config.get("auto_map") or tc.get("auto_map")),
        "quantization": quantization_facts(config, name),
    }
    return facts


# --------------------------------------------------------------------------- header facts
# Tensors vLLM keeps whole on every tensor-parallel rank (besides 1-D norms and biases): MoE routers,
# MLA's latent down-projections, and the vision tower of multimodal models.
REPLICATED_SUFFIXES = (".mlp.gate.weight", ".block_sparse_moe.gate.weight", ".self_attn.q_a_proj.weight",
                       ".self_attn.kv_a_proj_with_mqa.weight")
VISION_PREFIXES = ("vision_tower.", "mm_projector.", "visual.", "vision_model.", "multi_modal_projector.")


def _tensor_kind(tname: str) -> str:
    if tname.startswith(VISION_PREFIXES):
        return "vision"
    if ".shared_experts." in tname or ".shared_expert." in tname:
        return "shared_experts"
    if ".experts." in tname:
        return "experts"
    if ".self_attn." in tname or ".attention." in tname or ".attn." in tname:
        return "attention"
    if ".mlp." in tname:
        return "dense_mlp" if ".gate." not in tname else "router"
    if "lm_head" in tname or "embed" in tname:
        return "embeddings"
    return "other"


def partial_header_facts(headers: dict[str, dict], quant: dict) -> dict:
    """The additive counts and sums over every tensor of `headers` (some or all shards): partials of different
    shards add up (merge_header_facts), so shards can be counted apart, in parallel."""
    bits = quant.get("bits") or 0
    method = quant.get("method")
    bytes_by_dtype: dict[str, int] = {}
    quantized = unquantized = num_params = meta_elems = tensors = 0
    quantized_by_kind: dict[str, int] = {}
    unquantized_by_kind: dict[str, int] = {}
    replicated = 0
    for header in headers.values():
        for tname, e in header.items():
            if tname == "__metadata__":
                continue
            tensors += 1
            dtype, shape = e["dtype"], e["shape"]
            elems = prod(shape)
            nbytes = e["data_offsets"][1] - e["data_offsets"][0]
            bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + nbytes
            if len(shape) <= 1 or tname.endswith(REPLICATED_SUFFIXES) or tname.startswith(VISION_PREFIXES):
                replicated += nbytes
            if tname.endswith(QUANT_META_SUFFIXES):
                meta_elems += elems
                continue
            kind = _tensor_kind(tname)
            if tname.endswith(".weight_packed"):
                per = (DTYPE_BITS[dtype] // bits) if bits else 1
                num_params += elems * per
                quantized += 1
                quantized_by_kind[kind] = quantized_by_kind.get(kind, 0) + 1
            elif tname.endswith(".weight") and dtype.startswith("F8") and method in ("fp8", "modelopt"):
                num_params += elems
                quantized += 1
                quantized_by_kind[kind] = quantized_by_kind.get(kind, 0) + 1
            elif tname.endswith(".weight") and dtype == "U8" and method == "modelopt" and bits == 4:
                num_params += elems * 2
                quantized += 1
                quantized_by_kind[kind] = quantized_by_kind.get(kind, 0) + 1
            else:
                num_params += elems
                if tname.endswith(".weight") and len(shape) >= 2:
                    unquantized += 1
                    unquantized_by_kind[kind] = unquantized_by_kind.get(kind, 0) + 1
    return {"num_tensors": tensors, "quantized_tensors": quantized, "unquantized_tensors": unquantized,
            "quantized_by_kind": quantized_by_kind, "unquantized_by_kind": unquantized_by_kind,
            "bytes_by_dtype": bytes_by_dtype, "num_parameters": num_params,
            "num_quant_metadata_elements": meta_elems, "replicated_bytes": replicated}


def merge_header_facts(partials: list[dict]) -> dict:
    """The facts of a whole checkpoint from the partials of its shards."""
    total: dict = {"num_tensors": 0, "quantized_tensors": 0, "unquantized_tensors": 0, "quantized_by_kind": {},
                   "unquantized_by_kind": {}, "bytes_by_dtype": {}, "num_parameters": 0,
                   "num_quant_metadata_elements": 0, "replicated_bytes": 0}
    for part in partials:
        for k, v in part.items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    total[k][kk] = total[k].get(kk, 0) + vv
            else:
                total[k] += v
    for k in ("quantized_by_kind", "unquantized_by_kind", "bytes_by_dtype"):
        total[k] = dict(sorted(total[k].items()))
    total["only_experts_quantized"] = bool(total["quantized_tensors"]) and set(total["quantized_by_kind"]) == {
        "experts"}
    total["tensor_bytes"] = sum(total["bytes_by_dtype"].values())
    return total


def header_facts(headers: dict[str, dict], quant: dict) -> dict:
    """Counts and sums over every tensor of every shard."""
    return merge_header_facts([partial_header_facts(headers, quant)])


def compatibility_warnings(facts: dict, compute_capability: str | None = None,
                           revision_pinned: bool = True, kv_cache_dtype: str | None = None) -> list[str]:
    """Warnings a user must see before downloading anything."""
    out = []
    q = facts.get("quantization") or {}
    if facts.get("trust_remote_code") and not revision_pinned:
        out.append("checkpoint needs trust_remote_code (auto_map present) but no 40-hex revision is pinned: "
                   "remote code could change under you; pin --revision to a commit")
    if compute_capability:
        major = int(str(compute_capability).split(".", maxsplit=1)[0])
        cc = str(compute_capability)
        kv = (kv_cache_dtype or "").lower()
        scheme = q.get("kv_cache_scheme")
        if cc.startswith("12.") and (kv.startswith("fp8") or scheme):
            out.append(f"FP8 KV cache on SM{cc.replace('.', '')} (compute capability {cc}) is known broken in vLLM; "
                       "use kv_cache_dtype auto")
        if q.get("method") == "modelopt" and q.get("bits") == 4 and major < 10:
            out.append(f"NVFP4 weights need a Blackwell GPU (compute capability >= 10.0); this GPU is {cc}")
    return out


# --------------------------------------------------------------------------- local inspection
def _load_json_file(path: str, name: str, cap: int = MAX_CONFIG_BYTES) -> dict:
    try:
        with open_regular(path, name) as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                raise CheckpointError(f"{name}: {size} bytes is over the {cap}-byte limit for this file")
            data = loads(f.read(cap + 1))
    except OSError as e:
        raise CheckpointError(f"{name}: cannot read ({e.strerror})") from None
    except JSONError as e:
        raise CheckpointError(f"{name}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{name}: not a JSON object (found {type(data).__name__}); a checkpoint file "
                              "holds one object")
    return data


def _check_index(index: dict, name: str = INDEX_NAME) -> dict[str, str]:
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise CheckpointError(f"{name}: no 'weight_map' object")
    try:
        shards = set(wm.values())
    except TypeError:
        shards = {None}
    for shard in shards:  # validate each distinct name once, then find a tensor that uses a bad one
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or "/" in shard or shard.startswith("."):
            t = next(k for k, v in wm.items() if v == shard)
            raise CheckpointError(f"{name}: tensor {t!r} maps to an invalid shard name {shard!r}")
    return wm


def _cross_check(weight_map: dict[str, str], headers: dict[str, dict]) -> None:
    for t, shard in weight_map.items():
        h = headers.get(shard)
        if h is not None and t not in h:
            raise CheckpointError(f"{INDEX_NAME}: tensor {t!r} is mapped to {shard} but that shard's header lacks it")


def _assemble(config: dict, weight_map, headers, files, absent, revision, source, hfacts: dict | None = None,
              shards_read: int | None = None) -> dict:
    """The facts; the header facts come from `headers`, or ready-made in `hfacts` (with `shards_read` shards)."""
    facts = config_facts(config)
    facts["source"] = source
    facts["revision"] = revision
    if shards_read is None:
        shards_read = len(headers)
    facts["num_shards"] = len(set(weight_map.values())) if weight_map else shards_read
    facts["files"] = files
    if absent:  # the weights are not here: their size is unknown, never the few bytes of config that are
        facts["total_bytes"] = facts["shard_bytes"] = None
    else:
        facts["total_bytes"] = sum(f["size"] for f in files if f.get("size") is not None)
        facts["shard_bytes"] = sum(f["size"] for f in files if f["name"].endswith(".safetensors") and f.get("size"))
    if hfacts is None and headers:
        hfacts = header_facts(headers, facts["quantization"])
    if hfacts is not None:
        facts.update(hfacts)
        q = facts["quantization"]
        q["quantized_tensors"] = facts["quantized_tensors"]
        q["unquantized_tensors"] = facts["unquantized_tensors"]
    else:
        for k in ("bytes_by_dtype", "num_parameters", "quantized_tensors", "unquantized_tensors", "num_tensors"):
            facts[k] = None
    facts["absent"] = absent
    facts["warnings"] = compatibility_warnings(facts, revision_pinned=bool(revision and HEX40.match(revision)))
    return facts


@contextmanager
def _gc_paused():
    """Parsing ~50 MB of headers allocates millions of small acyclic objects; the cyclic collector would
    rescan them over and over (it tripled the parse time of a 1T checkpoint). Pause it meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def inspect_local(path: str, revision: str | None = None) -> dict:
    """Inspect a checkpoint directory. Reads config.json, the index and every shard header."""
    with _gc_paused():
        return _inspect_local(path, revision)


def _inspect_local(path: str, revision: str | None) -> dict:
    try:
        return _inspect_local_checked(path, revision)
    except (TypeError, AttributeError, KeyError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: a file of the checkpoint has a value of the wrong type ({type(e).__name__}: "
                              f"{e}); check config.json, {INDEX_NAME} and .modelfleet/lock.json") from None


def _inspect_local_checked(path: str, revision: str | None) -> dict:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path}: no config.json; point at the model directory itself")
    config = _load_json_file(cfg_path, "config.json")
    config_facts(config)  # fail early on a bad config
    lock = _read_lock(path)
    if revision is None and lock:
        revision = lock.get("revision") if isinstance(lock.get("revision"), str) else None
    present = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    with _ShardReader(path, present, config_facts(config)["quantization"]) as reader:
        # the shards are being read (in worker processes, where there are several) while the index is parsed
        return _inspect_local_indexed(path, config, lock, revision, present, reader)


def _inspect_local_indexed(path: str, config: dict, lock: dict | None, revision: str | None, present: list[str],
                           reader: _ShardReader) -> dict:
    index_path = os.path.join(path, INDEX_NAME)
    weight_map: dict[str, str] = {}
    absent: list[str] = []
    if os.path.exists(index_path):
        weight_map = _check_index(_load_json_file(index_path, INDEX_NAME, MAX_INDEX_BYTES))
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if s not in present]
        if missing and len(missing) < len(shards):
            raise CheckpointError(f"{missing[0]}: listed in {INDEX_NAME} but absent from {path} "
                                  f"({len(missing)} of {len(shards)} shards missing); fetch the model again")
        if missing:
            absent.append(f"no shard files present ({len(shards)} listed in the index): "
                          "bytes_by_dtype, num_parameters and tensor counts are absent")
            shards = []
    else:
        shards = present
        if not shards:
            absent.append("no index and no *.safetensors files: shard facts are absent")
    hfacts = reader.facts(shards, weight_map) if shards else None
    lock_files = {f["name"]: f for f in (lock or {}).get("files", [])}
    files = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if name.startswith(".") or not os.path.isfile(p):  # isfile: regular files only (FIFOs are skipped)
            continue
        files.append({"name": name, "size": os.path.getsize(p), "sha256": lock_files.get(name, {}).get("sha256")})
    return _assemble(config, weight_map, {}, files, absent, revision, {"kind": "local", "path": path}, hfacts,
                     len(shards))


# A checkpoint's shards are read and counted in worker processes when there are this many or more and the host
# has more than one core: parsing ~200k tensor entries is CPU work (GIL-bound), and what comes back per shard is
# a few counts, not its header.
PARALLEL_SHARDS = 8


def _shard_facts(path: str, shard: str, quant: dict) -> tuple[dict, int, int]:
    """One shard: its header read and validated, its partial facts, and the count and hash sum of its tensor names
    (what the index's tensors for this shard are checked against, without sending names between processes)."""
    header, _dummy = read_local_header(os.path.join(path, shard), shard)
    count, digest = len(header), sum(map(hash, header))
    if "__metadata__" in header:
        count, digest = count - 1, digest - hash("__metadata__")
    return partial_header_facts({shard: header}, quant), count, digest


def _single_threaded() -> bool:
    """Whether this process runs one OS thread, counted by the kernel: threads started below the threading module
    (pytest-xdist's execnet starts them so) do not show in threading.active_count(). Unknown (no /proc): no."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _read_shards(path: str, shards: list[str], quant: dict, conn) -> None:
    """A worker process: `shards` read in order, each one's (name, ok, facts or error) sent on `conn`."""
    for s in shards:
        try:
            out = (s, True, _shard_facts(path, s, quant))
        except Exception as e:  # raised in the parent when this shard's facts are asked for
            out = (s, False, e)
        try:
            conn.send(out)
        except Exception as e:  # what does not pickle is sent as its text
            conn.send((s, False, CheckpointError(f"{s}: {(e if out[1] else out[2])!r}")))
    conn.close()


class _ShardReader:
    """Reads shards' headers into partial facts: with PARALLEL_SHARDS or more shards on a host of several cores, in
    worker processes started at once (the caller meanwhile parses the index), else in order when asked.
    Each worker has its own shards (every n-th, so that shards asked for in order come from each in turn) and its
    own pipe: nothing is shared between the workers, so ending them early (a shard's error, a shard not asked
    for) is a kill. A multiprocessing.Pool shares a task queue whose lock terminate() must take; a worker waiting on
    that queue could hold it, and a run hung there once (2026-12-06)."""

    def __init__(self, path: str, shards: list[str], quant: dict):
        self.path, self.quant = path, quant
        self.workers: list = []
        self.owner: dict[str, int] = {}
        self.got: dict[str, tuple] = {}
        n = min(os.cpu_count() or 1, 4, len(shards))
        # Fork only from a single-threaded process: a child forked while another thread holds a lock (a logger's,
        # the import lock) waits on it forever - found when the suite ran this under pytest-xdist (3 threads) and
        # a worker hung. Module processes and the CLI are single-threaded; anything else reads the shards in order.
        if len(shards) >= PARALLEL_SHARDS and n >= 2 and _single_threaded():
            import multiprocessing

            ctx = multiprocessing.get_context("fork")  # the workers start at once with this module loaded
            for w in range(n):
                mine = shards[w::n]
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_read_shards, args=(path, mine, quant, send), daemon=True)
                proc.start()
                send.close()
                self.workers.append((proc, recv))
                self.owner.update(dict.fromkeys(mine, w))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for proc, conn in self.workers:
            proc.kill()  # a shard not asked for (not in the index, or after an error) is not waited on
            proc.join()
            conn.close()
        self.workers = []

    def _one(self, shard: str) -> tuple[dict, int, int]:
        """One shard's facts: its worker's answer (its error raised here, in the order shards are asked for, as
        the sequential path raises it), or read here when no worker has it or its worker ended without answering."""
        w = self.owner.pop(shard, None)
        while w is not None and shard not in self.got:
            try:
                name, ok, value = self.workers[w][1].recv()
            except (EOFError, OSError):  # the worker is gone (killed from outside): the shard is read here
                break
            self.got[name] = (ok, value)
        if shard not in self.got:
            return _shard_facts(self.path, shard, self.quant)
        ok, value = self.got.pop(shard)
        if not ok:
            raise value
        return value

    def facts(self, shards: list[str], weight_map: dict[str, str]) -> dict:
        """The merged facts of `shards` (in order; the first bad one is named), each checked to hold every tensor
        the index maps to it."""
        from itertools import groupby
        from operator import itemgetter

        counts: dict[str, int] = {}
        digests: dict[str, int] = {}
        # an index lists a shard's tensors together (in runs, at worst one per tensor): sums per run, in C
        for shard, run in groupby(weight_map.items(), key=itemgetter(1)):
            names = list(map(itemgetter(0), run))
            counts[shard] = counts.get(shard, 0) + len(names)
            digests[shard] = digests.get(shard, 0) + sum(map(hash, names))
        parts = []
        for s in shards:
            part, count, digest = self._one(s)
            if weight_map and (count, digest) != (counts.get(s, 0), digests.get(s, 0)):
                self._name_unmapped(s, weight_map)  # a shard with tensors the index does not map is fine
            parts.append(part)
        return merge_header_facts(parts)

    def _name_unmapped(self, shard: str, weight_map: dict[str, str]) -> None:
        header, _dummy = read_local_header(os.path.join(self.path, shard), shard)
        for t, s in weight_map.items():
            if s == shard and t not in header:
                raise CheckpointError(f"{INDEX_NAME}: tensor {t!r} is mapped to {shard} but that shard's header "
                                      "lacks it")


def _read_lock(path: str) -> dict | None:
    """modelfleet's lock for this folder, or None when there is none; a lock of the wrong shape is an error
    (its checksums would otherwise be trusted or silently dropped)."""
    p = os.path.join(path, ".modelfleet", "lock.json")
    if not os.path.exists(p):
        return None
    lock = _load_json_file(p, ".modelfleet/lock.json")
    files = lock.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in files):
        raise CheckpointError(".modelfleet/lock.json: 'files' must be a list of objects with a 'name'; "
                              "fetch the model again to rewrite it")
    return lock


# --------------------------------------------------------------------------- hub inspection
def _json_object(raw: bytes, name: str):
    """A small file of the repository parsed as JSON (its shape is checked by the caller)."""
    try:
        return loads(raw)
    except JSONError as e:
        raise CheckpointError(f"{name}: not valid JSON ({e})") from None


class HeaderNeedsMore(Exception):
    def __init__(self, need: int):
        super().__init__(need)
        self.need = need


def read_stream_prefix(chunks: Iterable[bytes], name: str, file_size: int | None) -> tuple[dict, int]:
    """Parse a safetensors header from a byte stream, consuming only as many chunks as the header needs.
    Works whether the server honoured the Range header (206) or sent the whole body (200)."""
    buf = bytearray()
    it = iter(chunks)
    need = 8
    n = None
    for chunk in it:
        buf += chunk
        if n is None and len(buf) >= 8:
            n = decode_length(name, bytes(buf[:8]), file_size)
            need = 8 + n
        if n is not None and len(buf) >= need:
            break
    if n is None:
        decode_length(name, bytes(buf), file_size)
    if len(buf) < need:
        raise HeaderNeedsMore(need)
    return parse_header(name, bytes(buf[8:need]), n, file_size), len(buf)


def _remote_header(session, url: str, http_headers: dict, name: str, size: int | None) -> tuple[dict, int]:
    """One shard's header over HTTP: a first request for a 1 MiB prefix (enough for most headers); if the
    server honoured Range and the header is longer, a second request for exactly the header."""
    want = 1 << 20
    for _attempt in range(2):
        h = dict(http_headers, Range=f"bytes=0-{want - 1}")
        with session.stream("GET", url, headers=h, follow_redirects=True) as r:
            if r.status_code >= 400:
                raise CheckpointError(f"{name}: GET answered HTTP {r.status_code}")
            try:
                return read_stream_prefix(r.iter_bytes(65536), name, size)
            except HeaderNeedsMore as more:
                if r.status_code != 206:
                    raise CheckpointError(f"{name}: stream ended inside the {more.need}-byte header") from None
                want = more.need
    raise CheckpointError(f"{name}: server did not return the {want}-byte header")


def transport_errors() -> tuple:
    """Connection-level exceptions of whichever HTTP library huggingface_hub uses."""
    errs: list = [OSError]
    for mod in ("httpx2", "httpx", "requests"):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "TimeoutException"):
            if hasattr(m, name):
                errs.append(getattr(m, name))
    return tuple(errs)


# requests in flight to the hub after its listing (config, index, shard headers): each header is one or two small
# requests, so the inspection's time is round trips (64 shards for Kimi-K2.5, 163 for DeepSeek-V3.2: 10-50 s one
# after another at 100-300 ms each; 16 at once: 0.5-3 s)
HEADER_READS_AT_ONCE = 16


def inspect_hub(repo_id: str, revision: str = "main", endpoint: str | None = None, token: str | None = None,
                on_read: Callable[[str, int], None] | None = None, parallel: int = HEADER_READS_AT_ONCE) -> dict:
    """Inspect a hub repo at a revision without downloading weights; up to `parallel` shard headers are read at
    once (the facts are the same whatever the number)."""
    if not isinstance(parallel, int) or parallel < 1:
        raise CheckpointError(f"parallel header reads must be a whole number >= 1, got {parallel!r}")
    with _gc_paused():
        return _inspect_hub(repo_id, revision, endpoint, token, on_read, parallel)


def _inspect_hub(repo_id, revision, endpoint, token, on_read, parallel=1) -> dict:
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import hub_listing
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    try:
        sha, listing = hub_listing(repo_id, revision, endpoint, token)
    except ModelfleetError as e:
        raise CheckpointError(str(e)) from None
    files = {f["name"]: {"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in listing}
    session = get_session()
    headers_http = build_hf_headers(token=token)

    def get_small(name: str, cap: int = MAX_CONFIG_BYTES) -> bytes:
        url = hf_hub_url(repo_id, name, revision=sha, endpoint=endpoint)
        with session.stream("GET", url, headers=headers_http, follow_redirects=True) as r:
            if r.status_code >= 400:
                raise CheckpointError(f"{repo_id}@{sha[:12]}: GET {name} answered HTTP {r.status_code}")
            data = bytearray()
            for c in r.iter_bytes():
                data += c
                if len(data) > cap:
                    raise CheckpointError(f"{name}: larger than the {cap}-byte limit for this file")
            return bytes(data)

    if "config.json" not in files:
        raise CheckpointError(f"{repo_id}@{sha[:12]}: no config.json in the repository")

    def read_header(s):
        # huggingface_hub's session is safe to share between threads (one connection pool)
        return _remote_header(session, hf_hub_url(repo_id, s, revision=sha, endpoint=endpoint), headers_http, s,
                              files[s]["size"])

    from concurrent.futures import ThreadPoolExecutor

    # Everything after the listing is read at once (bounded): config.json, the index and the header of every
    # top-level shard the listing names - the index, when there is one, only decides which of those count. Round
    # trips, not bytes, are this inspection's time against a far-away hub.
    listed = sorted(n for n in files if n.endswith(".safetensors") and "/" not in n)
    headers = {}
    bytes_read = 0
    with ThreadPoolExecutor(max_workers=min(parallel, 2 + len(listed))) as pool:
        futures: dict = {}
        small: dict = {}
        try:
            small = {"config.json": pool.submit(get_small, "config.json")}
            if INDEX_NAME in files:
                small[INDEX_NAME] = pool.submit(get_small, INDEX_NAME, MAX_INDEX_BYTES)
            futures = {s: pool.submit(read_header, s) for s in listed}
            config = _json_object(small["config.json"].result(), "config.json")
            config_facts(config)
            weight_map: dict[str, str] = {}
            if INDEX_NAME in small:
                weight_map = _check_index(_json_object(small[INDEX_NAME].result(), INDEX_NAME))
                shards = sorted(set(weight_map.values()))
                for s in shards:
                    if s not in files:
                        raise CheckpointError(f"{s}: listed in {INDEX_NAME} but absent from {repo_id}@{sha[:12]}")
                for s in futures.keys() - set(shards):  # a file the index does not use is not the model's
                    futures.pop(s).cancel()
            else:
                shards = listed
            for s in shards:  # in shard order: the first bad shard in that order is the one named
                header, nread = futures[s].result()
                bytes_read += nread
                if on_read:
                    on_read(s, nread)
                headers[s] = header
        except BaseException:
            for f in list(futures.values()) + list(small.values()):
                f.cancel()
            raise
    _cross_check(weight_map, headers)
    facts = _assemble(config, weight_map, headers, sorted(files.values(), key=lambda f: f["name"]), [], sha,
                      {"kind": "hub", "repo_id": repo_id, "requested_revision": revision,
                       "endpoint": endpoint})
    facts["header_bytes_read"] = bytes_read
    return facts

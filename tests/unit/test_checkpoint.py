"""checkpoint_inspect's logic against real configs and tensor layouts (tests/fixtures/checkpoints), a
shape-faithful synthetic Kimi-K2.5 INT4 checkpoint, and malformed inputs."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import config_facts, inspect_local
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import CheckpointError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.safetensors_header import encode_header

from tests.conftest import FIXTURES, ROOT

CK = FIXTURES / "checkpoints"
KIMI_TENSOR_BYTES = 595_148_192_736  # the inventory's rows re-summed (tests/fixtures/README.md)


@pytest.fixture(scope="session")
def kimi_synthetic(tmp_path_factory):
    from modelfleet.harness.synthetic import write_checkpoint

    out = tmp_path_factory.mktemp("kimi") / "Kimi-K2.5"
    info = write_checkpoint(CK / "kimi-k2.5-tensor-inventory.md", CK / "kimi-k2.5-config.json", out)
    assert info == {"shards": 64, "tensors": 208_550, "tensor_bytes": KIMI_TENSOR_BYTES}
    return out


def test_kimi_k25_int4_header_only(kimi_synthetic):
    f = inspect_local(str(kimi_synthetic))
    assert f["architecture"] == "KimiK25ForConditionalGeneration"
    assert f["text_model_type"] in ("deepseek_v3", "kimi_k2")
    assert f["attention"] == "mla"
    assert (f["num_layers"], f["hidden_size"], f["num_experts"], f["experts_per_token"]) == (61, 7168, 384, 8)
    assert f["vocab_size"] == 163840 and f["max_position_embeddings"] == 262144
    assert f["num_shards"] == 64
    assert f["tensor_bytes"] == KIMI_TENSOR_BYTES
    # the files are the real apparent size: tensors + our headers (a few tens of MB)
    assert KIMI_TENSOR_BYTES < f["shard_bytes"] < KIMI_TENSOR_BYTES + 40 * 10**6
    q = f["quantization"]
    assert q["method"] == "compressed-tensors"
    assert (q["bits"], q["group_size"], q["symmetric"], q["format"]) == (4, 32, True, "pack-quantized")
    assert q["kv_cache_scheme"] is None
    assert "re:.*self_attn.*" in q["ignore"] and "lm_head" in q["ignore"]
    # measured from the headers: 60 MoE layers x 384 experts x 3 projections, nothing else
    assert f["quantized_tensors"] == 60 * 384 * 3 == q["quantized_tensors"]
    assert f["quantized_by_kind"] == {"experts": 69120}
    assert f["only_experts_quantized"] is True
    assert f["unquantized_by_kind"]["attention"] == 61 * 5
    assert f["bytes_by_dtype"]["I32"] == 60 * 384 * (7168 * 256 + 2048 * 896 * 2) * 4 + 60 * 384 * 3 * 2 * 4
    # logical parameters: packed int32 holds 8 INT4 values; scales and weight_shape are not parameters
    experts = 60 * 384 * 3 * 7168 * 2048
    assert experts < f["num_parameters"] < experts + 40 * 10**9
    assert 1.0e12 < f["num_parameters"] < 1.1e12
    assert any("trust_remote_code" in w for w in f["warnings"])


def test_kimi_inspection_reads_only_headers(kimi_synthetic):
    """A traced run: the bytes read from the shards are exactly the header bytes."""
    code = (
        "import multiprocessing, os, sys; sys.path.insert(0, {!r})\n"
        "total = multiprocessing.Value('q', 0)\n"  # shared with the forked workers that read shards in parallel
        "real_fdopen = os.fdopen\n"
        "def counted(fd, mode='r', *a, **k):\n"  # shards are opened as descriptors (open_regular)
        "    f = real_fdopen(fd, mode, *a, **k)\n"
        "    if os.readlink(f'/proc/self/fd/{{fd}}').endswith('.safetensors'):\n"
        "        orig = f.read\n"
        "        def read(n=-1):\n"
        "            b = orig(n)\n"
        "            with total.get_lock(): total.value += len(b)\n"
        "            return b\n"
        "        f.read = read\n"
        "    return f\n"
        "os.fdopen = counted\n"
        "from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import inspect_local\n"
        "f = inspect_local({!r})\n"
        "print(total.value, f['shard_bytes'] - f['tensor_bytes'])\n"
    ).format(str(ROOT / "src"), str(kimi_synthetic))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    read, header_bytes = int(out[0]), int(out[1])
    assert read == header_bytes  # 8-byte prefixes + JSON headers, not one weight byte


INSPECT_IN = """
import json, multiprocessing, os, sys
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import checkpoint
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import CheckpointError
checkpoint.PARALLEL_SHARDS = int(sys.argv[2])
checkpoint.os.cpu_count = lambda: 2
forks = []
real = multiprocessing.get_context
multiprocessing.get_context = lambda m=None: forks.append(m) or real(m)
if sys.argv[3] == "threaded":  # a thread started below the threading module, as execnet's are
    import _thread, time
    _thread.start_new_thread(time.sleep, (600,))
if sys.argv[3] == "workers-die":  # every worker ends without an answer, as one killed from outside would
    checkpoint._read_shards = lambda *a: os._exit(1)
errors = set()
for _ in range(int(sys.argv[4])):
    try:
        out = {"facts": checkpoint.inspect_local(sys.argv[1])}
    except CheckpointError as e:
        out = {"error": str(e)}
    errors.add(out.get("error"))
out["errors"] = sorted(errors, key=str)
out["forks"] = forks
out["children"] = [c for t in os.listdir("/proc/self/task")
                   for c in open(f"/proc/self/task/{t}/children").read().split()]
print(json.dumps(out))
"""


def _inspect_in_a_process(path, threshold: int, threads: str = "single", repeat: int = 1) -> dict:
    """inspect_local in a fresh single-threaded process (as a module or the CLI runs it; pytest-xdist's workers
    have threads, in which the shards are read in order), with a chosen parallel threshold and two cores, `repeat`
    times: the last run's facts or error, every distinct error (None for a run that passed), the forks, and the
    process's children left at the end."""
    r = subprocess.run([sys.executable, "-c", INSPECT_IN, str(path), str(threshold), threads, str(repeat)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_shards_read_in_parallel_give_the_sequential_facts(kimi_synthetic):
    sequential = _inspect_in_a_process(kimi_synthetic, 10**9)
    parallel = _inspect_in_a_process(kimi_synthetic, 2)
    assert sequential["forks"] == [] and parallel["forks"] == ["fork"]
    assert parallel["facts"] == sequential["facts"]
    assert sequential["facts"]["num_tensors"] > 200_000 and sequential["facts"]["only_experts_quantized"] is True


def test_a_process_with_threads_never_forks_for_the_shards(kimi_synthetic):
    threaded = _inspect_in_a_process(kimi_synthetic, 2, "threaded")
    assert threaded["forks"] == [] and threaded["facts"] == _inspect_in_a_process(kimi_synthetic, 10**9)["facts"]


def test_a_bad_shard_read_in_parallel_is_named_as_it_is_sequentially(kimi_synthetic, tmp_path):
    for p in kimi_synthetic.iterdir():  # the same checkpoint by links (its shards are large sparse files) ...
        (tmp_path / p.name).symlink_to(p)
    shards = sorted(p.name for p in kimi_synthetic.glob("*.safetensors"))
    bad, later = shards[37], shards[50]  # ... but two shards with broken headers
    for name in (bad, later):
        (tmp_path / name).unlink()
        (tmp_path / name).write_bytes(struct.pack("<Q", 12) + b"{not json}  ")
    sequential = _inspect_in_a_process(tmp_path, 10**9)
    parallel = _inspect_in_a_process(tmp_path, 2)
    assert parallel["forks"] == ["fork"]
    assert parallel["error"] == sequential["error"] and sequential["error"].startswith(f"{bad}: header is not valid")


def test_an_early_bad_shard_in_parallel_ends_the_workers_every_time(kimi_synthetic, tmp_path):
    """The error path, many times over: the first shard fails while every worker is still reading, and the
    reader must end them all and raise, never wait (a multiprocessing.Pool's terminate() hung here once)."""
    for p in kimi_synthetic.iterdir():
        (tmp_path / p.name).symlink_to(p)
    bad = sorted(p.name for p in kimi_synthetic.glob("*.safetensors"))[1]
    (tmp_path / bad).unlink()
    (tmp_path / bad).write_bytes(struct.pack("<Q", 12) + b"{not json}  ")
    out = _inspect_in_a_process(tmp_path, 2, repeat=10)
    assert len(out["errors"]) == 1 and out["errors"][0].startswith(f"{bad}: header is not valid"), out["errors"]
    assert out["children"] == []  # no worker is left behind


def test_a_worker_that_ends_without_answering_leaves_its_shards_to_the_caller(kimi_synthetic):
    sequential = _inspect_in_a_process(kimi_synthetic, 10**9)
    out = _inspect_in_a_process(kimi_synthetic, 2, "workers-die")
    assert out["errors"] == [None] and out["facts"] == sequential["facts"] and out["children"] == []


def _with_index(kimi_synthetic, tmp_path, change) -> Path:
    """The synthetic checkpoint by links, with its index rewritten by `change(weight_map)`."""
    for p in kimi_synthetic.iterdir():
        if p.name != "model.safetensors.index.json":
            (tmp_path / p.name).symlink_to(p)
    index = json.loads((kimi_synthetic / "model.safetensors.index.json").read_text())
    change(index["weight_map"])
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


def test_an_index_that_swaps_two_tensors_between_shards_is_caught(kimi_synthetic, tmp_path):
    """Each shard keeps its count of mapped tensors: only the names say which shard is wrong, in both paths."""
    def swap(wm):
        a = next(t for t, s in wm.items() if s.startswith("model-00010-"))
        b = next(t for t, s in wm.items() if s.startswith("model-00020-"))
        wm[a], wm[b] = wm[b], wm[a]

    path = _with_index(kimi_synthetic, tmp_path, swap)
    sequential, parallel = _inspect_in_a_process(path, 10**9), _inspect_in_a_process(path, 2)
    assert parallel["forks"] == ["fork"] and parallel["error"] == sequential["error"]
    assert "is mapped to model-00010-of-000064.safetensors but that shard's header lacks it" in sequential["error"]


def test_a_shard_may_hold_tensors_the_index_does_not_map(kimi_synthetic, tmp_path):
    def drop(wm):
        del wm[next(t for t, s in wm.items() if s.startswith("model-00030-"))]

    path = _with_index(kimi_synthetic, tmp_path, drop)
    sequential, parallel = _inspect_in_a_process(path, 10**9), _inspect_in_a_process(path, 2)
    assert "error" not in sequential and parallel["facts"] == sequential["facts"]
    assert sequential["facts"]["num_tensors"] == 208550  # the header's tensors are counted, mapped or not


def test_config_only_directory_gives_config_facts(tmp_path):
    shutil.copy(CK / "kimi-k2.5-config.json", tmp_path / "config.json")
    f = inspect_local(str(tmp_path))
    assert f["attention"] == "mla" and f["quantization"]["bits"] == 4
    assert f["num_parameters"] is None and f["bytes_by_dtype"] is None
    assert f["absent"] and "shard facts are absent" in f["absent"][0]


def test_config_plus_index_without_shards(tmp_path, kimi_synthetic):
    shutil.copy(CK / "kimi-k2.5-config.json", tmp_path / "config.json")
    shutil.copy(kimi_synthetic / "model.safetensors.index.json", tmp_path)
    f = inspect_local(str(tmp_path))
    assert f["num_shards"] == 64
    assert "no shard files present (64 listed" in f["absent"][0]


@pytest.mark.parametrize("fixture,expect", [
    ("deepseek-v3-config.json", {"attention": "mla", "num_experts": 256, "method": "fp8", "bits": 8}),
    ("kimi-k2-instruct-config.json", {"attention": "mla", "num_experts": 384, "method": "fp8", "bits": 8}),
    ("minimax-m2.7-config.json", {"attention": "gqa", "num_experts": 256, "method": "fp8", "bits": 8}),
    ("qwen3-8b-config.json", {"attention": "gqa", "num_experts": 0, "method": "none", "bits": None}),
])
def test_real_configs(fixture, expect):
    f = config_facts(json.loads((CK / fixture).read_text()))
    got = {"attention": f["attention"], "num_experts": f["num_experts"],
           "method": f["quantization"]["method"], "bits": f["quantization"]["bits"]}
    assert got == expect


def test_minimax_fp8_synthetic_counts(tmp_path):
    from modelfleet.harness.synthetic import write_checkpoint

    info = write_checkpoint(CK / "minimax-m2.7-tensor-inventory.md", CK / "minimax-m2.7-config.json", tmp_path)
    f = inspect_local(str(tmp_path))
    assert f["num_shards"] == info["shards"] == 125
    assert f["quantized_by_kind"]["experts"] == 62 * 256 * 3
    assert f["quantized_by_kind"]["attention"] > 0  # MiniMax FP8 quantizes attention too
    assert f["only_experts_quantized"] is False


def test_tiny_model(tiny_model):
    f = inspect_local(str(tiny_model))
    assert f["attention"] == "gqa" and f["num_shards"] == 3 and f["quantization"]["method"] == "none"
    assert f["bytes_by_dtype"] == {"BF16": f["tensor_bytes"]}


# ------------------------------------------------------------------ malformed inputs
def _shard(path, tensors=None, raw_header=None, prefix=None, data_bytes=None, truncate=None):
    tensors = tensors or {"w.weight": ("BF16", [4, 4])}
    if raw_header is not None:
        body = raw_header
        pre = struct.pack("<Q", len(body)) + body
        data = 32
    else:
        pre, data = encode_header(tensors)
    if prefix is not None:
        pre = prefix + pre[8:]
    blob = pre + b"\0" * (data if data_bytes is None else data_bytes)
    if truncate is not None:
        blob = blob[:truncate]
    path.write_bytes(blob)


def _model(tmp_path, config=None, index=True, shards=("model-00001-of-00001.safetensors",)):
    cfg = config if config is not None else {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                              "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}
    (tmp_path / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    if index:
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w.weight": shards[0]}}) if index is True else index)
    return tmp_path / shards[0]


def _bad(tmp_path, **kw):
    return kw


GOOD = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}

MALFORMED = {
    "truncated prefix": (lambda p: _shard(p, truncate=5), "truncated safetensors file"),
    "empty shard": (lambda p: p.write_bytes(b""), "truncated safetensors file"),
    "huge header length": (lambda p: _shard(p, prefix=struct.pack("<Q", 2**40)), "exceeds the 100000000-byte"),
    "header past EOF": (lambda p: _shard(p, truncate=20), "runs past the end of the file"),
    "header length zero": (lambda p: _shard(p, prefix=struct.pack("<Q", 0)), "too small"),
    "bad JSON": (lambda p: _shard(p, raw_header=b"{not json"), "not valid JSON"),
    "header not object": (lambda p: _shard(p, raw_header=b"[1,2,3]   "), "not an object"),
    "header not utf8": (lambda p: _shard(p, raw_header=b'{"\xff\xfe": 1}'), "not valid JSON"),
    "unknown dtype": (lambda p: _shard(p, raw_header=b'{"w.weight":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}'),
                      "unknown dtype 'Q7'"),
    "negative dim": (lambda p: _shard(p, raw_header=b'{"w.weight":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}'),
                     "invalid shape"),
    "string dim": (lambda p: _shard(p, raw_header=b'{"w.weight":{"dtype":"U8","shape":["a"],"data_offsets":[0,1]}}'),
                   "invalid shape"),
    "offsets reversed": (lambda p: _shard(p, raw_header=b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[5,1]}}'),
                         "invalid data_offsets"),
    "offsets leave file": (lambda p: _shard(p, data_bytes=3), "leave the file"),
    "offsets vs shape": (lambda p: _shard(p, raw_header=b'{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,4]}}'),
                         "needs 8"),
    "entry missing keys": (lambda p: _shard(p, raw_header=b'{"w.weight":{"dtype":"BF16"}}'),
                           "lacks dtype, shape or data_offsets"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_shard(tmp_path, case):
    make, needle = MALFORMED[case]
    shard = _model(tmp_path)
    make(shard)
    with pytest.raises(CheckpointError) as e:
        inspect_local(str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("model-00001-of-00001.safetensors:"), msg
    assert needle in msg, msg


CONFIG_CASES = {
    "no architectures": ({"hidden_size": 8}, "no 'architectures' list"),
    "architectures not list": ({**GOOD, "architectures": "Llama"}, "no 'architectures' list"),
    "hidden_size missing": ({"architectures": ["X"], "num_hidden_layers": 1, "num_attention_heads": 1},
                            "hidden_size is missing"),
    "layers not int": ({**GOOD, "num_hidden_layers": "61"}, "num_hidden_layers is missing or not a positive"),
    "unknown quant method": ({**GOOD, "quantization_config": {"quant_method": "gptq-magic"}},
                             "unknown quantization method 'gptq-magic'"),
    "compressed-tensors without groups": ({**GOOD, "quantization_config": {"quant_method": "compressed-tensors"}},
                                          "has no config_groups"),
    "config not JSON": ("{oops", "not valid JSON"),
    "config not object": ("[1]", "not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_malformed_config(tmp_path, case):
    cfg, needle = CONFIG_CASES[case]
    _model(tmp_path, config=cfg)
    with pytest.raises(CheckpointError) as e:
        inspect_local(str(tmp_path))
    assert str(e.value).startswith("config.json:"), str(e.value)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_shard_listed_in_index(tmp_path):
    _model(tmp_path, index=json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                      "b": "model-00002-of-00002.safetensors"}}),
           shards=("model-00001-of-00002.safetensors",))
    _shard(tmp_path / "model-00001-of-00002.safetensors", tensors={"a": ("BF16", [2])})
    with pytest.raises(CheckpointError, match=r"^model-00002-of-00002.safetensors: listed in model.safetensors.index"):
        inspect_local(str(tmp_path))


def test_index_names_tensor_absent_from_shard(tmp_path):
    shard = _model(tmp_path, index=json.dumps({"weight_map": {"ghost": "model-00001-of-00001.safetensors"}}))
    _shard(shard)
    with pytest.raises(CheckpointError, match="tensor 'ghost' is mapped to model-00001-of-00001.safetensors"):
        inspect_local(str(tmp_path))


@pytest.mark.parametrize("index,needle", [
    ("{bad", "not valid JSON"),
    ('{"weight_map": {}}', "no 'weight_map'"),
    ('{"weight_map": {"a": "../../etc/passwd.safetensors"}}', "invalid shard name"),
])
def test_malformed_index(tmp_path, index, needle):
    _model(tmp_path, index=index)
    with pytest.raises(CheckpointError) as e:
        inspect_local(str(tmp_path))
    assert str(e.value).startswith("model.safetensors.index.json:") and needle in str(e.value)


def test_not_a_directory_and_no_config(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        inspect_local(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no config.json"):
        inspect_local(str(tmp_path))


def test_cli_error_is_one_line_no_traceback(tmp_path):
    _model(tmp_path)
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\x01")
    r = subprocess.run([sys.executable, "-m", "modelfleet.cli", "inspect", str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "model-00001-of-00001.safetensors: truncated safetensors file" in r.stderr

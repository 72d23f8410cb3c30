"""The bad-input suite (issue 19): what a new user and a careless admin really type, across the CLI, the
modules run as modules, fleet files, profiles and unit rendering. Every case asserts the exit status (or
the typed error), that the message names the offending field and the fix, that no traceback is printed,
and that nothing changed on disk (a snapshot of the case's folder before and after). The count per area is
printed at the end of the run (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import profiles, vllm_unit
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.safetensors_header import encode_header
from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet

from tests.fs_snapshot import snapshot

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {p.stem for p in (ROOT / "profiles").glob("*.yml")}
REV = "0123456789abcdef0123456789abcdef01234567"
TRACE = re.compile(r"Traceback \(most recent call last\)|^\s+File \".*\", line \d+", re.M)


def sandbox(tmp: Path) -> dict:
    """A models root with one complete model, a checkpoint folder and a few hostile things."""
    root = tmp / "models"
    m = root / "org--m" / REV
    (m / ".modelfleet").mkdir(parents=True)
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                         "intermediate_size": 128, "vocab_size": 100})
    (m / "config.json").write_text(config)
    prefix, nbytes = encode_header({"model.embed_tokens.weight": ("BF16", [100, 64])})
    (m / "model.safetensors").write_bytes(prefix + b"\x00" * nbytes)
    (m / ".modelfleet" / "complete").touch()
    (root / "datasets").mkdir()
    (root / "datasets" / "a.parquet").write_bytes(b"PAR1")
    ck = tmp / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    fifo = tmp / "fifo-ck"
    fifo.mkdir()
    (fifo / "config.json").write_text(config)
    os.mkfifo(fifo / "model.safetensors")
    (tmp / "a-file").write_text("x")
    (tmp / "shared-key").write_text("sekrit\n")
    os.chmod(tmp / "shared-key", 0o644)
    (tmp / "bad.json").write_text("{not json")
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "bad.fleet.yml").write_text("plugin: fleet\ngroups:\n  g:\n    gpu: {count: 0}\n    hosts:\n      a: {}\n")
    out = tmp.parent / f"{tmp.name}-out"
    out.mkdir(exist_ok=True)
    return {"root": str(root), "model": str(m), "ck": str(ck), "fifo": str(fifo), "tmp": str(tmp), "out": str(out)}


def check_message(text: str, needles: tuple[str, ...]):
    assert not TRACE.search(text), text[-2000:]
    for n in needles:
        assert re.search(n, text), f"{n!r} not in: {text[-1500:]}"


# --------------------------------------------------------------------------------------------- the CLI
# (argv with {root} {model} {ck} {fifo} {tmp} placeholders, exit status, needles: the field and the fix)
BENCH = ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--out", "{tmp}/out"]
CLI = [
    ("inspect", ["inspect", "{tmp}/nope"], 2, ("nope", "not a directory|does not exist|repo id")),
    ("inspect", ["inspect", "{tmp}/a-file"], 2, ("a-file",)),
    ("inspect", ["inspect", "{tmp}"], 2, ("no config.json", "point at the model directory")),
    ("inspect", ["inspect", "{ck}"], 2, ("config.json", "architectures")),
    ("inspect", ["inspect", "{fifo}"], 2, ("model.safetensors", "not a regular file")),
    ("inspect", ["inspect", "../../etc/passwd/x"], 2, ("passwd|not a directory|repo",)),
    ("inspect", ["inspect", "org/name/extra"], 2, ("org/name/extra|repo",)),
    ("inspect", ["inspect"], 2, ("source",)),
    ("plan", ["plan", "{model}", "--gpus", "0", "--gpu-memory-gib", "96"], 2, ("--gpus", ">= 1")),
    ("plan", ["plan", "{model}", "--gpus", "-8", "--gpu-memory-gib", "96"], 2, ("--gpus",)),
    ("plan", ["plan", "{model}", "--gpus", "eight", "--gpu-memory-gib", "96"], 2, ("--gpus", "invalid int")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "0"], 2, ("--gpu-memory-gib", "e.g. 96")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "nan"], 2, ("--gpu-memory-gib", "nan")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "inf"], 2, ("--gpu-memory-gib", "inf")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--kv-cache-dtype", "banana"], 2,
     ("kv_cache_dtype 'banana'", "one of")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--compute-capability", "banana"], 2,
     ("compute capability 'banana'", "MAJOR.MINOR")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--compute-capability", "12"], 2,
     ("compute capability '12'", "12.0")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--compute-capability", "12.0",
              "--kv-cache-dtype", "FP8"], 2, ("SM120", "kv_cache_dtype: auto")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--gpu-memory-utilization", "1.5"], 2,
     ("gpu_memory_utilization", r"\(0, 1\]")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--gpu-memory-utilization", "0"], 2,
     ("gpu_memory_utilization",)),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--input-len", "0"], 2, ("length",)),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--interconnect", "carrier-pigeon"], 2,
     ("--interconnect", "invalid choice")),
    ("plan", ["plan", "{model}", "--gpus", "8", "--gpu-memory-gib", "96", "--profile", "no-such-profile"], 2,
     ("no-such-profile",)),
    ("plan", ["plan", "{ck}", "--gpus", "8", "--gpu-memory-gib", "96"], 2, ("config.json",)),
    ("plan", ["plan", "{model}", "--gpu-memory-gib", "96"], 2, ("--gpus",)),
    ("plan-disk", ["plan-disk", "--root", "/", "--need-bytes", "1"], 2, ("models root", "use a folder of their own")),
    ("plan-disk", ["plan-disk", "--root", "//", "--need-bytes", "1"], 2, ("'//' is /",)),
    ("plan-disk", ["plan-disk", "--root", "/x/..", "--need-bytes", "1"], 2, ("'..'",)),
    ("plan-disk", ["plan-disk", "--root", "/etc", "--need-bytes", "1"], 2, ("system folder /etc",)),
    ("plan-disk", ["plan-disk", "--root", "/boot", "--need-bytes", "1"], 2, ("system folder /boot",)),
    ("plan-disk", ["plan-disk", "--root", "/var/lib", "--need-bytes", "1"], 2, ("system folder /var/lib",)),
    ("plan-disk", ["plan-disk", "--root", "models", "--need-bytes", "1"], 2, ("relative", "absolute path")),
    ("plan-disk", ["plan-disk", "--root", "", "--need-bytes", "1"], 2, ("empty",)),
    ("plan-disk", ["plan-disk", "--root", "{tmp}/nope", "--need-bytes", "1", "--no-units"], 2,
     ("does not exist", "mkdir -p")),
    ("plan-disk", ["plan-disk", "--root", "{tmp}/a-file", "--need-bytes", "1", "--no-units"], 2,
     ("not a folder",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "nan", "--no-units"], 2,
     ("not a size: 'nan'", "KB/MB/GB")),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "inf", "--no-units"], 2, ("'inf'",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "1e400", "--no-units"], 2,
     ("larger than any disk",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "-5", "--no-units"], 2, ("negative",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "595 gigs", "--no-units"], 2, ("not a size",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "0.5B", "--no-units"], 2, ("whole|not a size",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "1", "--headroom-bytes", "NaN", "--no-units"],
     2, ("not a size",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "1", "--headroom-percent", "150",
                   "--no-units"], 2, ("headroom percent",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "1", "--protect", "/etc", "--no-units"], 2,
     ("outside the models root",)),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "1"], 2,
     ("cannot read the host's services", "--no-units")),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "10PB", "--delete", "{root}/datasets",
                   "--no-units"], 1, ("not a model, never deleted", "cannot make room")),
    ("plan-disk", ["plan-disk", "--root", "{root}", "--need-bytes", "10PB", "--delete", "/etc", "--no-units"], 1,
     ("not a model directory under the root",)),
    ("plan-disk", ["plan-disk", "--need-bytes", "1"], 2, ("--root",)),
    ("report", ["report", "{tmp}/nope.json", "--out", "{tmp}/out"], 2, ("nope.json",)),
    ("report", ["report", "{tmp}/bad.json", "--out", "{tmp}/out"], 2, ("bad.json", "not a readable")),
    ("report", ["report", "{tmp}/list.json", "--out", "{tmp}/out"], 2, ("list.json",)),
    ("report", ["report", "--compare", "{tmp}/nope", "--out", "{tmp}/out"], 2, ("nope",)),
    ("bench", [*BENCH, "--api-key", "k"], 2,
     ("unrecognized arguments: --api-key",)),
    ("bench", [*BENCH, "--api-key-file", "{tmp}/shared-key"], 2,
     ("readable or writable by group/others", "chmod 600")),
    ("bench", [*BENCH, "--api-key-file", "{tmp}/nope"], 2,
     ("api-key-file", "cannot read")),
    ("bench", [*BENCH, "--max-concurrency", "x"], 2,
     ("--max-concurrency", "invalid int")),
    ("bench", [*BENCH, "--thinking-budget", "-1", "--endpoint", "chat"], 2,
     ("thinking_budget must be a whole number of tokens >= 0", "got -1")),
    ("bench", [*BENCH, "--thinking-budget", "8"], 2, ("thinking_budget", "set endpoint to chat")),
    ("deploy", ["deploy", "tiny-llama", "-i", "{tmp}/bad.fleet.yml"], 2,
     ("fleet file does not validate", r"bad.fleet.yml:\d+", "gpu")),
    ("deploy", ["deploy", "tiny-llama", "-i", "{tmp}/nope.fleet.yml"], 2, ("nope.fleet.yml", "not found")),
    ("deploy", ["deploy", "tiny-llama", "-i", str(ROOT / "inventory/local/local.fleet.yml"), "-l", "nosuch"], 2,
     ("--limit 'nosuch' matches no host", "mf-node-1")),
    ("status", ["status", "-i", "{tmp}/bad.fleet.yml"], 2, ("fleet file does not validate",)),
    ("status", ["status", "-i", str(ROOT / "inventory/local/local.fleet.yml"), "-l", "gpu-99"], 2,
     ("matches no host",)),
    ("bench", ["bench", "-i", "{tmp}/bad.fleet.yml"], 2, ("fleet file does not validate",)),
]


@pytest.mark.bad_input("cli")
@pytest.mark.parametrize("argv,rc,needles", [c[1:] for c in CLI], ids=[f"{c[0]}-{i}" for i, c in enumerate(CLI)])
def test_cli(tmp_path, argv, rc, needles):
    s = sandbox(tmp_path)
    argv = [a.format(**s) for a in argv]
    before = snapshot(tmp_path)
    env = dict(os.environ, MODELFLEET_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT / "src"))
    env.pop("MODELFLEET_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "modelfleet.cli", *argv], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == rc, (r.returncode, r.stdout[-800:], r.stderr[-800:])
    check_message(r.stdout + r.stderr, needles)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if "/state" not in k} == before


# --------------------------------------------------------------------------------------- modules as modules
MODULES = [
    ("disk_plan", {"root": "/", "required_bytes": 1}, ("models root", "'/' is /")),
    ("disk_plan", {"root": "/etc", "required_bytes": 1}, ("system folder /etc",)),
    ("disk_plan", {"root": "/x/..", "required_bytes": 1}, ("'..'",)),
    ("disk_plan", {"root": "{root}", "required_bytes": "nan", "read_units": False}, ("required_bytes", "not a size")),
    ("disk_plan", {"root": "{root}", "required_bytes": "1e400", "read_units": False}, ("larger than any disk",)),
    ("disk_plan", {"root": "{root}", "required_bytes": -1, "read_units": False}, ("negative",)),
    ("disk_plan", {"root": "{root}", "required_bytes": True, "read_units": False}, ("not a size",)),
    ("disk_plan", {"root": "{root}", "required_bytes": 1}, ("cannot read the host's services",
                                                             "storage_cleanup_read_units: false")),
    ("disk_plan", {"root": "{tmp}/nope", "required_bytes": 1, "read_units": False}, ("does not exist",)),
    ("disk_plan", {"root": "{root}", "required_bytes": 1, "protected": ["/etc"], "read_units": False},
     ("outside the models root",)),
    ("disk_plan", {"required_bytes": 1}, ("root",)),
    ("storage_reclaim", {"root": "/", "required_bytes": 1}, ("'/' is /",)),
    ("storage_reclaim", {"root": "//", "required_bytes": 1}, ("'//' is /",)),
    ("storage_reclaim", {"root": "/boot", "required_bytes": 1}, ("system folder /boot",)),
    ("storage_reclaim", {"root": "{root}", "required_bytes": "inf", "read_units": False},
     ("required_bytes", "not a size")),
    ("storage_reclaim", {"root": "{root}", "required_bytes": 10**15, "read_units": False,
                         "lock_path": "{out}/lock", "log_path": "{out}/log"},
     ("cannot make room", "Nothing was deleted")),
    ("storage_reclaim", {"root": "{root}", "required_bytes": 1, "lock_path": "{out}/lock", "log_path": "{out}/log"},
     ("cannot read the host's services",)),
    ("storage_reclaim", {"root": "{root}", "required_bytes": 1, "mode": "nuke"}, ("mode", "make_room")),
    ("storage_reclaim", {"root": "{root}", "required_bytes": 10**15, "explicit": ["{root}/datasets"],
                         "read_units": False, "lock_path": "{out}/lock", "log_path": "{out}/log"},
     ("cannot make room",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/m",
                   "extra_environment": {"A": "x\nUser=root"}}, ("A contains a newline", "one line")),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/m",
                   "extra_environment": {"BAD KEY": "1"}}, ("not a variable name",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/m",
                   "extra_environment": {"HOME": "/root"}}, ("HOME is set by modelfleet",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/m",
                   "api_key": "a\nb", "api_key_set": True}, ("vllm_service_api_key contains a newline",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/m",
                   "api_key": "a b", "api_key_set": True}, ("vllm_service_api_key contains", "blanks")),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/"},
     ("cache folder", "vllm_service_cache_root")),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "rel"},
     ("absolute",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/var/cache/a b"},
     ("blanks",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/c", "port": 70000},
     ("port 70000",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/c",
                   "host": "0.0.0.0"}, ("API key is required", "vllm_service_api_key")),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny-badname", "cache_dir": "/c"},
     ("served model name",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@kimi", "cache_dir": "/c",
                   "revision": REV + "\n"}, ("40-hex",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@kimi", "cache_dir": "/c", "gpu_count": 1,
                   "plan": {"tensor_parallel_size": 8}, "revision": REV}, ("larger than the 1 GPU",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}\nUser=root", "profile": "@tiny", "cache_dir": "/c"},
     ("newline",)),
    ("vllm_unit", {"python": "/p", "model_dir": "{model}", "profile": "@tiny", "cache_dir": "/c",
                   "load_bytes_per_s": 0}, ("load rate",)),
    ("checkpoint_inspect", {"path": "{tmp}/nope"}, ("nope",)),
    ("checkpoint_inspect", {"path": "{fifo}"}, ("not a regular file",)),
    ("checkpoint_inspect", {"path": "{ck}"}, ("architectures",)),
    ("model_profile", {"profile": {"name": "x"}, "source": "profiles/x.yml"}, ("x.yml", "repo_id|served_model_name")),
    ("model_profile", {"profile": {}}, ("profile",)),
    ("parallelism_plan", {"checkpoint": {}, "gpus": {"count": 0, "memory_bytes": 1}}, ("GPU count|size",)),
    ("hf_lock", {"repo_id": "org/name", "revision": "main", "root": "{root}", "endpoint": "http://127.0.0.1:9",
                 "token_file": "{tmp}/shared-key"}, ("token file", "chmod 600")),
    ("rollout_plan", {"declared": {}}, ("no host to deploy", "ansible-inventory")),
    ("rollout_plan", {"declared": {"a": None}}, ("no profile to deploy on a", "modelfleet_profile_name")),
    ("rollout_plan", {"declared": {"a": "x"}, "profile": "y"}, ("no targeted host serves profile 'y'", "a: x")),
    ("rollout_plan", {"declared": {"a": None}, "profile": "x", "default_serial": "lots"},
     ("serial 'lots'", "percentage")),
    ("rollout_plan", {"declared": {"a": "x"}, "serving": {"a": {"name": "r", "hosts": ["a", "b"]}}},
     ("member of multi-host replica r", r"leave out b \(not targeted\)", "--limit a,b")),
    ("parallelism_plan", {"checkpoint": {}, "gpus": {"count": 1, "memory_bytes": 1}, "multi_host": {"layout": "pp"}},
     ("group_gpus",)),
    ("environment_gates", {"host": "gpu-01", "gpu_facts": {"gpu_count": 1, "compute_capabilities": ["twelve"]}},
     ("'twelve' is not MAJOR.MINOR",)),
    ("environment_gates", {"host": "gpu-01", "accelerator": "tpu"}, ("accelerator", "nvidia, cpu")),
    ("venv_probe", {"pins": ["vllm==0.19.1"]}, ("python",)),
    ("vllm_group_check", {"python": "/p", "host": "c", "members": [
        {"host": "a", "rank": 0, "address": "10.0.0.1", "ports": [29501]},
        {"host": "b", "rank": 1, "address": "10.0.0.2", "ports": [29501]}]},
     (r"c is not a member of the group \(a, b\)", "group_members filter", "nothing was stopped")),
    ("vllm_group_check", {"python": "/p", "host": "a", "port": 29501, "members": [
        {"host": "a", "rank": 0, "address": "10.0.0.1", "ports": [29501]}]},
     ("the group's own port", "vllm_service_group_check_port")),
    ("environment_gates", {"host": "gpu-01", "gpu_facts": {"gpu_count": 8, "compute_capabilities": ["12.0"]},
                           "profile": "@kimi", "vllm_version": "0.9.0"}, ("vLLM 0.9.0 does not satisfy",)),
]


def _module_args(args: dict, s: dict) -> dict:
    tiny = profiles.load_profile("tiny-llama", str(ROOT / "profiles"))
    kimi = profiles.load_profile("kimi-k2.5-int4", str(ROOT / "profiles"))
    named = {"@tiny": tiny, "@kimi": kimi, "@tiny-badname": {**tiny, "served_model_name": "tiny\n"}}

    def fill(v):
        if isinstance(v, str):
            return named.get(v, v.format(**s) if "{" in v else v)
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        return v
    return fill(args)


@pytest.mark.bad_input("module")
@pytest.mark.parametrize("name,args,needles", MODULES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MODULES)])
def test_module(tmp_path, name, args, needles):
    s = sandbox(tmp_path)
    argf = tmp_path.parent / f"{tmp_path.name}-args.json"
    argf.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": _module_args(args, s)}))
    before = snapshot(tmp_path)
    code = ("import sys, runpy; sys.argv = ['m', {argf!r}]; runpy.run_path({mod!r}, run_name='__main__')"
            ).format(argf=str(argf), mod=str(ROOT / "plugins" / "modules" / f"{name}.py"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.stdout[-800:], r.stderr[-800:])
    res = json.loads(r.stdout)
    assert res.get("failed") is True
    check_message(res["msg"], needles)
    assert "\n" not in res["msg"].strip() or len(res["msg"].splitlines()) <= 3
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------------------------- fleet files
BASE = """\
plugin: modelfleet.fleet.fleet
groups:
  g:
    profile: tiny-llama
    gpu: {count: 1}
    hosts:
      a: {address: 10.0.0.1}
"""
FLEETS = [
    ("", ("plugin",)),
    ("plugin: fleet\n", ("groups",)),
    ("plugin: nonsense\ngroups: {}\n", ("plugin",)),
    (BASE + "surprise: 1\n", ("surprise", "unknown")),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: 0}"), ("count",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: -3}"), ("count",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: eight}"), ("count",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: 1.5}"), ("count",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: 1, memory_gib: -1}"), ("memory_gib",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: 1, interconnect: smoke}"), ("interconnect",)),
    (BASE.replace("gpu: {count: 1}", "gpu: {count: 1, kind: 'a b'}"), ("kind",)),
    (BASE.replace("gpu: {count: 1}", "gpu: 8"), ("gpu",)),
    (BASE.replace("profile: tiny-llama", "profile: no-such"), ("no-such", "does not exist")),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {address: '-oProxyCommand=sh'}"), ("address", "not starting")),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {address: 'a b'}"), ("address",)),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {address: ''}"), ("address",)),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {port: 70000}"), ("port",)),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {port: 0}"), ("port",)),
    (BASE.replace("a: {address: 10.0.0.1}", "a: {user: 5, bogus: 1}"), ("bogus|user",)),
    (BASE.replace("a: {address: 10.0.0.1}", "'bad host': {}"), ("bad host",)),
    (BASE.replace("    hosts:", "    models_root: /\n    hosts:"), ("models_root", "'/' is /")),
    (BASE.replace("    hosts:", "    models_root: //\n    hosts:"), ("models_root",)),
    (BASE.replace("    hosts:", "    models_root: /models/../etc\n    hosts:"), ("models_root", "'..'")),
    (BASE.replace("    hosts:", "    models_root: /etc\n    hosts:"), ("models_root", "system folder")),
    (BASE.replace("    hosts:", "    models_root: models\n    hosts:"), ("models_root", "relative")),
    (BASE.replace("    hosts:", "    models_root: 42\n    hosts:"), ("models_root",)),
    (BASE.replace("    hosts:", "    connection: {user: root}\n    hosts:"), ("connection", "ansible_")),
    (BASE.replace("    hosts:", "    vars: [1, 2]\n    hosts:"), ("vars", "mapping")),
    (BASE + "  h:\n    gpu: {count: 1}\n    hosts:\n      a: {}\n", ("a", "two groups|duplicate|already")),
    (BASE + "rollout:\n  waves:\n    - {name: w, hosts: [zz]}\n", ("zz",)),
    (BASE + "rollout:\n  waves:\n    - {name: w, hosts: [a]}\n    - {name: v, hosts: [a]}\n", ("a", "wave")),
    (BASE + "rollout:\n  waves: 5\n", ("waves",)),
    (BASE + "rollout:\n  max_fail_percentage: 250\n", ("max_fail_percentage",)),
    (BASE + "rollout:\n  waves:\n    - {name: w, hosts: [a], serial: 0}\n", ("serial",)),
    ("plugin: fleet\ngroups:\n  g:\n    hosts: [a, b]\n", ("hosts",)),
    ("plugin: fleet\ngroups: [1]\n", ("groups",)),
    ("plugin: fleet\ngroups:\n  g:\n    gpu: {count: 1}\n    hosts:\n      a: {}\n  g:\n    hosts: {}\n",
     ("duplicate|g",)),
    ("plugin: fleet\n\tgroups: {}\n", ("line|YAML|tab",)),
    (BASE.replace("    hosts:", "    multi_host: [pp, 2]\n    hosts:"), ("multi_host", "mapping")),
    (BASE.replace("    hosts:", "    multi_host: {layout: ray, nodes: 2}\n    hosts:"), ("layout", "pp", "dp")),
    (BASE.replace("    hosts:", "    multi_host: {layout: pp, nodes: '2'}\n    hosts:"), ("nodes", "whole number")),
    (BASE.replace("    hosts:", "    multi_host: {layout: pp, nodes: 2, port: 22}\n    hosts:"),
     ("port", "1024-65535")),
    (BASE.replace("    hosts:", "    multi_host: {layout: pp, nodes: 2}\n    hosts:"),
     ("1 host", "multiple of nodes 2", "add 1")),
    (BASE.replace("    hosts:", "    multi_host: {layout: dp, nodes: 2}\n    hosts:")
     + "      b: {address: 10.0.0.2}\n",
     ("host a", "no group address", "vllm_service_group_address")),
]


@pytest.mark.bad_input("fleet file")
@pytest.mark.parametrize("text,needles", FLEETS, ids=[f"fleet-{i}" for i in range(len(FLEETS))])
def test_fleet_file(text, needles):
    with pytest.raises(ModelfleetError) as e:
        fleet.parse(text, "bad.fleet.yml", PROFILES)
    msg = str(e.value)
    check_message(msg, needles)
    assert msg.startswith("bad.fleet.yml"), msg  # file (and line) first


# --------------------------------------------------------------------------------------------- profiles
GOOD_PROFILE = yaml.safe_load((ROOT / "profiles" / "tiny-llama.yml").read_text())


def _with(path: str, value):
    p = json.loads(json.dumps(GOOD_PROFILE))
    cur = p
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    if value is KeyError:
        cur.pop(keys[-1], None)
    else:
        cur[keys[-1]] = value
    return p


PROFILE_CASES = [
    (_with("repo_id", "no-slash"), ("repo_id",)),
    (_with("repo_id", "org/name\n"), ("repo_id",)),
    (_with("repo_id", "../etc/passwd"), ("repo_id",)),
    (_with("served_model_name", KeyError), ("served_model_name",)),
    (_with("served_model_name", 5), ("served_model_name",)),
    (_with("revision", KeyError), ("revision",)),
    (_with("vllm.max_model_len", 0), ("max_model_len",)),
    (_with("vllm.max_model_len", "long"), ("max_model_len",)),
    (_with("vllm.gpu_memory_utilization", 1.7), ("gpu_memory_utilization",)),
    (_with("vllm.kv_cache_dtype", "banana"), ("kv_cache_dtype", "one of")),
    (_with("vllm.package", "vllm-gpu-please"), ("package",)),
    (_with("vllm.tool_call_parser", "nope"), ("tool_call_parser",)),
    (_with("vllm.version", "latest"), ("version",)),
    (_with("vllm.surprise", 1), ("surprise",)),
    (_with("constraints.min_compute_capability", "banana"), ("min_compute_capability",)),
    (_with("constraints.min_compute_capability", "12"), ("min_compute_capability",)),
    ([1, 2], ("mapping|object",)),
]


@pytest.mark.bad_input("profile")
@pytest.mark.parametrize("data,needles", PROFILE_CASES, ids=[f"profile-{i}" for i in range(len(PROFILE_CASES))])
def test_profile(data, needles):
    with pytest.raises(ModelfleetError) as e:
        profiles.validate_profile(data, "profiles/tiny-llama.yml")
    check_message(str(e.value), needles)
    assert str(e.value).startswith("profiles/tiny-llama.yml")


# --------------------------------------------------------------------------------------------- unit rendering
UNIT_CASES = [
    (vllm_unit.unit_environment, ("/c", {"X": "a\nUser=root"}), ("X contains a newline",)),
    (vllm_unit.unit_environment, ("/c", {"X": "a\rb"}), ("carriage return",)),
    (vllm_unit.unit_environment, ("/c", {"X": "a\0"}), ("NUL",)),
    (vllm_unit.unit_environment, ("/c", {"1X": "a"}), ("not a variable name",)),
    (vllm_unit.unit_environment, ("/c", {"X-Y": "a"}), ("not a variable name",)),
    (vllm_unit.unit_environment, ("/c", {"": "a"}), ("not a variable name",)),
    (vllm_unit.unit_environment, ("/c", {"TRITON_CACHE_DIR": "/root"}), ("set by modelfleet",)),
    (vllm_unit.unit_environment, ("/c", {"HF_HUB_OFFLINE": "0"}), ("set by modelfleet",)),
    (vllm_unit.unit_environment, ("/c", {"X": ["a"]}), ("string or a number",)),
    (vllm_unit.unit_environment, ("/c", {"X": None}), ("string or a number",)),
    (vllm_unit.cache_environment, ("/",), ("absolute path below /",)),
    (vllm_unit.cache_environment, ("/a/../b",), ("'..'",)),
    (vllm_unit.cache_environment, ("/a\nb",), ("newline",)),
    (vllm_unit.unit_name, ("kimi\n",), ("served model name",)),
    (vllm_unit.unit_name, ("kimi k2",), ("served model name",)),
    (vllm_unit.unit_name, ("%n",), ("served model name",)),
    (vllm_unit.systemd_quote, ("--x\nExecStartPre=+/bin/sh",), ("newline",)),
    (vllm_unit.environment_assignment, ("BAD-KEY", "v"), ("not an environment variable name",)),
    (vllm_unit.path_setting, ("relative", "model folder"), ("absolute",)),
    (vllm_unit.path_setting, ("/m\n", "model folder"), ("newline",)),
    (vllm_unit.check_api_key, ('ab"c',), ("vllm_service_api_key",)),
    (vllm_unit.check_api_key, ("$(id)",), ("vllm_service_api_key",)),
    (vllm_unit.start_timeout_seconds, (10, -1), ("load rate",)),
    (vllm_unit.allowed_networks, ("0.0.0.0", []), ("vllm_service_allowed_networks is empty", "10.0.0.0/16")),
    (vllm_unit.allowed_networks, ("0.0.0.0", ["banana"]), ("vllm_service_allowed_networks", "not a network")),
    (vllm_unit.allowed_networks, ("0.0.0.0", ["10.0.0.0/99"]), ("not a network",)),
]


@pytest.mark.bad_input("unit rendering")
@pytest.mark.parametrize("fn,args,needles", UNIT_CASES, ids=[f"unit-{i}" for i in range(len(UNIT_CASES))])
def test_unit_rendering(fn, args, needles):
    with pytest.raises(ModelfleetError) as e:
        fn(*args)
    check_message(str(e.value), needles)
    assert "\n" not in str(e.value)

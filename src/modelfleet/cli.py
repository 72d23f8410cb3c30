"""The `modelfleet` command line. Local commands (inspect, plan, plan-disk) call the same pure logic
the Ansible modules use; fleet commands drive playbooks through the runner wrapper."""

from __future__ import annotations

import argparse
import json
import sys

from modelfleet import __version__
from modelfleet._paths import import_module_utils

import_module_utils()

from ansible.module_utils.modelfleet.errors import ModelfleetError  # noqa: E402


def _emit(data: dict, as_json: bool, human) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        human(data)


def cmd_inspect(a) -> int:
    import os

    from ansible.module_utils.modelfleet.checkpoint import inspect_hub, inspect_local
    from ansible.module_utils.modelfleet.units import fmt_bytes

    if os.path.isdir(a.source) or a.source.startswith(("/", ".", "~")) or os.path.exists(a.source):
        facts = inspect_local(a.source, revision=a.revision)
    else:
        if "/" not in a.source:
            raise ModelfleetError(f"{a.source}: neither a local directory nor a hub repo id (org/name)")
        facts = inspect_hub(a.source, revision=a.revision or "main", endpoint=a.endpoint,
                            token=os.environ.get("HF_TOKEN"))
    if not a.files:
        facts["files"] = f"{len(facts['files'])} files (use --files to list)"

    def human(f):
        q = f["quantization"]
        print(f"{f['architecture']} ({f['model_type']}/{f['text_model_type']}), attention {f['attention']}, "
              f"{f['num_layers']} layers, hidden {f['hidden_size']}, experts {f['num_experts']} "
              f"(top-{f['experts_per_token']})")
        print(f"revision: {f['revision']}")
        print(f"shards: {f['num_shards']}, total {fmt_bytes(f['total_bytes'])}, parameters {f['num_parameters']}")
        print(f"quantization: {q['method']} bits={q['bits']} group={q['group_size']} symmetric={q['symmetric']} "
              f"format={q['format']} kv_cache_scheme={q['kv_cache_scheme']}")
        if f.get("quantized_tensors") is not None:
            print(f"quantized tensors: {f['quantized_tensors']} {f['quantized_by_kind']}; "
                  f"unquantized: {f['unquantized_tensors']} {f['unquantized_by_kind']}")
        for w in f["warnings"]:
            print(f"WARNING: {w}")
        for x in f["absent"]:
            print(f"absent: {x}")

    _emit(facts, a.json, human)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="modelfleet", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=f"modelfleet {__version__}")
    sub = ap.add_subparsers(dest="command")
    p = sub.add_parser("inspect", help="facts about a checkpoint (local dir or hub repo), headers only")
    p.add_argument("source", help="a local checkpoint directory or a hub repo id (org/name)")
    p.add_argument("--revision", help="branch, tag or commit (hub); default main")
    p.add_argument("--endpoint", help="hub endpoint (default: HF_ENDPOINT or the public hub)")
    p.add_argument("--files", action="store_true", help="list every file with size and sha256")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if not getattr(a, "func", None):
        ap.print_help()
        return 2
    try:
        return a.func(a)
    except ModelfleetError as e:
        print(f"modelfleet {a.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

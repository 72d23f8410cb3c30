"""Shape-faithful synthetic checkpoints from a real tensor inventory (tests/fixtures/checkpoints/
*-tensor-inventory.md): every tensor name, shape and dtype of the real checkpoint, written as real
safetensors headers in front of sparse data sections. The files have the real apparent sizes (a
595 GB Kimi-K2.5 INT4) but occupy only their header blocks on disk.

Rows that name one shard go there; rows spread over "Multi Files" are placed by layer index over the
shards the explicit rows leave free, as the real checkpoints lay layers out in order."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.safetensors_header import encode_header  # noqa: E402

TORCH_DTYPES = {
    "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32", "torch.int32": "I32",
    "torch.int64": "I64", "torch.uint8": "U8", "torch.int8": "I8", "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2", "torch.bool": "BOOL",
}
ROW = re.compile(r"^\| `([^`]+)`(?: \([^)]*\))? \| `\[([\d, ]*)\]` \| `([^`]+)` \| [^|]+ \| ([^|]+) \|$")
RANGE = re.compile(r"\.(\d+)-(\d+)(?=\.)")
SHARD_NAME = re.compile(r"^(.*?)(\d+)(-of-\d+\.safetensors)$")


def parse_inventory(path: str | Path) -> tuple[list[tuple[str, tuple[int, ...], str, str]], int]:
    """Rows as (name pattern, shape, safetensors dtype, shard or 'Multi Files'); and the shard count."""
    text = Path(path).read_text()
    m = re.search(r"\*\*权重文件\*\*: (\d+)", text) or re.search(r"(\d+) (?:个 )?`?safetensors", text)
    nshards = int(m.group(1))
    rows = []
    for line in text.splitlines():
        r = ROW.match(line.strip())
        if not r:
            continue
        name, shape, dtype, shard = r.groups()
        dims = tuple(int(x) for x in shape.replace(" ", "").split(",") if x)
        rows.append((name, dims, TORCH_DTYPES[dtype], shard.strip()))
    return rows, nshards


def expand(pattern: str) -> list[tuple[str, tuple]]:
    """'layers.1-60.mlp.experts.0-383.w' -> [(name, (layer, expert))] for every combination."""
    ranges = [(int(a), int(b)) for a, b in RANGE.findall(pattern)]
    if not ranges:
        return [(pattern, (-1, -1))]
    parts = RANGE.split(pattern)  # text, a, b, text, a, b, ..., text
    texts = parts[0::3]
    out = []
    for combo in itertools.product(*[range(a, b + 1) for a, b in ranges]):
        s = texts[0]
        for i, idx in enumerate(combo):
            s += f".{idx}" + texts[i + 1]
        out.append((s, combo if len(combo) > 1 else (combo[0], -1)))
    return out


def layout(inventory: str | Path) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """{shard file name: {tensor name: (dtype, shape)}} for the whole checkpoint."""
    rows, nshards = parse_inventory(inventory)
    explicit = sorted({r[3] for r in rows if r[3] != "Multi Files"})
    m = SHARD_NAME.match(explicit[0])
    prefix, width, suffix = m.group(1), len(m.group(2)), m.group(3)
    used = {int(SHARD_NAME.match(s).group(2)) for s in explicit}
    start = min(used | {1}) if min(used) > 0 else 0
    free = []
    i = start
    while len(free) + len(explicit) < nshards:
        if i not in used:
            free.append(f"{prefix}{i:0{width}d}{suffix}")
        i += 1
    # (layer, expert) keys in order, spread evenly over the free shards
    keys = sorted({k for r in rows if r[3] == "Multi Files" for _, k in expand(r[0])})
    rank = {k: i for i, k in enumerate(keys)}
    shards: dict[str, dict] = {s: {} for s in explicit + free}
    for name, shape, dtype, shard in rows:
        for tname, key in expand(name):
            target = shard if shard != "Multi Files" else free[rank[key] * len(free) // len(keys)]
            shards[target][tname] = (dtype, shape)
    return shards


def write_checkpoint(inventory: str | Path, config: str | Path, out: str | Path) -> dict:
    """Write config.json, model.safetensors.index.json and sparse shards. Returns totals."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards = layout(inventory)
    weight_map = {}
    tensor_bytes = 0
    for sname in sorted(shards):
        prefix, data = encode_header(shards[sname], metadata={"format": "pt"})
        with open(out / sname, "wb") as f:
            f.write(prefix)
            f.truncate(len(prefix) + data)  # the data section is a hole: real size, no blocks
        tensor_bytes += data
        for t in shards[sname]:
            weight_map[t] = sname
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": tensor_bytes}, "weight_map": weight_map}, sort_keys=True))
    (out / "config.json").write_text(Path(config).read_text())
    return {"shards": len(shards), "tensors": len(weight_map), "tensor_bytes": tensor_bytes}

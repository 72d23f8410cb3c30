#!/usr/bin/env bash
# Run on the lent GPU machine (the `device` tool): the group network preflight's NCCL branch (group_check.CHECK_CODE,
# what vllm_group_check runs on a GPU host) on a real GPU. One GPU allows one rank only (NCCL refuses two ranks
# on one device), so this shows the code path - CUDA device, NCCL init through the TCP rendezvous, the timed
# all-reduces, the NCCL version - not a bandwidth between hosts. Saves the raw output and the figures under $OUT.
set -uo pipefail
final=${OUT:-/tmp/out}; mkdir -p "$final" /tmp/ac/ansible_collections/modelfleet
ln -sfn "$PWD" /tmp/ac/ansible_collections/modelfleet/fleet
export PYTHONPATH=/tmp/ac NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 - "$final" <<'PY' 2>&1 | tee "$final/group-check-run.log"
import json, sys
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group_check as g

out = sys.argv[1]
members = [{"host": "gpu-0", "rank": 0, "address": "127.0.0.1", "ports": [29611], "environment": {}}]
for backend, size in (("auto", 256 * 2**20), ("gloo", 64 * 2**20)):
    s = g.spec(members, "gpu-0", size_bytes=size, iterations=10, timeout=60, gpu_count=1, backend=backend)
    rc, text = g.run(sys.executable, s)
    raw = g.parse(text)
    print(f"backend={backend} rc={rc}")
    if raw is None:
        print(g.failure(s, "gpu-0", rc, text))
        continue
    with open(f"{out}/group-check-{raw['backend']}-1rank.json", "w") as f:
        json.dump(raw, f, indent=1)
    print(json.dumps(raw))
    print(g.describe(g.summarise(raw)))
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$final/gpu.txt" 2>&1

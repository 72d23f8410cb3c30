#!/usr/bin/env bash
# Run on the lent H200 machine (the `device` tool): record real nvidia-smi / NVML outputs as fixtures,
# run the gpu_facts module through Ansible idle and while a process holds GPU memory, and save all of
# it under $OUT. Needs the wheels in .whl/ (ansible-core and its missing deps), see docs/gpu-unit-sandbox.md.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site ANSIBLE_CONFIG=$PWD/ansible.cfg
export ANSIBLE_CALLBACK_RESULT_FORMAT=json
export ANSIBLE_LOCAL_TEMP=/tmp/ans ANSIBLE_REMOTE_TEMP=/tmp/ans
final=${OUT:-/tmp/out}; o=/tmp/h200-run; rm -rf "$o"; mkdir -p "$o" "$final"
q=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap,power.limit,temperature.gpu,utilization.gpu
nvidia-smi -q -x > "$o/nvidia-smi-q.xml" 2>&1
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits > "$o/query-gpu-nounits.csv" 2>&1
nvidia-smi topo -m > "$o/topo-m.txt" 2>&1
py=$(command -v python3)
facts() { python3 -m ansible adhoc localhost -c local -i localhost, -m modelfleet.fleet.gpu_facts -a "prefer_nvml=$1" \
  -e ansible_python_interpreter=$py 2>&1; }
facts true > "$o/gpu_facts-nvml-idle.json"
facts false > "$o/gpu_facts-smi-idle.json"
# A process that holds 20 GiB of GPU memory (plain cudaMalloc through PyTorch), until we end it.
python3 - <<'PY' > "$o/holder.log" 2>&1 &
import torch, time, os, sys
x = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", x.numel(), "bytes pid", os.getpid(), flush=True)
time.sleep(120)
PY
holder=$!
for _ in $(seq 1 60); do grep -q holding "$o/holder.log" 2>/dev/null && break; sleep 1; done
nvidia-smi -q -x > "$o/nvidia-smi-q-busy.xml" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits > "$o/query-compute-apps-nounits.csv" 2>&1
facts true > "$o/gpu_facts-nvml-busy.json"
facts false > "$o/gpu_facts-smi-busy.json"
echo "holder pid $holder"
kill "$holder"; wait "$holder" 2>/dev/null
sleep 2
facts true > "$o/gpu_facts-nvml-after.json"
ls -la "$o"
python3 - "$o" <<'PY'
import json, sys, os
o = sys.argv[1]
for f in sorted(os.listdir(o)):
    if f.startswith("gpu_facts"):
        try:
            text = open(os.path.join(o, f)).read()
            d = json.loads(text[text.index("=>") + 2:])["gpu_facts"]
            print(f, d["source"], d["gpu_count"], d["driver_version"], d["cuda_driver_version"],
                  [(g["name"], g["compute_capability"], g["memory_total_bytes"], g["memory_used_bytes"]) for g in d["gpus"]],
                  d["interconnect"], [(p["pid"], p["name"], p["bytes"], p["unit"]) for p in d["processes"]])
        except Exception as e:
            print(f, "unreadable:", e, open(os.path.join(o, f)).read()[:1500])
PY
tar -C "$o" -czf "$final/h200-gpu-facts.tgz" .

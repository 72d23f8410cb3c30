#!/usr/bin/env bash
# Run on the lent H200 machine (the `device` tool): record what the benchmark's GPU telemetry reads (issue 26) -
# `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,power.draw` idle and while a bf16 matrix-product loop
# runs - and run telemetry.GpuSampler (NVML, from the nvidia-ml-py wheel in .device/, and nvidia-smi) and
# telemetry.summarise over the same load. Everything lands under $OUT; the .csv files become test fixtures.
set -uo pipefail
final=${OUT:-/tmp/out}; mkdir -p "$final" /tmp/ac/ansible_collections/modelfleet
ln -sfn "$PWD" /tmp/ac/ansible_collections/modelfleet/fleet
export PYTHONPATH=/tmp/ac:$(ls "$PWD"/.device/nvidia_ml_py-*.whl)
q=index,utilization.gpu,memory.used,power.draw
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits > "$final/query-telemetry-idle.csv" 2>&1
python3 - "$final" <<'PY' 2>&1 | tee "$final/telemetry-run.log"
import json, subprocess, sys, threading, time
import torch
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import telemetry as t

out = sys.argv[1]
stop = threading.Event()

def load():  # about 800 TFLOP/s of bf16 products, and 1 GiB host-to-device copies over PCIe, until stopped
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    while not stop.is_set():
        for _ in range(20):
            a @ b
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

nvml, smi = t.GpuSampler(), t.GpuSampler()
smi.kind = "nvidia-smi" if smi.kind else None
print("samplers:", nvml.kind, smi.kind, flush=True)
th = threading.Thread(target=load, daemon=True)
th.start()
time.sleep(2)
samples, raw = [], []
for _ in range(12):
    s = {"t": time.perf_counter(), "gpus": nvml.sample()}
    samples.append(s)
    r = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,power.draw",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    raw.append(r.stdout)
    time.sleep(0.5)
stop.set()
th.join()
open(f"{out}/query-telemetry-busy.csv", "w").write("".join(raw))
print("nvml samples:", json.dumps(samples[:2]), flush=True)
print("nvml summary:", json.dumps(t.summarise(samples)), flush=True)
print("smi summary:", json.dumps(t.summarise([{"t": i, "gpus": t.parse_smi_sample(x)} for i, x in enumerate(raw)])))
PY

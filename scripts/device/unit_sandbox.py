#!/usr/bin/env python3
"""Run GPU work inside the file-system sandbox a rendered vllm_service unit would get, without systemd.

Usage (as root, on a GPU machine):  unit_sandbox.py UNIT_FILE --home DIR [--python PY]

From the unit it takes User=, Environment=, WorkingDirectory=, ReadWritePaths=, ReadOnlyPaths=,
PrivateTmp= and ProtectHome=, and emulates what systemd would build (ProtectSystem=strict is assumed, as the
template sets it): a new mount namespace, every mount read-only except /proc, /sys and /dev, the
ReadWritePaths bound writable, a private /tmp and /var/tmp, /home, /root and /run/user hidden, then the
unit's user through setpriv with systemd's base environment (HOME from the user's passwd entry, USER,
LOGNAME, SHELL, PATH) and the unit's Environment= on top. Inside it runs CUDA initialisation, a Triton JIT
kernel, a torch.compile'd function and a PTX module loaded through the driver (its JIT cache), and says
where each cache went. Exit 0 when every step passed.

Not emulated (no systemd here): the syscall filter, the device policy, capability bounding beyond
setpriv's, the address-family and namespace restrictions. See docs/gpu-unit-sandbox.md."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import pwd
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
API_FS = ("/proc", "/sys", "/dev")
# Only what the machine needs to find its driver libraries; printed, never a cache variable.
PASS_THROUGH = ("LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_VISIBLE_DEVICES",
                "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def load_unit_file():
    path = os.path.join(ROOT, "plugins", "module_utils", "modelfleet", "unit_file.py")
    spec = importlib.util.spec_from_file_location("unit_file", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


WORKLOAD = r'''
import os, sys, time, traceback
failed = []

def step(name, fn):
    t = time.time()
    try:
        print(f"PASS {name}: {fn()} ({time.time() - t:.1f} s)", flush=True)
    except BaseException as e:  # report every failure, go on with the next step
        failed.append(name)
        last = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL {name}: {type(e).__name__}: {e} (at {os.path.basename(last.filename)}:{last.lineno})", flush=True)

def cuda_init():
    import torch
    torch.cuda.init()
    x = torch.ones(2048, 2048, device="cuda")
    y = (x @ x).sum().item()
    assert y == 2048.0 ** 3, y
    return f"{torch.cuda.get_device_name(0)} cc {torch.cuda.get_device_capability(0)}, torch {torch.__version__}"

def triton_kernel():
    import torch, triton, triton.language as tl
    @triton.jit
    def add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)
    n = 98765
    x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); o = torch.empty_like(x)
    k = add[(triton.cdiv(n, 1024),)](x, y, o, n, BLOCK=1024)
    assert torch.equal(o, x + y)
    global PTX
    PTX = k.asm["ptx"]
    return f"triton {triton.__version__}, cache {os.environ.get('TRITON_CACHE_DIR') or '(default under HOME)'}"

def compiled():
    import torch
    f = torch.compile(lambda a, b: torch.sin(a) * torch.cos(b) + a.softmax(-1), fullgraph=True)
    a = torch.rand(64, 4096, device="cuda"); b = torch.rand(64, 4096, device="cuda")
    torch.testing.assert_close(f(a, b), torch.sin(a) * torch.cos(b) + a.softmax(-1))
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return f"inductor cache {cache_dir()}"

def ptx_jit():
    from cuda.bindings import driver as cu
    import torch
    torch.cuda.synchronize()
    err, ctx = cu.cuCtxGetCurrent()
    assert err == cu.CUresult.CUDA_SUCCESS and int(ctx) != 0, (err, ctx)
    err, mod = cu.cuModuleLoadData(PTX.encode() + b"\0")
    assert err == cu.CUresult.CUDA_SUCCESS, err
    path = os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.environ["HOME"], ".nv", "ComputeCache")
    files = sum(len(fs) for _, _, fs in os.walk(path)) if os.path.isdir(path) else 0
    return f"driver JIT of Triton's PTX ok; {files} file(s) in its cache {path}"

print(f"uid={os.getuid()} HOME={os.environ.get('HOME')} cwd={os.getcwd()}", flush=True)
for k in sorted(os.environ):
    if k.endswith(("_CACHE_DIR", "_CACHE_PATH", "_CACHE_ROOT", "_HOME", "_BASE")) or k == "HOME":
        print(f"  env {k}={os.environ[k]}")
step("cuda-init", cuda_init)
step("triton-jit", triton_kernel)
step("torch-compile", compiled)
if "triton-jit" not in failed:
    step("ptx-driver-jit", ptx_jit)
else:
    failed.append("ptx-driver-jit")
    print("FAIL ptx-driver-jit: skipped (no Triton PTX)")
print("RESULT", "FAIL " + ",".join(failed) if failed else "PASS")
sys.exit(1 if failed else 0)
'''


def unshare_mount_namespace() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise SystemExit(f"sandbox set-up: unshare(CLONE_NEWNS) failed: {os.strerror(ctypes.get_errno())}")


def sh(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"sandbox set-up: {' '.join(argv)} failed: {r.stderr.strip()}")


def mountpoints() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def under(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("unit")
    ap.add_argument("--home", required=True, help="the service user's home (the role's vllm_service_cache_root)")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    uf = load_unit_file()
    text = open(a.unit).read()
    user = uf.last(text, "User")
    rw = uf.path_list(text, "ReadWritePaths")
    ro = uf.path_list(text, "ReadOnlyPaths")
    workdir = uf.last(text, "WorkingDirectory", default="/")
    private_tmp = uf.last(text, "PrivateTmp", default="no") in ("yes", "true", "1")
    protect_home = uf.last(text, "ProtectHome", default="no")
    unit_env = uf.environment(text)
    assert uf.last(text, "ProtectSystem") == "strict", "this check emulates ProtectSystem=strict only"

    # The role's part: the system user with its home, the writable folders (0700, the user's), the model.
    try:
        pwd.getpwnam(user)
    except KeyError:
        sh("useradd", "--system", "--home-dir", a.home, "--no-create-home", "--shell", "/usr/sbin/nologin", user)
    pw = pwd.getpwnam(user)
    for d in [a.home, *rw]:
        os.makedirs(d, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o700)
    for d in ro:
        os.makedirs(d, exist_ok=True)
    workload_dir = "/opt/modelfleet-unit-check"
    os.makedirs(workload_dir, exist_ok=True)
    os.chmod(workload_dir, 0o755)
    workload = os.path.join(workload_dir, "workload.py")
    with open(workload, "w") as f:
        f.write(WORKLOAD)
    os.chmod(workload, 0o644)

    env = {"PATH": SYSTEMD_PATH, "HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "SHELL": pw.pw_shell}
    passed = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    env.update(passed)
    env.update(unit_env)
    print(f"unit {a.unit}: User={user} ReadWritePaths={rw} ReadOnlyPaths={ro} PrivateTmp={private_tmp} "
          f"ProtectHome={protect_home} WorkingDirectory={workdir}")
    print(f"  passwd home {pw.pw_dir}; unit sets {len(unit_env)} variables; passed through from this machine: "
          f"{sorted(passed)}")
    sys.stdout.flush()

    pid = os.fork()
    if pid == 0:
        try:
            unshare_mount_namespace()
            sh("mount", "--make-rprivate", "/")
            for p in rw:
                sh("mount", "--bind", p, p)
            for mp in mountpoints():
                if under(mp, API_FS) or mp in rw:
                    continue
                r = subprocess.run(["mount", "-o", "remount,bind,ro", mp], capture_output=True, text=True)
                if r.returncode != 0 and mp == "/":
                    raise SystemExit(f"sandbox set-up: cannot make / read-only: {r.stderr.strip()}")
            for p in ro:
                sh("mount", "--bind", p, p)
                sh("mount", "-o", "remount,bind,ro", p)
            if private_tmp:
                for t in ("/tmp", "/var/tmp"):
                    sh("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", t)
            if protect_home in ("yes", "true", "read-only", "tmpfs"):
                mode = "mode=0755" if protect_home == "tmpfs" else "mode=000"
                for h in ("/home", "/root", "/run/user"):
                    if os.path.isdir(h):
                        sh("mount", "-t", "tmpfs", "-o", mode, "tmpfs", h)
            probe = subprocess.run(["touch", "/etc/.modelfleet-ro-probe"], capture_output=True)
            if probe.returncode == 0:
                os.unlink("/etc/.modelfleet-ro-probe")
                raise SystemExit("sandbox set-up: / is still writable")
            os.chdir(workdir)
            setpriv = shutil.which("setpriv")
            os.execve(setpriv, [setpriv, "--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid), "--init-groups",
                                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all",
                                a.python, workload], env)
        except SystemExit as e:
            print(e, file=sys.stderr, flush=True)
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    # Where the caches went: every file the run left under the writable folders
    for p in rw:
        counts: dict[str, int] = {}
        for dirpath, _, files in os.walk(p):
            if files:
                top = os.path.relpath(dirpath, p).split("/")[0]
                counts[top] = counts.get(top, 0) + len(files)
        print(f"  files written under {p}: {dict(sorted(counts.items())) or 'none'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""Distribution time to N hosts over rate-limited links (issue 23): the controller relay, the star (direct) and
the peer chain side by side, on the emulated fleet (scripts/netfleet.sh: each host in its own network namespace
behind a rate-limited link (htb or tbf), reached over SSH on its own address), with the physical limit beside them.

    python benchmarks/bench_distribute.py [--hosts 1 2 4 8] [--rate-mbit 200] [--model-mb 256] [--files 16]
                                          [--modes controller direct peer] [--plot docs/img/distribute.png]
    python benchmarks/bench_distribute.py --faults [--model-mb 128]    a killed pull and a flipped byte (faults())

The origin holds the verified model (placed with podman cp: its own download is not what is measured); each run
is the hf_fetch role as a deploy runs it (benchmarks/distribute.yml), the receivers emptied before each. Printed
per run: wall time of the play, that time over one copy's physical limit (model bytes / link rate), the bytes
the controller's own link carried, and every receiver's files checked against the lock. Asserts nothing."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (  # noqa: E402
    build_lock,
    finalize,
    hub_listing,
    model_paths,
)
from bench_link_queue import counters  # noqa: E402  (this folder: sys.path[0] when run as a script)

from modelfleet.harness.hub_repo import publish  # noqa: E402
from modelfleet.harness.servers import start_hub  # noqa: E402

REPO = "bench/distribute"
CTL_IF = "mfnet-c"
PULL_LINE = r"received \d+ bytes \(\d+ files kept from before\) in ([\d.]+) s"


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def ctl_bytes() -> tuple[int, int]:
    s = Path(f"/sys/class/net/{CTL_IF}/statistics")
    return int((s / "tx_bytes").read_text()), int((s / "rx_bytes").read_text())


def tcp_counters(hosts: list[tuple[str, str]]) -> dict:
    """Per host of the emulated fleet (its network namespace has the container's name): the TCP segments it sent
    and retransmitted (/proc/net/snmp there) and the packets its upload's queue (the root qdisc on its interface,
    htb or tbf) dropped."""
    out = {}
    for name, _addr in hosts:
        sent, retransmitted, dropped = counters(name, "h" + name.rsplit("h", 1)[1])
        out[name] = {"sent": sent, "retransmitted": retransmitted, "queue_dropped": dropped}
    return out


def make_model(work: Path, mb: int, files: int) -> Path:
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    per = mb * 1_000_000 // files
    for i in range(files):
        p = model / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(p, "wb") as f:
            f.write(os.urandom(per))
    (model / "config.json").write_text(json.dumps({"model_type": "bench", "files": files}))
    return model


def ssh(addr: str, cmd: str) -> str:
    key = ROOT / ".cache" / "ssh" / "id_ed25519"
    return sh("ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
              "-o", "LogLevel=ERROR", f"root@{addr}", cmd)


def check_hashes(hosts: list[tuple[str, str]], lock: dict) -> str:
    final = model_paths("/models", lock["repo_id"], lock["revision"])["final"]
    want = {f["name"]: f["sha256"] for f in lock["files"] if f.get("sha256")}
    for name, _addr in hosts:
        out = sh("podman", "exec", name, "sh", "-c", f"cd {final} && sha256sum " + " ".join(sorted(want)))
        got = {line.split()[1]: line.split()[0] for line in out.splitlines()}
        if got != want:
            return f"{name}: files differ from the lock"
        if sh("podman", "exec", name, "sh", "-c", f"test -e {final}/.modelfleet/complete && echo ok").strip() != "ok":
            return f"{name}: not marked complete"
    return "every file on every receiver matches the lock"


def fleet_up(n: int, rate_mbit: int, work: Path, paths: dict, queue: str) -> tuple[list, str, Path]:
    """An emulated fleet of an origin (holding the verified model) and n receivers; its inventory."""
    sh(str(ROOT / "scripts" / "netfleet.sh"), "up", str(n + 1), str(rate_mbit),
       env={**os.environ, "NETFLEET_QUEUE": queue})
    hosts = [tuple(line.split()) for line in (ROOT / ".cache" / "netfleet" / "hosts").read_text().splitlines()]
    origin = hosts[0][0]
    rel = os.path.relpath(paths["final"], str(work / "origin"))
    sh("podman", "exec", origin, "mkdir", "-p", f"/models/{os.path.dirname(rel)}")
    sh("podman", "cp", paths["final"], f"{origin}:/models/{rel}")
    inv = work / f"inventory-{n}.yml"
    inv.write_text(sh(str(ROOT / "scripts" / "netfleet.sh"), "inventory"))
    return hosts, origin, inv


def play_command(inv: Path, endpoint: str, origin: str, mode: str, relay: Path, extra: str = "") -> list[str]:
    return ["ansible-playbook", "-i", str(inv), str(ROOT / "benchmarks" / "distribute.yml"), "-e",
            f"repo_id={REPO} endpoint={endpoint} origin={origin} via={mode} relay_dir={relay} {extra}".strip()]


def host_status(host: str, lock: dict) -> dict:
    """A host's status file for the model (what its children read), {} when it has none yet."""
    p = model_paths("/models", lock["repo_id"], lock["revision"])["status"]
    out = subprocess.run(["podman", "exec", host, "cat", p], capture_output=True, text=True, check=False).stdout
    try:
        return json.loads(out)
    except ValueError:
        return {}


def wait_for(what: str, cond, timeout: float = 300.0):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        r = cond()
        if r:
            return r
        time.sleep(0.2)
    raise SystemExit(f"faults: {what} did not happen in {timeout:g} s")


def faults(a, work: Path, paths: dict, lock: dict, endpoint: str, env: dict) -> int:
    """Issue 23's fault cases over the emulated network, through the role (SSH, rrsync, the transfer user and keys),
    on a chain origin -> r1 -> r2 -> r3:
    1. r2's pull is killed (SIGKILL) a third of the way in: the play fails naming r2, r3 leaves r2 once its status
       stops changing and takes the rest from r1; the rerun continues r2 from its verified files and ends verified.
    1b. The same, with the job's async wrapper killed too: the job never finishes, and the play fails naming r2 once
       no process holds the model's write lock (the stall limit after); the rerun ends verified.
    2. A byte of a file that r2 verified is flipped there before r3 takes it (r3's link is slowed so that it
       lags): r3 catches it by its hash, drops r2 naming the file, takes the file from r1; r2 is not marked complete
       (the file changed after its verification). Every receiver that ends complete is checked against the lock."""
    stall = 15
    hosts, origin, inv = fleet_up(3, a.rate_mbit, work, paths, a.queue)
    r1, r2, r3 = (h for h, _addr in hosts[1:])
    weights = [f["name"] for f in lock["files"] if f["name"].endswith(".safetensors")]
    staging = model_paths("/models", lock["repo_id"], lock["revision"])["staging"]

    def run(tag: str, background: bool = False):
        cmd = play_command(inv, endpoint, origin, "peer", work / f"relay-{tag}", f"hf_fetch_stall_seconds={stall}")
        log = open(work / f"play-faults-{tag}.log", "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        return p if background else p.wait()

    def play_text(tag: str) -> str:
        return " ".join((work / f"play-faults-{tag}.log").read_text().split())

    print(f"faults: chain {origin} -> {r1} -> {r2} -> {r3}, links {a.rate_mbit} Mbit/s, stall limit {stall} s")
    # 1. a pull killed mid-way
    p = run("kill", background=True)
    st = wait_for(f"{r2} verifying a third of the files",
                  lambda: (s := host_status(r2, lock)) and len(s.get("verified", [])) >= len(lock["files"]) // 3 and s)
    # the module's own process (the async wrapper that watches it records its death as the job's failure)
    sh("podman", "exec", r2, "sh", "-c", "for p in $(pgrep -f '[A]nsiballZ_hf_peer_pull'); do "
       "tr '\\0' ' ' </proc/$p/cmdline | grep -q async_wrapper || kill -9 $p; done")
    killed_at = len(st["verified"])
    rc = p.wait()
    text = play_text("kill")
    r3_status = host_status(r3, lock)
    r3_dropped = [d["host"] for d in r3_status.get("dropped", [])]
    print(f"  1. killed {r2}'s pull with {killed_at} of {len(lock['files'])} files verified: play rc={rc}; "
          f"failed hosts named: {sorted(set(re.findall(r'fatal: .(mfnet-h[0-9]+).', text)))}; "
          f"{r3} took files from {r3_status.get('sources')}, dropped {r3_dropped}")
    rc = run("resume")
    kept = re.findall(r"received \d+ bytes \((\d+) files kept from before\)", play_text("resume"))
    print(f"     rerun: rc={rc}; files kept from before, per receiver that pulled: {kept}; "
          f"{check_hashes(hosts[1:], lock)}")

    # 1b. the same kill taking the job's async wrapper too (pkill -f matches both): the job never finishes; the
    # watch fails it once no process holds the model's write lock (before: it waited hf_fetch_timeout_seconds)
    for h, _addr in hosts[1:]:
        sh("podman", "exec", h, "rm", "-rf", "/models")
    p = run("killall", background=True)
    st = wait_for(f"{r2} verifying a third of the files",
                  lambda: (s := host_status(r2, lock)) and len(s.get("verified", [])) >= len(lock["files"]) // 3 and s)
    sh("podman", "exec", r2, "pkill", "-9", "-f", "AnsiballZ_hf_peer_pull")
    t = time.monotonic()
    rc = p.wait()
    gone = re.search(r"fatal: ." + re.escape(r2) + r".*?msg: .?(hf_fetch.{0,170})", play_text("killall"))
    print(f"  1b. killed {r2}'s whole job (the module and Ansible's async wrapper) with {len(st['verified'])} files "
          f"verified: play rc={rc}, {time.monotonic() - t:.0f} s after the kill; {r2}: "
          f"{gone.group(1) if gone else 'NOT FAILED'}")
    rc = run("killall-resume")
    print(f"     rerun: rc={rc}; {check_hashes(hosts[1:], lock)}")

    # 2. a byte flipped on r2 after it verified the file, before r3 took it
    for h, _addr in hosts[1:]:
        sh("podman", "exec", h, "rm", "-rf", "/models")
    i3 = int(r3.rsplit("h", 1)[1])
    sh("ip", "netns", "exec", "mfnet-sw", "tc", "qdisc", "replace", "dev", f"p{i3}", "root", "tbf", "rate",
       f"{max(a.rate_mbit // 8, 1)}mbit", "burst", "32768", "latency", "50ms")
    p = run("flip", background=True)

    def target():
        s2, s3 = host_status(r2, lock), host_status(r3, lock)
        ahead = [w for w in weights if w in s2.get("verified", []) and w not in s3.get("verified", [])
                 and w != s3.get("receiving")]
        return ahead[-1] if len(ahead) >= 2 else None

    victim = wait_for(f"{r2} verifying files {r3} has not taken", target)
    flip = ("import sys; f = open(sys.argv[1], 'r+b'); f.seek(1000); b = f.read(1); f.seek(1000); "
            "f.write(bytes([b[0] ^ 1])); f.close()")
    sh("podman", "exec", r2, "python3", "-c", flip, f"{staging}/{victim}")
    rc = p.wait()
    text = play_text("flip")
    s3 = host_status(r3, lock)
    reasons = [d["reason"] for d in s3.get("dropped", []) if d["host"] == r2]
    print(f"  2. flipped a byte of {victim} on {r2} after its verification: play rc={rc}")
    print(f"     {r3}: state {s3.get('state')}, took files from {s3.get('sources')}, dropped {r2} because: "
          f"{reasons[0] if reasons else 'NOT DROPPED'}")
    r2_fail = re.search(r"fatal: ." + re.escape(r2) + r".*?msg: (.{0,300})", text)
    print(f"     {r2}: {'failed: ' + r2_fail.group(1) if r2_fail else 'NOT FAILED'}")
    print(f"     receivers that ended complete: {check_hashes([h for h in hosts[1:] if h[0] != r2], lock)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8], help="receiving hosts (N)")
    ap.add_argument("--rate-mbit", type=int, default=200)
    ap.add_argument("--model-mb", type=int, default=256)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["controller", "direct", "peer"])
    ap.add_argument("--plot", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--queue", choices=["acks-first", "fifo"], default="acks-first",
                    help="how each link queues (scripts/netfleet.sh, NETFLEET_QUEUE): small TCP packets before the "
                    "bulk (default), or one drop-tail queue for everything (the emulation until 2026-12-08)")
    ap.add_argument("--keep", action="store_true", help="leave the last emulated fleet up (to look at a failure)")
    ap.add_argument("--faults", action="store_true", help="instead of timings: a killed pull and a flipped byte over "
                    "the emulated network (printed outcomes; faults())")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mf-bench-distribute-"))
    model = make_model(work, a.model_mb, a.files)
    published = publish(model, work / "mirrors", REPO)
    srv = start_hub(work / "mirrors", work)
    results = []
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_HOST_KEY_CHECKING": "False"}
    try:
        commit, files = hub_listing(REPO, "main", srv.url, None)
        lock = build_lock(REPO, "main", commit, files, [], srv.url)
        paths = model_paths(str(work / "origin"), REPO, commit)
        os.makedirs(paths["staging"])
        repo_tree = Path(published["path"])
        for f in lock["files"]:  # the weights from the model folder, the small files from the hub repo's tree
            src = model / f["name"] if f["name"].endswith(".safetensors") else repo_tree / f["name"]
            (Path(paths["staging"]) / f["name"]).write_bytes(src.read_bytes())
        finalize(paths["staging"], paths["final"], lock)
        total = lock["total_bytes"]
        one_copy = total * 8 / (a.rate_mbit * 1e6)
        print(f"model {total / 1e6:.0f} MB in {len(lock['files'])} files; links {a.rate_mbit} Mbit/s each way; "
              f"one copy's physical limit {one_copy:.1f} s; links' queues: {a.queue}; the hosts' TCP congestion "
              f"control: {sh('sysctl', '-n', 'net.ipv4.tcp_congestion_control').strip()} (the kernel's; each host's "
              "network namespace starts with it)")
        if a.faults:
            return faults(a, work, paths, lock, srv.url, env)
        for n in a.hosts:
            hosts, origin, inv = fleet_up(n, a.rate_mbit, work, paths, a.queue)
            for mode in a.modes:
                for h, _addr in hosts[1:]:
                    sh("podman", "exec", h, "rm", "-rf", "/models")
                key = ROOT / ".cache" / "ssh" / "id_ed25519"
                if mode == "direct":  # the star's precondition: the origin holds a key the hosts accept (here the
                    # harness key, at the path the inventory names), removed after its run
                    sh("podman", "exec", origin, "mkdir", "-p", str(key.parent))
                    sh("podman", "cp", str(key), f"{origin}:{key}")
                relay = work / f"relay-{mode}-{n}"
                tx0, rx0 = ctl_bytes()
                tcp0 = tcp_counters(hosts)
                t = time.monotonic()
                p = subprocess.run(play_command(inv, srv.url, origin, mode, relay), env=env, capture_output=True,
                                   text=True, check=False)
                wall = time.monotonic() - t
                if mode == "direct":
                    sh("podman", "exec", origin, "rm", "-f", str(key))
                tx1, rx1 = ctl_bytes()
                tcp1 = tcp_counters(hosts)
                tcp = {h: {k: tcp1[h][k] - tcp0[h][k] for k in tcp1[h]} for h, _addr in hosts}
                log = work / f"play-{mode}-{n}.log"
                log.write_text(p.stdout + p.stderr)
                if p.returncode != 0:
                    print(p.stdout[-3000:], p.stderr[-2000:])
                    raise SystemExit(f"{mode} to {n} hosts failed (the whole play: {log})")
                check = check_hashes(hosts[1:], lock)
                # peer: the last receiver's own pull time (its report line), without the play's set-up steps
                by_host = dict(re.findall(r"\[([^\]]+)\] => [^\[]*?" + PULL_LINE, " ".join(p.stdout.split())))
                pulls = [float(by_host[h]) for h, _addr in hosts[1:] if h in by_host]  # in the chain's order
                r = {"mode": mode, "hosts": n, "seconds": wall, "over_one_copy": wall / one_copy,
                     "controller_tx": tx1 - tx0, "controller_rx": rx1 - rx0, "check": check,
                     "slowest_pull_s": max(pulls) if pulls else None, "pull_s": pulls, "tcp": tcp}
                results.append(r)
                extra = f" (slowest pull {max(pulls):.1f} s = {max(pulls) / one_copy:4.2f} x)" if pulls else ""
                if len(pulls) > 1:  # each receiver's own pull, first hop first: what each hop adds
                    extra += " (pulls " + " / ".join(f"{x:.1f}" for x in pulls) + " s)"
                print(f"  N={n:<2} {mode:<10} {wall:7.1f} s = {wall / one_copy:5.2f} x one copy{extra}; controller "
                      f"link carried {(tx1 - tx0 + rx1 - rx0) / 1e6:8.1f} MB, {(tx1 - tx0) / 1e6:.1f} MB of it sent "
                      f"({100 * (tx1 - tx0 + rx1 - rx0) / total:6.2f}% of the model); {check}", flush=True)
                # where a hop's link time goes besides the model's bytes: TCP's retransmissions (a segment sent
                # again crosses the link again unless the host's own queue dropped it) and the drops of each
                # host's upload queue, the origin first, in the chain's order
                print("         TCP retransmitted, % of segments sent, per host: " + " / ".join(
                    f"{100 * tcp[h]['retransmitted'] / max(tcp[h]['sent'], 1):.1f}" for h, _addr in hosts)
                      + "; upload queue drops: " + " / ".join(str(tcp[h]["queue_dropped"]) for h, _addr in hosts),
                      flush=True)
                if mode == "controller":
                    sh("rm", "-rf", str(relay))
    finally:
        srv.stop()
        if not a.keep:
            subprocess.run([str(ROOT / "scripts" / "netfleet.sh"), "down"], check=False)
            if sys.exc_info()[0] is None:  # its model and relays (GBs); a failed run keeps them and its plays' logs
                shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"rate_mbit": a.rate_mbit, "model_bytes": total, "one_copy_s": one_copy,
                                            "results": results}, indent=1))
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for mode in a.modes:
            pts = [(r["hosts"], r["seconds"]) for r in results if r["mode"] == mode]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=mode)
        ax.axhline(one_copy, color="grey", linestyle="--", label="one copy at link rate")
        ax.set_xlabel("receiving hosts (N)")
        ax.set_ylabel("seconds (whole play)")
        ax.set_title(f"{total / 1e6:.0f} MB to N hosts, {a.rate_mbit} Mbit/s links")
        ax.set_xticks(a.hosts)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

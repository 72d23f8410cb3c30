"""What on this host uses a model folder right now - read from the host, failing closed.

Two sources, both needed:
- systemd: every loaded service that is active, activating, reloading or waiting to auto-restart, with
  every place a path can hide in it (ExecStart* command lines, Environment, EnvironmentFiles' contents,
  WorkingDirectory, RootDirectory, Bind*Paths, and the text of a wrapper script its command runs);
- processes: any process whose command line, working directory, open files or memory maps name a path
  under the models root (what `lsof +D` shows; a server started with nohup has no unit), and container
  processes whose mount table binds a folder under the root (a `docker run -v /models/x:/model`).

If the units cannot be read the answer is an error, never "nothing in use": a planner that cannot see
what runs must not delete. `references()` is pure: it takes the gathered text and the candidate folders."""

from __future__ import annotations

import os
import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.systemd import SystemdError, list_units, show

LIVE_STATES = {"active", "activating", "reloading", "deactivating"}
PROPS = ("Id", "ActiveState", "SubState", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload",
         "Environment", "EnvironmentFiles", "WorkingDirectory", "RootDirectory", "BindPaths", "BindReadOnlyPaths")
SCRIPT_LIMIT = 1 << 20  # a wrapper script is read when it is a regular file of at most 1 MiB


END = r"$|[\s\"':;=,}\]]"


def _mentions(text: str, path: str, below: bool = True) -> bool:
    """Whether `text` names `path` (followed by an end, a blank, a quote, ':' as in a volume, '=', ';' ...),
    or with `below` something under it ('/'): never a longer sibling name (/models/a vs /models/ab)."""
    if not path or path == "/":
        return False
    end = (r"/|" if below else "") + END
    return re.search(re.escape(path.rstrip("/")) + f"(?={end})", text) is not None


def _ancestors(path: str, root: str) -> list[str]:
    """The folders between the root (excluded) and `path` (excluded)."""
    out, p = [], os.path.dirname(path.rstrip("/"))
    while p != "/" and p.startswith(root.rstrip("/") + "/"):  # stops at the root, and at "/" (its own dirname)
        out.append(p)
        p = os.path.dirname(p)
    return out


def references(sources: list[dict], folders: list[str], root: str) -> list[dict]:
    """(pure) Which folders each source uses: it names the folder or a path below it, or it names exactly a
    folder between the root and it (a server given /models/org--name serves one of its revisions; a
    sibling revision named in full does not protect this one). A source is {"kind", "name", "text"};
    the result lists {"path", "kind", "name"} once per folder and source."""
    out = []
    for src in sources:
        for f in folders:
            if _mentions(src["text"], f) or any(_mentions(src["text"], a, below=False) for a in _ancestors(f, root)):
                out.append({"path": f, "kind": src["kind"], "name": src["name"]})
    return out


def _script_text(exec_value: str) -> str:
    """The text of the program an Exec* line runs when it is a small script (a wrapper that starts vLLM)."""
    m = re.search(r"path=(.+?) ;", exec_value)  # systemctl show: "{ path=/opt/my dir/run.sh ; argv[]=... }"
    prog = m.group(1) if m else (exec_value.split() or [""])[0]
    try:
        st = os.stat(prog)
        if not os.path.isfile(prog) or st.st_size > SCRIPT_LIMIT:
            return ""
        with open(prog, "rb") as f:
            head = f.read(SCRIPT_LIMIT)
        return head.decode("utf-8", "replace") if head.startswith(b"#!") else ""
    except OSError:
        return ""


def _env_files_text(value: str) -> str:
    texts = []
    for part in value.split("\n"):
        path = part.split(" (ignore_errors=")[0].strip()
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read(SCRIPT_LIMIT))
        except OSError:
            continue
    return "\n".join(texts)


def unit_sources(run) -> list[dict]:
    """Every live service's text (`run` is subprocess.run on a host). Raises DiskPlanError when systemd
    cannot be read."""
    fix = ("a plan that cannot see what runs deletes nothing. Fix systemctl, or plan without units explicitly "
           "(--no-units / storage_cleanup_read_units: false) if nothing on this host serves from the root")
    try:
        # a unit waiting to auto-restart is ACTIVE "activating", SUB "auto-restart": live too
        names = [u["unit"] for u in list_units(run=run) if u["active"] in LIVE_STATES]
    except SystemdError as e:
        raise DiskPlanError(f"cannot read the host's services ({e}); {fix}") from None
    try:
        shown = show(names, PROPS, run=run)
    except SystemdError as e:
        raise DiskPlanError(f"cannot read the live services' settings ({e}); nothing is deleted without them") from None
    out = []
    for u in shown:
        text = "\n".join(u.get(p, "") for p in PROPS if p not in ("Id", "ActiveState", "SubState"))
        for p in ("ExecStartPre", "ExecStart"):
            for line in u.get(p, "").split("\n"):
                text += "\n" + _script_text(line)
        text += "\n" + _env_files_text(u.get("EnvironmentFiles", ""))
        out.append({"kind": "unit", "name": f"{u.get('Id', '?')} ({u.get('ActiveState')}/{u.get('SubState')})",
                    "text": text})
    return out


def _read(path: str, limit: int = SCRIPT_LIMIT) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _root_mount(root_real: str, proc: str) -> tuple[str, str, str] | None:
    """(major:minor, root-in-fs, mount point) of the mount that holds `root_real`, from our mountinfo."""
    best = None
    for line in _read(f"{proc}/self/mountinfo").splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        mnt = f[4].replace("\\040", " ")
        if root_real == mnt or root_real.startswith(mnt.rstrip("/") + "/"):
            if best is None or len(mnt) >= len(best[2]):  # a later mount on the same point hides the earlier
                best = (f[2], f[3].replace("\\040", " "), mnt)
    return best


def _ancestors_of_self(proc: str) -> set[str]:
    """Our pid and every parent up to 1: the run asking for the plan names the paths it plans for (an
    `ansible -m storage_reclaim -a '{...}'` controller on this host) and must not count as a user."""
    out, pid = set(), str(os.getpid())
    while pid not in out and pid not in ("0", ""):
        out.add(pid)
        stat_line = _read(f"{proc}/{pid}/stat", 4096)
        pid = stat_line.rsplit(")", 1)[-1].split()[1] if ")" in stat_line else ""
    return out


def process_sources(root_real: str, proc: str) -> list[dict]:
    """Every process that names the models root in its command line, cwd, open files or maps, and every
    process in another mount namespace whose mounts bind a folder from under the root. Processes that vanish
    while being read are skipped; this process and its ancestors are skipped."""
    out = []
    mine = _ancestors_of_self(proc)
    own_ns = os.path.realpath(f"{proc}/self/ns/mnt") if os.path.exists(f"{proc}/self/ns/mnt") else ""
    holder = _root_mount(root_real, proc)
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p not in mine]
    except OSError as e:
        raise DiskPlanError(f"cannot list processes in {proc} ({e}); nothing is deleted without knowing what "
                            "runs") from None
    for pid in pids:
        base = f"{proc}/{pid}"
        parts = [_read(f"{base}/cmdline").replace("\0", " ")]
        comm = _read(f"{base}/comm", 256).strip()
        try:
            parts.append(os.readlink(f"{base}/cwd"))
        except OSError:
            pass
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    parts.append(os.readlink(f"{base}/fd/{fd}"))
                except OSError:
                    continue
        except OSError:
            pass
        maps = _read(f"{base}/maps", 16 << 20)
        parts.extend(line.split(None, 5)[5] for line in maps.splitlines() if len(line.split(None, 5)) == 6)
        if holder and own_ns:
            try:
                ns = os.path.realpath(f"{base}/ns/mnt")
            except OSError:
                ns = own_ns
            if ns != own_ns:
                dev, fs_root, mnt = holder
                for line in _read(f"{base}/mountinfo").splitlines():
                    f = line.split()
                    if len(f) >= 5 and f[2] == dev:
                        r = f[3].replace("\\040", " ")
                        if r == fs_root or r.startswith(fs_root.rstrip("/") + "/"):
                            parts.append(os.path.join(mnt, os.path.relpath(r, fs_root)))
        text = "\n".join(p for p in parts if p)
        if root_real in text:  # resolved: no trailing "/" (and never "/" itself: check_models_root)
            out.append({"kind": "process", "name": f"pid {pid} ({comm})", "text": text})
    return out


def in_use(root: str, folders: list[str], *, run, proc: str, read_units: bool = True,
           read_processes: bool = True) -> dict:
    """{"in_use": [{"path", "kind", "name"}...], "units_read": bool, "processes_read": bool}: every folder of
    `folders` (absolute, under `root`) that a live unit or a running process references. `run` asks systemctl
    (subprocess.run on a host), `proc` is where the process table is (/proc on a host)."""
    root_real = os.path.realpath(root)
    sources = unit_sources(run) if read_units else []
    if read_processes:
        sources += process_sources(root_real, proc)
    found, seen = [], set()
    for f in folders:
        rf = os.path.realpath(f)  # a source may name the folder as given or as resolved
        hits = references(sources, [rf], root_real) + (references(sources, [f], root) if f != rf else [])
        for h in hits:
            key = (f, h["kind"], h["name"])
            if key not in seen:
                seen.add(key)
                found.append({"path": f, "kind": h["kind"], "name": h["name"]})
    return {"in_use": found, "units_read": read_units, "processes_read": read_processes}

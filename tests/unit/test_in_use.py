"""What is in use, in detail: the exact questions asked of systemctl and what each answer's parts become,
and the process scan over a /proc tree laid out the way the kernel lays it out (command line, cwd, open
files, maps, mount namespaces). test_storage_safety.py runs the same code against real processes and a
failing systemctl; molecule/storage against real systemd units. This file pins the parts those leave
open (the mutation run of scripts/mutation.sh found them)."""

from __future__ import annotations

import os
import subprocess

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import in_use as iu
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError

LIST_ARGV = ["systemctl", "list-units", "--type=service", "--all", "--no-legend", "--plain", "--no-pager"]


class Systemctl:
    """Answers as systemctl does, recording each call with its keyword arguments."""

    def __init__(self, listing="", show="", rc=(0, 0), err=("", "")):
        self.listing, self.show, self.rc, self.err, self.calls = listing, show, rc, err, []

    def __call__(self, argv, **kw):
        self.calls.append((argv, kw))
        i = 0 if argv[1] == "list-units" else 1
        return subprocess.CompletedProcess(argv, self.rc[i], (self.listing, self.show)[i], self.err[i])


LISTING = "\n".join([
    "a.service loaded active running A",
    "b.service loaded activating start-pre B",
    "c.service loaded reloading reload C",
    "d.service loaded deactivating stop D",
    "e.service loaded activating auto-restart E",
    "f.service loaded failed failed F",
    "g.service loaded inactive dead G",
    "h.socket loaded active listening H",
    "short.service loaded",
    "",
])


def test_the_questions_asked_and_the_live_states(tmp_path):
    run = Systemctl(LISTING, "Id=a.service\nActiveState=active\nSubState=running\n")
    iu.unit_sources(run)
    assert run.calls[0] == (LIST_ARGV, {"capture_output": True, "text": True})
    argv, kw = run.calls[1]
    assert kw == {"capture_output": True, "text": True}
    assert argv == ["systemctl", "show", "--no-pager", "-p", ",".join(iu.PROPS),
                    "a.service", "b.service", "c.service", "d.service", "e.service"]
    # nothing live: no second question, no sources
    run = Systemctl("g.service loaded inactive dead G\n")
    assert iu.unit_sources(run) == [] and len(run.calls) == 1


def test_each_place_a_path_hides_in_a_unit(tmp_path):
    script = tmp_path / "start.sh"
    script.write_text("#!/bin/sh\nexec vllm serve /models/from-script\n")
    pre = tmp_path / "pre.sh"
    pre.write_text("#!/bin/sh\nls /models/from-pre\n")
    env1, env2 = tmp_path / "one.env", tmp_path / "two.env"
    env1.write_text("A=/models/from-env-one\n")
    env2.write_text("B=/models/from-env-two\n")
    show = "\n".join([
        "Id=a.service", "ActiveState=active", "SubState=running",
        f"ExecStartPre={{ path={pre} ; argv[]={pre} ; }}",
        f"ExecStart={{ path={script} ; argv[]={script} --x ; }}",
        "ExecStartPost=/bin/true /models/from-post", "ExecReload=/bin/kill -HUP /models/from-reload",
        "Environment=MODEL=/models/from-env", "Environment=SECOND=/models/from-env-2",
        f"EnvironmentFiles={env1} (ignore_errors=no)",
        f"EnvironmentFiles={env2} (ignore_errors=yes)",
        "EnvironmentFiles=/nonexistent.env (ignore_errors=yes)",
        "WorkingDirectory=/models/from-cwd", "RootDirectory=/models/from-rootdir",
        "BindPaths=/models/from-bind:/m", "BindReadOnlyPaths=/models/from-robind:/r",
        "", "Id=b.service", "ActiveState=activating", "SubState=auto-restart", ""])
    listing = "a.service loaded active running A\nb.service loaded activating auto-restart B\n"
    out = iu.unit_sources(Systemctl(listing, show))
    assert [s["name"] for s in out] == ["a.service (active/running)", "b.service (activating/auto-restart)"]
    assert {s["kind"] for s in out} == {"unit"}
    text = out[0]["text"]
    for where in ("script", "pre", "post", "reload", "env", "env-2", "env-one", "env-two", "cwd", "rootdir", "bind",
                  "robind"):
        assert f"/models/from-{where}" in text.split() or f"/models/from-{where}\n" in text \
            or iu._mentions(text, f"/models/from-{where}"), where
    # the unit's own state words are not part of what is searched
    assert "running" not in text.split("\n") and "active" not in text.split("\n")
    assert out[1]["text"].strip() == ""


@pytest.mark.parametrize("which,rc,message", [
    ("list", 3, "cannot read the host's services (systemctl list-units exited 3: Failed to connect to bus); a plan "
                "that cannot see what runs deletes nothing. Fix systemctl, or plan without units explicitly "
                "(--no-units / storage_cleanup_read_units: false) if nothing on this host serves from the root"),
    ("show", 1, "cannot read the live services' settings (systemctl show exited 1: Failed to connect to bus); "
                "nothing is deleted without them"),
])
def test_a_failing_systemctl_says_which_question_failed(which, rc, message):
    rcs = (rc, 0) if which == "list" else (0, rc)
    err = ("Failed to connect to bus\n", "") if which == "list" else ("", "Failed to connect to bus")
    with pytest.raises(DiskPlanError) as e:
        iu.unit_sources(Systemctl(LISTING, "", rcs, err))
    assert str(e.value) == message
    # stdout is quoted when stderr is empty, at most 200 characters
    with pytest.raises(DiskPlanError) as e:
        iu.unit_sources(Systemctl("x" * 300, "", (4, 0), ("", "")))
    assert "(systemctl list-units exited 4: " + "x" * 200 + ")" in str(e.value)


def test_systemctl_missing():
    def absent(argv, **kw):
        raise FileNotFoundError(2, "No such file or directory", "systemctl")

    with pytest.raises(DiskPlanError) as e:
        iu.unit_sources(absent)
    assert str(e.value).startswith("cannot read the host's services ([Errno 2] No such file or directory: "
                                   "'systemctl'); a plan that cannot see what runs deletes nothing.")


def test_script_text_reads_only_small_scripts(tmp_path):
    s = tmp_path / "s.sh"
    s.write_bytes(b"#!/bin/sh\necho /models/x \xff\n")
    assert iu._script_text(f"{{ path={s} ; argv[]={s} ; }}") == "#!/bin/sh\necho /models/x \ufffd\n"
    assert iu._script_text(f"{s} --flag") == "#!/bin/sh\necho /models/x \ufffd\n"  # a plain command line
    b = tmp_path / "binary"
    b.write_bytes(b"\x7fELF /models/x")
    assert iu._script_text(str(b)) == ""  # not a script
    big = tmp_path / "big.sh"
    big.write_bytes(b"#!/bin/sh\n" + b"#" * iu.SCRIPT_LIMIT)
    assert iu._script_text(str(big)) == ""  # over the limit
    exact = tmp_path / "exact.sh"
    exact.write_bytes(b"#!/bin/sh\n" + b"#" * (iu.SCRIPT_LIMIT - 10))
    assert len(iu._script_text(str(exact))) == iu.SCRIPT_LIMIT  # at the limit: read whole
    assert iu._script_text(str(tmp_path)) == ""  # a folder
    assert iu._script_text(str(tmp_path / "absent")) == "" and iu._script_text("") == ""


def test_env_files_text(tmp_path):
    a, b = tmp_path / "a.env", tmp_path / "b.env"
    a.write_text("A=1\n")
    b.write_text("B=2\n")
    value = f"{a} (ignore_errors=no)\n{tmp_path}/missing (ignore_errors=yes)\n{b} (ignore_errors=yes)"
    assert iu._env_files_text(value) == "A=1\n\nB=2\n"
    assert iu._env_files_text("") == ""


@pytest.mark.parametrize("text,path,below,hit", [
    ("--model /models/a", "/models/a", True, True),
    ("--model /models/a/rev", "/models/a", True, True),
    ("--model /models/a/rev", "/models/a", False, False),
    ("--model /models/ab", "/models/a", True, False),
    ("-v /models/a:/model", "/models/a", False, True),
    ("MODEL='/models/a'", "/models/a", False, True),
    ("X=/models/a;", "/models/a", False, True),
    ('{"m": "/models/a"}', "/models/a", False, True),
    ("[/models/a]", "/models/a", False, True),
    ("/models/a,", "/models/a", False, True),
    ("/models/a}", "/models/a", False, True),
    ("/models/a", "/models/a/", False, True),
    ("/anything", "/", True, False),
    ("/anything", "", True, False),
])
def test_mentions(text, path, below, hit):
    assert iu._mentions(text, path, below) is hit


def test_ancestors_between_root_and_folder():
    assert iu._ancestors("/models/org--a/rev", "/models") == ["/models/org--a"]
    assert iu._ancestors("/models/x/y/z/", "/models/") == ["/models/x/y", "/models/x"]
    assert iu._ancestors("/models/a", "/models") == []
    assert iu._ancestors("/m/aX/X", "/m") == ["/m/aX"]
    assert iu._ancestors("/a/b/c", "/") == ["/a/b", "/a"]
    assert iu._ancestors("/elsewhere/a/b", "/models") == []


def test_a_server_given_the_model_folder_protects_its_revisions():
    src = [{"kind": "process", "name": "pid 1 (vllm)", "text": "vllm serve /models/org--a"}]
    assert iu.references(src, ["/models/org--a/rev1", "/models/org--b/rev1"], "/models") == [
        {"path": "/models/org--a/rev1", "kind": "process", "name": "pid 1 (vllm)"}]
    # a folder above the root protects nothing below it by that rule
    src = [{"kind": "unit", "name": "u", "text": "ls /"}]
    assert iu.references(src, ["/models/org--a/rev1"], "/models") == []


# ------------------------------------------------------------------------------------------ a /proc tree
def _proc(tmp_path, root):
    """A /proc laid out as the kernel does: self (our mount table and namespace), our own pid (skipped) and
    its parent (skipped), and other processes each using the models root one way."""
    proc = tmp_path / "proc"
    ns = tmp_path / "ns"
    ns.mkdir()
    (ns / "mnt:[1]").write_text("")
    (ns / "mnt:[2]").write_text("")
    dev = "0:42"

    def pid(n, *, cmdline="", comm="x", cwd=None, fds=(), maps="", mnt_ns="mnt:[1]", mountinfo="", ppid=1):
        d = proc / str(n)
        (d / "fd").mkdir(parents=True)
        (d / "ns").mkdir()
        (d / "cmdline").write_bytes(cmdline.encode().replace(b" ", b"\0"))
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{n} ({comm} with) paren) S {ppid} 1 1\n")
        if cwd:
            os.symlink(cwd, d / "cwd")
        for i, f in enumerate(fds):
            os.symlink(f, d / "fd" / str(i))
        (d / "maps").write_text(maps)
        os.symlink(ns / mnt_ns, d / "ns" / "mnt")
        (d / "mountinfo").write_text(mountinfo)
        return d

    me, parent = os.getpid(), 999001
    pid(me, cmdline=f"planner {root}/org--me", ppid=parent)
    pid(parent, cmdline=f"ansible {root}/org--parent", ppid=1)
    pid(101, cmdline=f"vllm serve {root}/org--cmd", comm="vllm")
    pid(102, cwd=f"{root}/org--cwd", comm="sh")
    pid(103, fds=["/dev/null", f"{root}/org--fd/rev/model.safetensors"], comm="reader")
    pid(104, maps=f"7f00-7f10 r--s 00000000 00:2a 12 {root}/org--map/rev/model.safetensors\n"
                  "7f20-7f30 r-xp 00000000 00:2a 13\n", comm="mapper")
    # a container: another mount namespace whose mount table binds a folder from under the root's filesystem
    pid(105, cmdline="python3 -m server --model /model", comm="container", mnt_ns="mnt:[2]",
        mountinfo=f"600 500 {dev} /srv/store/org--vol /model ro - ext4 /dev/sdb1 rw\n"
                  f"601 500 0:99 /srv/store/org--other /x ro - ext4 /dev/sdc1 rw\n"
                  f"602 500 {dev} /elsewhere /y ro - ext4 /dev/sdb1 rw\nshort\n")
    pid(106, cmdline="sleep 100", comm="sleep")
    (proc / "self" / "ns").mkdir(parents=True)
    os.symlink(ns / "mnt:[1]", proc / "self" / "ns" / "mnt")
    (proc / "self" / "mountinfo").write_text(
        f"20 1 8:1 / / rw - ext4 /dev/sda1 rw\n30 20 {dev} /srv/store {root} rw - ext4 /dev/sdb1 rw\nbad\n")
    (proc / "not-a-pid").mkdir()
    return proc


def test_process_sources_over_a_proc_tree(tmp_path):
    root = "/models"
    proc = _proc(tmp_path, root)
    found = {s["name"]: s["text"] for s in iu.process_sources(root, str(proc))}
    assert sorted(found) == ["pid 101 (vllm)", "pid 102 (sh)", "pid 103 (reader)", "pid 104 (mapper)",
                             "pid 105 (container)"]
    assert "vllm serve /models/org--cmd" in found["pid 101 (vllm)"]
    assert found["pid 102 (sh)"] == "/models/org--cwd"
    assert found["pid 103 (reader)"].split("\n") == ["/dev/null", "/models/org--fd/rev/model.safetensors"]
    assert found["pid 104 (mapper)"] == "/models/org--map/rev/model.safetensors"
    # the container's bind of <fs>/srv/store/org--vol is /models/org--vol seen from here; other devices and
    # folders outside the root's part of the filesystem are not
    assert found["pid 105 (container)"].split("\n") == ["python3 -m server --model /model", "/models/org--vol"]
    folders = [f"{root}/org--{n}/rev" for n in ("cmd", "cwd", "fd", "map", "vol", "me", "parent", "other")]
    hits = {h["path"] for h in iu.references(iu.process_sources(root, str(proc)), folders, root)}
    assert hits == {f"{root}/org--{n}/rev" for n in ("cmd", "cwd", "fd", "map", "vol")}


def test_root_mount_is_the_longest_mount_holding_the_root(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "30 20 0:42 /store /srv rw - ext4 /dev/sdb1 rw\n"
        "31 20 0:43 /sp\\040ace /mnt/with\\040space rw - ext4 /dev/sdc1 rw\n"
        "x y\n"
        "32 20 0:44 / /srvx rw - ext4 /dev/sdd1 rw\n"
        "33 20 0:45 /over / rw - ext4 /dev/sde1 rw\n")
    assert iu._root_mount("/srv/models", str(proc)) == ("0:42", "/store", "/srv")
    assert iu._root_mount("/srv", str(proc)) == ("0:42", "/store", "/srv")
    assert iu._root_mount("/srvx/m", str(proc)) == ("0:44", "/", "/srvx")
    assert iu._root_mount("/mnt/with space/m", str(proc)) == ("0:43", "/sp ace", "/mnt/with space")
    # a later mount on the same point hides the earlier one
    assert iu._root_mount("/other", str(proc)) == ("0:45", "/over", "/")
    assert iu._root_mount("/x", str(tmp_path / "none")) is None


def test_our_own_ancestry_is_skipped(tmp_path):
    proc = _proc(tmp_path, "/models")
    assert iu._ancestors_of_self(str(proc)) == {str(os.getpid()), "999001", "1"}
    assert iu._ancestors_of_self(str(tmp_path / "empty")) == {str(os.getpid())}


def test_an_unlistable_proc_fails_closed(tmp_path):
    with pytest.raises(DiskPlanError) as e:
        iu.process_sources("/models", str(tmp_path / "absent"))
    message = str(e.value)
    assert message.startswith(f"cannot list processes in {tmp_path / 'absent'} ([Errno 2] No such file or directory")
    assert message.endswith("nothing is deleted without knowing what runs")


def test_in_use_joins_units_and_processes(tmp_path):
    proc = _proc(tmp_path, "/models")
    units = Systemctl("a.service loaded active running A\n",
                      "Id=a.service\nActiveState=active\nSubState=running\nWorkingDirectory=/models/org--unit/rev\n")
    folders = ["/models/org--unit/rev", "/models/org--cmd/rev", "/models/org--idle/rev"]
    r = iu.in_use("/models", folders, run=units, proc=str(proc))
    assert r == {"in_use": [{"path": "/models/org--unit/rev", "kind": "unit", "name": "a.service (active/running)"},
                            {"path": "/models/org--cmd/rev", "kind": "process", "name": "pid 101 (vllm)"}],
                 "units_read": True, "processes_read": True}
    r = iu.in_use("/models", folders, read_units=False, read_processes=False, run=units, proc=str(proc))
    assert r == {"in_use": [], "units_read": False, "processes_read": False}
    # a folder reached through a symlink is matched by the name a source uses, either one
    link = tmp_path / "link"
    os.symlink("/models/org--cmd/rev", link)
    r = iu.in_use("/models", [str(link)], read_units=False, run=None, proc=str(proc))
    assert r["in_use"] == [{"path": str(link), "kind": "process", "name": "pid 101 (vllm)"}]


def test_listing_lines_without_a_description_and_bytes_that_are_not_utf8(tmp_path):
    env = tmp_path / "e.env"
    env.write_bytes(b"A=\xff/models/from-env\n")
    show = f"Id=a.service\nActiveState=active\nSubState=running\nEnvironmentFiles={env} (ignore_errors=no)\n"
    out = iu.unit_sources(Systemctl("a.service loaded active running\n", show))  # four columns: still listed
    assert out[0]["text"].endswith("\n\n\nA=\ufffd/models/from-env\n")
    big = tmp_path / "big.env"
    big.write_bytes(b"#" * iu.SCRIPT_LIMIT + b"\nB=/models/too-far\n")
    assert "/models/too-far" not in iu._env_files_text(f"{big} (ignore_errors=no)")


def test_process_text_that_is_not_utf8(tmp_path):
    proc = _proc(tmp_path, "/models")
    (proc / "106" / "cmdline").write_bytes(b"sleep\0\xfe\0/models/org--odd/rev\0")
    found = {s["name"]: s["text"] for s in iu.process_sources("/models", str(proc))}
    assert found["pid 106 (sleep)"] == "sleep \ufffd /models/org--odd/rev "


def test_names_ending_in_x_and_slashes():
    """Every path rule treats every character alike (the mutation run's strip mutants showed no test used a
    name ending in "X" or a trailing slash)."""
    assert iu._ancestors("/modelsX/org--aX/revX", "/modelsX") == ["/modelsX/org--aX"]
    assert iu._ancestors("/modelsX/org--aX/revX/", "/modelsX/") == ["/modelsX/org--aX"]
    assert iu._mentions("serve /modelsX/aX", "/modelsX/aX/") is True
    assert iu._mentions("serve /modelsX/aX/rev", "/modelsX/aX/", below=True) is True
    src = [{"kind": "unit", "name": "u", "text": "vllm serve /modelsX/org--aX"}]
    assert iu.references(src, ["/modelsX/org--aX/rev"], "/modelsX") == [
        {"path": "/modelsX/org--aX/rev", "kind": "unit", "name": "u"}]


def test_mount_names_ending_in_x(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                                             "30 20 0:42 /storeX /srvX rw - ext4 /dev/sdb1 rw\n")
    assert iu._root_mount("/srvX/models", str(proc)) == ("0:42", "/storeX", "/srvX")
    assert iu._root_mount("/srvX", str(proc)) == ("0:42", "/storeX", "/srvX")


def test_container_binds_below_a_root_ending_in_x(tmp_path):
    proc = _proc(tmp_path, "/modelsX")
    (proc / "self" / "mountinfo").write_text("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                                             "30 20 0:42 /srv/storeX /modelsX rw - ext4 /dev/sdb1 rw\n")
    (proc / "105" / "mountinfo").write_text("600 500 0:42 /srv/storeX/org--vol /model ro - ext4 /dev/sdb1 rw\n"
                                            "601 500 0:42 /srv/storeXY /y ro - ext4 /dev/sdb1 rw\n")
    found = {s["name"]: s["text"] for s in iu.process_sources("/modelsX", str(proc))}
    assert found["pid 105 (container)"].split("\n") == ["python3 -m server --model /model", "/modelsX/org--vol"]


def test_more_places_and_spellings(tmp_path):
    # two ExecStartPre wrapper scripts: both read; an environment file whose path has a blank
    s1, s2 = tmp_path / "one.sh", tmp_path / "two.sh"
    s1.write_text("#!/bin/sh\nls /models/from-one\n")
    s2.write_text("#!/bin/sh\nls /models/from-two\n")
    spaced = tmp_path / "with space.env"
    spaced.write_text("M=/models/from-spaced\n")
    show = (f"Id=a.service\nActiveState=active\nSubState=running\n"
            f"ExecStartPre={{ path={s1} ; argv[]={s1} ; }}\nExecStartPre={{ path={s2} ; argv[]={s2} ; }}\n"
            f"EnvironmentFiles={spaced} (ignore_errors=no)\n")
    text = iu.unit_sources(Systemctl("a.service loaded active running A\n", show))[0]["text"]
    assert "/models/from-one" in text and "/models/from-two" in text and "/models/from-spaced" in text


def test_maps_paths_with_blanks_escapes_and_a_root_at_the_top_of_its_filesystem(tmp_path):
    proc = _proc(tmp_path, "/models")
    (proc / "104" / "maps").write_text("7f00-7f10 r--s 00000000 00:2a 12 /models/org--map/rev/a b.safetensors\n")
    # the root's filesystem mounted at its top (fs root "/"), a container binding a folder with a blank
    (proc / "self" / "mountinfo").write_text("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                                             "30 20 0:42 / /models rw - ext4 /dev/sdb1 rw\n")
    (proc / "105" / "mountinfo").write_text("600 500 0:42 /org\\040vol /model ro - ext4 /dev/sdb1 rw\n")
    found = {s["name"]: s["text"] for s in iu.process_sources("/models", str(proc))}
    assert found["pid 104 (mapper)"] == "/models/org--map/rev/a b.safetensors"
    assert found["pid 105 (container)"].split("\n")[1] == "/models/org vol"


def test_no_mount_table_means_no_container_scan(tmp_path):
    proc = _proc(tmp_path, "/models")
    (proc / "self" / "mountinfo").unlink()
    found = {s["name"] for s in iu.process_sources("/models", str(proc))}
    assert "pid 105 (container)" not in found and "pid 101 (vllm)" in found


def test_a_source_naming_a_folder_by_its_link_and_by_its_target_counts_once(tmp_path):
    root = tmp_path / "m"
    (root / "org--cmd" / "rev").mkdir(parents=True)
    os.symlink(root / "org--cmd" / "rev", root / "alias")
    proc = _proc(tmp_path, str(root))
    (proc / "106" / "cmdline").write_bytes(f"sleep\0{root}/alias\0{root}/org--cmd/rev\0".encode())
    r = iu.in_use(str(root), [str(root / "alias")], read_units=False, run=None, proc=str(proc))
    # pid 101 names the target's folder, pid 106 the link and the target: each once
    assert sorted(r["in_use"], key=lambda u: u["name"]) == [
        {"path": str(root / "alias"), "kind": "process", "name": "pid 101 (vllm)"},
        {"path": str(root / "alias"), "kind": "process", "name": "pid 106 (sleep)"}]
    # named only by the link: found through the spelling the caller gave
    (proc / "106" / "cmdline").write_bytes(f"sleep\0{root}/alias\0".encode())
    (proc / "101" / "cmdline").write_bytes(b"idle\0")
    r = iu.in_use(str(root), [str(root / "alias")], read_units=False, run=None, proc=str(proc))
    assert r["in_use"] == [{"path": str(root / "alias"), "kind": "process", "name": "pid 106 (sleep)"}]


def test_a_wrapper_script_in_a_folder_with_a_blank(tmp_path):
    d = tmp_path / "my dir"
    d.mkdir()
    s = d / "run.sh"
    s.write_text("#!/bin/sh\nexec vllm serve /models/from-blank\n")
    assert "/models/from-blank" in iu._script_text(f"{{ path={s} ; argv[]={s} --x ; ignore_errors=no }}")
    show = f"Id=a.service\nActiveState=active\nSubState=running\nExecStart={{ path={s} ; argv[]={s} ; }}\n"
    assert "/models/from-blank" in iu.unit_sources(Systemctl("a.service loaded active running A\n", show))[0]["text"]


def test_a_block_without_an_id_and_a_long_error():
    out = iu.unit_sources(Systemctl("a.service loaded active running A\n", "ActiveState=active\nSubState=running\n"))
    assert [s["name"] for s in out] == ["? (active/running)"]
    with pytest.raises(DiskPlanError) as e:
        iu.unit_sources(Systemctl("a.service loaded active running A\n", "", (0, 1), ("", "y" * 300)))
    assert "(systemctl show exited 1: " + "y" * 200 + "); nothing" in str(e.value)

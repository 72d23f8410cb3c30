"""Bad input to the harness set-up: no root, podman absent, a missing Debian package - each a clear
message naming the missing piece and how to get it."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.conftest import ROOT


def _path_without(tmp_path, *missing):
    """A PATH holding links to the tools the scripts use, minus `missing`."""
    b = tmp_path / "bin"
    b.mkdir()
    for tool in ("bash", "cat", "sha256sum", "cut", "id", "grep", "awk", "head", "dirname", "mktemp", "rm", "tar",
                 "podman", "debootstrap", "python3", "apt-get", "dpkg-query", "paste", "seq", "sleep", "date"):
        p = shutil.which(tool)
        if p and tool not in missing:
            (b / tool).symlink_to(p)
    return str(b)


def test_podman_absent(tmp_path):
    r = subprocess.run(["/bin/bash", str(ROOT / "images/host/build.sh")], capture_output=True, text=True,
                       env={"PATH": _path_without(tmp_path, "podman")})
    assert r.returncode == 1
    assert "podman is not installed" in r.stderr and "apt-get install podman" in r.stderr


def test_debian_package_missing(tmp_path):
    r = subprocess.run(["/bin/bash", str(ROOT / "images/host/build.sh")], capture_output=True, text=True,
                       env={"PATH": _path_without(tmp_path, "debootstrap")})
    assert r.returncode == 1
    assert "debootstrap is not installed" in r.stderr and "apt-get install debootstrap" in r.stderr


def test_not_root(tmp_path):
    # the script goes in on stdin, so the unprivileged shell needs no access to the checkout (a clone in
    # a 0700 folder, as `mktemp -d` makes, is unreadable to uid 65534)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/bash", "-s"],
                       input=(ROOT / "scripts/setup.sh").read_text(), capture_output=True, text=True,
                       cwd="/", env={"PATH": os.environ["PATH"]})
    assert r.returncode == 1
    assert "must run as root" in r.stderr and "sudo" in r.stderr

"""Lay out a model as a git repository the way a Hugging Face hub-compatible server (olah, offline
mirror mode) serves it: `<mirrors>/models/<org>/<name>` is a non-bare git repo whose large files are
committed as Git LFS pointer files, with the objects under `.git/lfs/objects/<aa>/<bb>/<sha256>`.

No git-lfs binary is needed: the pointer text and the object store are written here. The repo gets
two commits (so revision pinning is testable) and a tag `v1` on the first:
  1. the model as built,
  2. a README.md change only (weights identical, so both revisions share LFS objects).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "modelfleet", "GIT_AUTHOR_EMAIL": "harness@modelfleet.invalid",
    "GIT_COMMITTER_NAME": "modelfleet", "GIT_COMMITTER_EMAIL": "harness@modelfleet.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, **GIT_ENV)
    env.pop("GIT_DIR", None)
    r = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def _add_lfs_file(repo: Path, src: Path, rel: str, sparse_head: int = 0) -> None:
    if sparse_head:
        # a shape-faithful sparse shard (GBs apparent, a header of real bytes, then a hole): its LFS pointer gives
        # the real size, but the object holds only the first `sparse_head` bytes, so that the hub serves a header
        # read without reading (or buffering) GBs of zeros; its oid is the sha256 of those bytes and the size.
        # Only for header-only reads (inspection benchmarks): a download of it fails verification, as it should.
        size = src.stat().st_size
        with open(src, "rb") as f:
            head = f.read(sparse_head)
        oid = hashlib.sha256(head + str(size).encode()).hexdigest()
        obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(head)
        (repo / rel).write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n")
        return
    data = src.read_bytes()
    oid = hashlib.sha256(data).hexdigest()
    obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(data)
    (repo / rel).write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n")


def publish(model_dir: str | Path, mirrors: str | Path, repo_id: str, sparse_head: int = 0) -> dict:
    """Create (or recreate) the hub repo for `repo_id` from `model_dir`. Returns the commits. sparse_head > 0:
    LFS objects hold only that many leading bytes, their pointers the real size (for sparse synthetic checkpoints,
    whose headers are all that is read; see _add_lfs_file)."""
    org, name = repo_id.split("/")
    repo = Path(mirrors) / "models" / org / name
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "commit.gpgsign", "false")
    (repo / ".gitattributes").write_text("".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES))
    for src in sorted(Path(model_dir).iterdir()):
        if not src.is_file() or src.name.startswith("."):
            continue
        if src.name.endswith(LFS_SUFFIXES):
            _add_lfs_file(repo, src, src.name, sparse_head)
        else:
            shutil.copyfile(src, repo / src.name)
    (repo / "README.md").write_text(f"# {repo_id}\n\nTiny test model built by modelfleet's harness.\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "Add model")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "v1")
    (repo / "README.md").write_text(f"# {repo_id}\n\nTiny test model built by modelfleet's harness.\n\nRevision 2.\n")
    _git(repo, "commit", "-q", "-am", "Update README")
    second = _git(repo, "rev-parse", "HEAD")
    return {"repo_id": repo_id, "path": str(repo), "commits": [first, second], "tag_v1": first, "main": second}

"""Every inode under a folder, to show that a command changed nothing (or nothing but what it was allowed to)."""

from __future__ import annotations

import os


def snapshot(top) -> dict:
    """path -> (dev, ino, mode, size, mtime_ns, link target) for files and links, (dev, ino, mode) for folders
    (a folder's size and mtime move when an entry in it goes). Symlinks are never followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if os.path.isdir(p) and not os.path.islink(p):
                out[p] = (st.st_dev, st.st_ino, st.st_mode)
            else:
                out[p] = (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns,
                          os.readlink(p) if os.path.islink(p) else None)
    return out

"""One reader for secret files (the hub token, a benchmark API key): the file must be a regular file that
only its owner can read or write (no group/other bits), and hold one line. Used by hf_lock, hf_snapshot and
`modelfleet bench --api-key-file`, so every secret is read under the same rule."""

from __future__ import annotations

import os
import stat

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

MAX_SECRET_BYTES = 64 * 1024


class SecretFileError(ModelfleetError):
    """A secret file is missing, shared with other users, or not one line."""


def read_secret_file(path: str, what: str = "secret file") -> str:
    """The stripped content, or None-like '' for an empty file. Never follows into a FIFO or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise SecretFileError(f"{what} {path}: cannot read ({e.strerror}); check the path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"{what} {path}: not a regular file; point at the file that holds the secret")
        if st.st_mode & 0o077:
            raise SecretFileError(f"{what} {path} is readable or writable by group/others (mode "
                                  f"{oct(st.st_mode & 0o777)}); chmod 600 {path}")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileError(f"{what} {path}: larger than {MAX_SECRET_BYTES} bytes; it should hold one line")
    text = data.decode("utf-8", "replace").strip()
    if "\n" in text or "\r" in text or "\0" in text:
        raise SecretFileError(f"{what} {path}: more than one line; keep only the secret in it")
    return text

"""Bounded reading of safetensors headers: 8 bytes of little-endian header length, then that many
bytes of JSON. Only header bytes are ever read; the weights are never touched.

Every check names the file: a declared length over the cap, a header past the end of the file,
invalid JSON, a tensor entry without dtype/shape/offsets, offsets that leave the data section or
disagree with shape x dtype."""

from __future__ import annotations

import json
import struct
from math import prod

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import CheckpointError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fastjson import JSONError, loads

MAX_HEADER_BYTES = 100 * 10**6

# Bits per element of each safetensors dtype.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


def decode_length(name: str, prefix: bytes, file_size: int | None) -> int:
    """The declared header length from the first 8 bytes, checked against the cap and the file size."""
    if len(prefix) < 8:
        raise CheckpointError(f"{name}: truncated safetensors file ({len(prefix)} bytes, need at least 8)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{name}: declared header length {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit "
            "(not a safetensors file, or corrupt)"
        )
    if n < 2:
        raise CheckpointError(f"{name}: declared header length {n} is too small for a JSON header")
    if file_size is not None and 8 + n > file_size:
        raise CheckpointError(
            f"{name}: header of {n} bytes runs past the end of the file ({file_size} bytes); "
            "the file is truncated - fetch it again"
        )
    return n


def parse_header(name: str, raw: bytes, header_len: int, file_size: int | None) -> dict:
    """Validate the JSON header and every tensor entry; return {tensor_name: {dtype, shape, data_offsets}}
    plus '__metadata__' if present."""
    try:
        header = loads(raw)
    except JSONError as e:
        raise CheckpointError(f"{name}: header is not valid JSON ({e.__class__.__name__}: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{name}: header is JSON but not an object")
    data_size = None if file_size is None else file_size - 8 - header_len
    for tname, entry in header.items():
        if tname == "__metadata__":
            continue
        try:
            dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError):
            raise CheckpointError(f"{name}: tensor {tname!r} entry lacks dtype, shape or data_offsets") from None
        bits = DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
        if bits is None:
            raise CheckpointError(f"{name}: tensor {tname!r} has unknown dtype {dtype!r}")
        try:
            bad_shape = not isinstance(shape, list) or bool(shape and min(shape) < 0)
        except TypeError:
            bad_shape = True
        if bad_shape:
            raise CheckpointError(f"{name}: tensor {tname!r} has an invalid shape {shape!r}")
        # exact classes, inline (this loop runs once per tensor, 200k times for a 1T model): a JSON integer is an
        # int and never a bool (True is an int to isinstance, and never an offset or a size here)
        if (offs.__class__ is not list or len(offs) != 2 or offs[0].__class__ is not int
                or offs[1].__class__ is not int or not 0 <= offs[0] <= offs[1]):
            raise CheckpointError(f"{name}: tensor {tname!r} has invalid data_offsets {offs!r}")
        if data_size is not None and offs[1] > data_size:
            raise CheckpointError(
                f"{name}: tensor {tname!r} data_offsets {offs} leave the file "
                f"(data section is {data_size} bytes); the file is truncated or corrupt"
            )
        want = (prod(shape) * bits + 7) // 8
        if want.__class__ is not int:
            raise CheckpointError(f"{name}: tensor {tname!r} has an invalid shape {shape!r}")
        if offs[1] - offs[0] != want:
            raise CheckpointError(
                f"{name}: tensor {tname!r} spans {offs[1] - offs[0]} bytes but shape {shape} x {dtype} "
                f"needs {want}"
            )
    return header


def open_regular(path: str, name: str):
    """Open a file for reading only if it is a regular file (through symlinks, as the hub cache's snapshots
    are): a FIFO, socket or device is refused without blocking on it (O_NONBLOCK, checked with fstat)."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"{name}: not a regular file (a FIFO, socket or device); "
                                  "a checkpoint holds only files - remove it or point at the right folder")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_local_header(path: str, display_name: str | None = None) -> tuple[dict, int]:
    """Read one local shard's header. Returns (header, bytes_read)."""
    import os

    name = display_name or os.path.basename(path)
    try:
        with open_regular(path, name) as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            n = decode_length(name, prefix, size)
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{name}: cannot read shard ({e.strerror})") from None
    return parse_header(name, raw, n, size), 8 + len(raw)


def encode_header(tensors: dict, metadata: dict | None = None, align: int = 8) -> bytes:
    """The 8-byte length plus JSON header for tensors {name: (dtype, shape)} laid out in sorted order.
    Returns the prefix bytes; the data section size is sum of the tensor sizes. Used to build
    shape-faithful synthetic checkpoints (the data section can then be a sparse hole)."""
    hdr: dict = {}
    if metadata:
        hdr["__metadata__"] = metadata
    off = 0
    for tname in sorted(tensors):
        dtype, shape = tensors[tname]
        elems = 1
        for d in shape:
            elems *= d
        nbytes = (elems * DTYPE_BITS[dtype] + 7) // 8
        hdr[tname] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    pad = (-(8 + len(raw))) % align
    raw += b" " * pad
    return struct.pack("<Q", len(raw)) + raw, off

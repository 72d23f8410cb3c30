"""Byte arithmetic with explicit units. Inside, everything is an int of bytes; these helpers are for
the edges, and always show decimal (GB, 10^9) and binary (GiB, 2^30) side by side, because mixing
them is how the seed's disk arithmetic went wrong by ~185 GB."""

from __future__ import annotations

GB = 10**9
GiB = 2**30
MB = 10**6
MiB = 2**20


def fmt_bytes(n: int) -> str:
    """'595.15 GB (554.27 GiB)' for large values; plain bytes below 1 MB."""
    n = int(n)
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a < MB:
        return f"{n} B"
    if a < GB:
        return f"{sign}{a / MB:.2f} MB ({a / MiB:.2f} MiB)"
    return f"{sign}{a / GB:.2f} GB ({a / GiB:.2f} GiB)"


def both_units(n: int) -> dict:
    """The same figure as bytes, GB and GiB, for JSON output."""
    n = int(n)
    return {"bytes": n, "gb": round(n / GB, 3), "gib": round(n / GiB, 3)}


def parse_size(value) -> int:
    """Parse a byte count given by a person: an int, or a string such as '595GB', '554GiB', '1.5 TB',
    '1048576'. Decimal suffixes (KB, MB, GB, TB) are powers of 10, binary ones (KiB ... TiB) powers of 2.
    Raises ValueError with the accepted forms on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != int(value):
            raise ValueError(f"a byte count must be whole: {value!r}")
        return int(value)
    s = str(value).strip().replace(" ", "").replace("_", "")
    units = {
        "": 1, "B": 1,
        "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
        "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
    }
    num = s.rstrip("BbIiKkMmGgTtPp")
    suffix = s[len(num):].upper()
    if suffix not in units or not num:
        raise ValueError(
            f"not a size: {value!r} (use an integer of bytes, or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB)"
        )
    try:
        x = float(num)
    except ValueError:
        raise ValueError(f"not a size: {value!r}") from None
    return int(round(x * units[suffix]))

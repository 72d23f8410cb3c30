"""Byte arithmetic with explicit units. Inside, everything is an int of bytes; these helpers are for
the edges, and always show decimal (GB, 10^9) and binary (GiB, 2^30) side by side, because mixing
them is how the seed's disk arithmetic went wrong by ~185 GB."""

from __future__ import annotations

import math

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


MAX_SIZE = 2**63 - 1  # what a filesystem can report; anything larger is a typo
HELP = "use a whole number of bytes, or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB (e.g. 595GB, 554GiB)"


def parse_size(value) -> int:
    """Parse a byte count given by a person: an int, or a string such as '595GB', '554GiB', '1.5 TB',
    '1048576'. Decimal suffixes (KB, MB, GB, TB) are powers of 10, binary ones (KiB ... TiB) powers of 2.
    Raises ValueError naming the accepted forms on anything else: negatives, NaN, infinities, values past
    2**63-1 (1e400 included), fractions of a byte, booleans."""
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a size: {value!r} ({HELP})")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"not a size: {value!r} ({HELP})")
        if value != int(value):
            raise ValueError(f"a byte count must be whole: {value!r} ({HELP})")
        n = int(value)
    else:
        s = str(value).strip().replace(" ", "").replace("_", "")
        units = {
            "": 1, "B": 1,
            "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
            "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
        }
        num = s.rstrip("BbIiKkMmGgTtPp")
        suffix = s[len(num):].upper()
        if suffix not in units or not num:
            raise ValueError(f"not a size: {value!r} ({HELP})")
        try:
            x = Decimal(num)
        except InvalidOperation:
            raise ValueError(f"not a size: {value!r} ({HELP})") from None
        if not x.is_finite():
            raise ValueError(f"not a size: {value!r} ({HELP})")
        if abs(x) > Decimal(MAX_SIZE):
            raise ValueError(f"size {value!r} is larger than any disk ({HELP})")
        exact = x * units[suffix]
        if exact != exact.to_integral_value():
            raise ValueError(f"a byte count must be whole: {value!r} ({HELP})")
        n = int(exact)
    if n < 0:
        raise ValueError(f"a size cannot be negative: {value!r} ({HELP})")
    if n > MAX_SIZE:
        raise ValueError(f"size {value!r} is larger than any disk ({HELP})")
    return n

"""Read a rendered systemd unit back the way systemd reads it: sections, directives, line continuations,
words split and unquoted by systemd's rules (C escapes, double and single quotes), `%%` specifier escapes.

Pure standard library, no Ansible import: the GPU sandbox check (scripts/device/) loads this file on a
machine that has no Ansible, and the tests use it to check what a rendered unit really says."""

from __future__ import annotations

import posixpath

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "s": " ",
           "\\": "\\", '"': '"', "'": "'"}


class UnitFileError(ValueError):
    """The text is not a unit systemd would read the same way."""


def directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) for every assignment, in order; continued lines joined with a space."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw if pending else raw.strip()
        if pending:
            pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if "=" not in line:
            raise UnitFileError(f"[{section}] line {line!r} has no '='")
        key, value = line.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    if pending:
        raise UnitFileError("the unit ends inside a continued line")
    return out


def values(text: str, key: str, section: str = "Service") -> list[str]:
    """Every raw value of `key` in `section`, in order (an empty value resets a list in systemd: kept)."""
    return [v for s, k, v in directives(text) if s == section and k == key]


def last(text: str, key: str, section: str = "Service", default: str | None = None) -> str | None:
    found = values(text, key, section)
    return found[-1] if found else default


def unescape_specifiers(word: str) -> str:
    """Only `%%` is supported: any other specifier makes the value depend on the host it runs on."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1:i + 2] == "%":
                out.append("%")
                i += 2
                continue
            raise UnitFileError(f"specifier {word[i:i + 2]!r} in {word!r}: not expanded by this reader")
        out.append(word[i])
        i += 1
    return "".join(out)


def split_words(value: str) -> list[str]:
    """systemd's extract_first_word with unquoting and C unescaping, applied until the value is used up."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    quote = ""
    i = 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            if i + 1 >= len(value):
                raise UnitFileError(f"trailing backslash in {value!r}")
            n = value[i + 1]
            if n == "x":
                hexpart = value[i + 2:i + 4]
                if len(hexpart) != 2 or any(h not in "0123456789abcdefABCDEF" for h in hexpart):
                    raise UnitFileError(f"bad \\x escape in {value!r}")
                cur.append(chr(int(hexpart, 16)))
                i += 4
            elif n in ESCAPES:
                cur.append(ESCAPES[n])
                i += 2
            else:
                raise UnitFileError(f"unknown escape \\{n} in {value!r}")
            in_word = True
            continue
        if quote:
            if c == quote:
                quote = ""
            else:
                cur.append(c)
            i += 1
            continue
        if c in "\"'":
            quote = c
            in_word = True
        elif c in " \t":
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
        else:
            cur.append(c)
            in_word = True
        i += 1
    if quote:
        raise UnitFileError(f"unterminated quote in {value!r}")
    if in_word:
        words.append("".join(cur))
    return [unescape_specifiers(w) for w in words]


def environment(text: str) -> dict[str, str]:
    """The variables the unit's Environment= lines set (later assignments win, as in systemd)."""
    env: dict[str, str] = {}
    for value in values(text, "Environment"):
        if not value:
            env.clear()
            continue
        for word in split_words(value):
            if "=" not in word:
                raise UnitFileError(f"Environment= word {word!r} is not NAME=value")
            k, v = word.split("=", 1)
            env[k] = v
    return env


def path_list(text: str, key: str) -> list[str]:
    """A space-separated path setting (ReadWritePaths=, ReadOnlyPaths=, ...), with systemd's '-' (ignore if
    missing) and '+' prefixes stripped."""
    out: list[str] = []
    for value in values(text, key):
        if not value:
            out.clear()
            continue
        out.extend(w.lstrip("-+") for w in split_words(value))
    return out


def is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (both normalised; no symlinks resolved)."""
    p, f = posixpath.normpath(path), posixpath.normpath(folder)
    return p == f or p.startswith(f.rstrip("/") + "/")

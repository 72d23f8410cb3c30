#!/usr/bin/env python3
"""Sort mutmut's surviving mutants into classes (scripts/mutation.sh runs it after mutmut).

Reads the work folder mutmut ran in: `results.txt` (one "<name>: <status>" per mutant) and the mutated
sources under `mutants/`, where mutmut keeps every mutant as a function `x_<func>__mutmut_<n>` beside the
original `x_<func>__mutmut_orig`. For each survivor it diffs the two functions and puts it in a class:

  message   the only change is inside string literals that are prose (an error message, a reason, a
            log line: the literal has a space in it). The bad-input suite asserts that each message
            names the field and a fix (a pattern per case), not every word of it.
  explained listed with a reason in the explanations file (scripts/mutation-explained.txt): one line
            per mutant, "<name>  <reason>", written after reading the mutant (equivalent mutants, and
            changes a test cannot observe without asserting an implementation detail).
  open      everything else: a mutant to kill with a test or to explain. mutation.sh exits 1 while any
            is open.

Prints the counts per class and per function, then each open mutant with its diff line(s).
"""

from __future__ import annotations

import ast
import difflib
import io
import os
import re
import sys
import tokenize
from collections import Counter

NAME_RE = re.compile(r"^(?P<module>[\w.]+)\.(?P<func>x[_\u01c1].*?)__mutmut_(?P<n>\d+)$")  # x_f, xǁClassǁmethod


def short_name(name: str) -> str:
    """<...>.module_utils.modelfleet.disk.x_plan_disk__mutmut_12 -> disk.plan_disk__12"""
    m = NAME_RE.match(name)
    return f"{m['module'].rsplit('.', 1)[-1]}.{m['func'][2:].replace(chr(0x1c1), '.')}__{m['n']}"


def load_results(work: str) -> dict[str, str]:
    out = {}
    with open(os.path.join(work, "results.txt"), encoding="utf-8") as fh:
        for line in fh:
            name, sep, status = line.strip().rpartition(": ")
            if sep and NAME_RE.match(name.strip()):
                out[name.strip()] = status
    return out


def function_sources(path: str) -> dict[str, str]:
    """Every top-level function and method in a mutated file, by its mutmut name (x_f / xǁClassǁm)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    tree = ast.parse(text)
    lines = text.splitlines()
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            start = node.lineno - 1 if not node.decorator_list else node.decorator_list[0].lineno - 1
            out[node.name] = "\n".join(lines[start:node.end_lineno])
    return out


def tokens(src: str) -> list[tuple[int, str]]:
    try:
        return [
            (t.type, t.string)
            for t in tokenize.generate_tokens(io.StringIO(src).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


STRING_TYPES = {tokenize.STRING}
for _n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END"):
    if hasattr(tokenize, _n):
        STRING_TYPES.add(getattr(tokenize, _n))


def is_prose(s: str) -> bool:
    body = s.strip("\"'rbfuRBFU")
    return " " in body


def fstring_fields(s: str) -> list[str]:
    """The replacement fields ({...}) of an f-string literal: code, not prose ("" when it is no f-string)."""
    prefix = s[: len(s) - len(s.lstrip("rbfuRBFU"))]
    if "f" not in prefix.lower():
        return []
    body = s[len(prefix):].replace("{{", "").replace("}}", "")
    return re.findall(r"\{[^{}]*\}", body)


def classify(orig: str, mutant: str) -> str:
    """'message' when only prose string tokens differ, else 'open' (both named alike: same_name)."""
    a, b = tokens(orig), tokens(mutant)
    if not a or not b:
        return "open"
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        changed = a[i1:i2] + b[j1:j2]
        if op != "replace" or (i2 - i1) != (j2 - j1):
            return "open"
        for (ta, sa), (tb, sb) in zip(a[i1:i2], b[j1:j2], strict=True):
            if ta not in STRING_TYPES or tb not in STRING_TYPES:
                return "open"
            if not (is_prose(sa) or is_prose(sb)):
                return "open"
            if fstring_fields(sa) != fstring_fields(sb):  # the change is in a field's code, not in the prose
                return "open"
        if not changed:
            return "open"
    return "message"


def diff_lines(orig: str, mutant: str) -> list[str]:
    a, b = orig.splitlines(), mutant.splitlines()
    return [
        line.rstrip()
        for line in difflib.unified_diff(a, b, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def load_explained(path: str) -> dict[str, str]:
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, _, reason = line.strip().partition(" ")
            if not reason.strip():
                raise SystemExit(f"{path}: {name}: an explanation needs a reason after the name")
            out[name] = reason.strip()
    return out


def main(argv: list[str]) -> int:
    work = argv[1] if len(argv) > 1 else "/var/tmp/modelfleet-mutation"
    explained_path = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(__file__), "mutation-explained.txt")
    results = load_results(work)
    explained = load_explained(explained_path)
    sources: dict[str, dict[str, str]] = {}
    classes: Counter = Counter()
    per_func: Counter = Counter()
    open_ones = []
    for name, status in sorted(results.items()):
        if status != "survived":
            continue
        m = NAME_RE.match(name)
        module, func = m["module"], m["func"]
        path = os.path.join(work, "mutants", *module.split(".")) + ".py"
        if path not in sources:
            sources[path] = function_sources(path)
        funcs = sources[path]
        mname = f"{func}__mutmut_{m['n']}"
        orig, mut = funcs.get(f"{func}__mutmut_orig"), funcs.get(mname)
        if mut is not None:  # the same name in both, so that only the mutation differs
            mut = mut.replace(mname, f"{func}__mutmut_orig", 1)
        short = short_name(name)
        if short in explained or name in explained:
            cls = "explained"
        elif orig is None or mut is None:
            cls = "open"
        else:
            cls = classify(orig, mut)
        classes[cls] += 1
        if cls == "open":
            per_func[short_name(name).rsplit("__", 1)[0]] += 1
            open_ones.append((short, diff_lines(orig or "", mut or "")))
    survivors = {short_name(n) for n, status in results.items() if status == "survived"}
    modules = {short_name(n).split(".", 1)[0] for n in results}  # a run over some files judges only theirs
    stale = sorted(x for x in set(explained) - survivors if x.split(".", 1)[0] in modules)
    total = sum(classes.values())
    print(f"surviving mutants: {total} (message text {classes['message']}, explained {classes['explained']}, "
          f"open {classes['open']})")
    if stale:
        print(f"explanations that name no surviving mutant of this run ({len(stale)}; killed now, or renumbered "
              "by a change to the function): "
              + ", ".join(stale[:10]) + (" ..." if len(stale) > 10 else ""))
    if per_func:
        print("open, per function: " + ", ".join(f"{f} {n}" for f, n in per_func.most_common()))
    for short, lines in open_ones:
        print(f"  {short}")
        for line in lines[:4]:
            print(f"      {line.strip()[:150]}")
    return 1 if classes["open"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Checks the size limits: no function over 100 lines and no file over 800 lines in any folder
with code (ROOTS: the library, its headers, the rules, tests, examples and benchmarks; generated
tables aside). Prints each offender; exits 1 when any. Arguments, when given, replace ROOTS.
With --near, also lists (without failing) the files and functions above 90% of a limit: issue 40
asks that no file it touches stays there.

A function is a brace block opened at namespace or class level after a parameter list (the
text before the '{' ends with ')', possibly followed by qualifiers); a gtest TEST(...) { } body
is one. Comments, strings, character literals and preprocessor lines are blanked first, so
braces inside them do not count. Its length is counted from the first line of its declaration
to the line of its closing brace."""
import re
import sys
from pathlib import Path

MAX_FUNCTION = 100
MAX_FILE = 800
REPO = Path(__file__).resolve().parent.parent
ROOTS = ["src", "include", "rules/src", "rules/include", "tests", "examples", "bench"]
GENERATED = {"py_unicode_tables.cpp"}


def blank(text):
    """Comments, strings and char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
            k = text.find("(", i)
            delim = text[i + 2:k]
            j = text.find(")" + delim + '"', k)
            j = n if j < 0 else j + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(c)  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return blank_preprocessor("".join(out))


def blank_preprocessor(src):
    """Preprocessor lines (and their backslash continuations) replaced by spaces."""
    lines = src.split("\n")
    continued = False
    for k, line in enumerate(lines):
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
    return "\n".join(lines)


HEAD_END = re.compile(r"\)\s*(const|noexcept|override|final|mutable|&|&&|->\s*[\w:<>,\s*&]+|\s)*$")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^;(){}]*$")


def functions(text):
    """(name line, end line) of each function body at namespace or class level."""
    src = blank(text)
    stack = []  # kinds of open braces: 'scope', 'function', 'other'
    found = []
    start_of_statement = 0
    for i, c in enumerate(src):
        if c == "{":
            before = src[start_of_statement:i]
            # Only at namespace or class level: a lambda inside a function or inside a table's
            # initialiser (`= { {f, [](double x) { ... }}, ... }`) is not a function of its own.
            at_scope_level = all(k == "scope" for k, _ in stack)
            if at_scope_level and SCOPE.search(before) and "=" not in before:
                stack.append(("scope", i))
            elif at_scope_level and HEAD_END.search(before) and before.strip():
                stack.append(("function", i))
                head = before.strip()
                head_pos = src.index(head, start_of_statement)
                found.append([src.count("\n", 0, head_pos) + 1, None, len(stack) - 1])
            else:
                stack.append(("other", i))
            start_of_statement = i + 1
        elif c == "}":
            if stack:
                kind, _ = stack.pop()
                if kind == "function":
                    for f in reversed(found):
                        if f[1] is None and f[2] == len(stack):
                            f[1] = src.count("\n", 0, i) + 1
                            break
            start_of_statement = i + 1
        elif c == ";":
            start_of_statement = i + 1
        elif c == ":" and i + 1 < len(src) and src[i + 1] != ":" and (i == 0 or src[i - 1] != ":"):
            # access specifiers and labels end a statement; ctor initialiser lists do not matter
            word = src[start_of_statement:i].strip()
            if word in ("public", "private", "protected"):
                start_of_statement = i + 1
    return [(a, b) for a, b, _ in found if b is not None]


NEAR = 0.9


def main(roots, near=False):
    bad = []
    close = []
    for root in roots:
        root = Path(root) if Path(root).is_absolute() else REPO / root
        for path in sorted(root.rglob("*")):
            shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            if path.suffix not in (".cpp", ".hpp", ".h") or path.name in GENERATED:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = text.count("\n")
            if near and NEAR * MAX_FILE < lines <= MAX_FILE:
                close.append(f"{shown}: {lines} lines (above {NEAR:.0%} of {MAX_FILE})")
            if lines > MAX_FILE:
                bad.append(f"{shown}: {lines} lines (a file may have {MAX_FILE})")
            for a, b in functions(text):
                if near and NEAR * MAX_FUNCTION < b - a + 1 <= MAX_FUNCTION:
                    close.append(f"{shown}:{a}: a function of {b - a + 1} lines "
                                 f"(above {NEAR:.0%} of {MAX_FUNCTION})")
                if b - a + 1 > MAX_FUNCTION:
                    name = text.splitlines()[a - 1].strip()
                    bad.append(f"{shown}:{a}: a function of {b - a + 1} lines ({MAX_FUNCTION} at most): {name[:80]}")
    for c in close:
        print("near:", c)
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--near"]
    sys.exit(main(args or ROOTS, near="--near" in sys.argv[1:]))

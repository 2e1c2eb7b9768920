#!/usr/bin/env python3
"""Runs the examples of the docs and compares what the binary prints with what the docs show.

  scripts/doc_examples.py --check BINARY [DOC.md ...]    exit 1, with a diff, on any difference
  scripts/doc_examples.py --update BINARY [DOC.md ...]   rewrite each block with what BINARY prints

Without DOC arguments the files of DOCS below are read (add a doc there by name).

An example is a fenced code block (``` or ~~~, indented or not, as in a list item) whose first
line starts with `$ shardplan `: the command, continued over lines ending in `\\`, then exactly
what it prints on stdout, up to the closing fence.
- The command ends in `2>&1`: stderr is shown too, in the same output (as a shell's pipe would
  show it). Without it the command must print nothing on stderr.
- The last line is `[exit N]`: the command exits with N. Without it, it must exit 0.
- `<!-- example: not run (REASON) -->` on the line before the opening fence: the block is not
  run (it needs a checkpoint of gigabytes, mpirun, ...). Every other `$ shardplan` block is run;
  a `$ shardplan` line that is not the first line of its block, a marker that is not before
  such a block or gives no reason, and shell syntax other than `2>&1` are errors.
- Each command runs as BINARY (for `shardplan`) with the arguments as written (split as a POSIX
  shell splits them), in a new scratch directory holding FIXTURES, with no SHARDPLAN_*
  variables in its environment.
- Figures that differ from run to run (MASKS: the planning time) are compared with the number
  masked; --update keeps the doc's figure on a line that is otherwise unchanged, so that a time
  measured on a Release build is not replaced by a Debug one. Nothing else is masked: bytes,
  FLOPs and modelled times are compared as printed.
Other fenced blocks are left alone."""
import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The docs whose examples are run, relative to the repository.
DOCS = ["docs/cli.md", "docs/training.md", "docs/concepts.md", "docs/profiling.md"]
# What the scratch directory holds: (folder in the repository, where in the scratch directory).
# Each Hugging Face config folder <Name>/ is copied to <Name>/; the preset rule files to
# rules/presets/ (as a checkout has them); the hand-written traces to traces/; the stacks' own
# configs (train-plan --from-config) to stack_configs/.
FIXTURES = [("tests/data/hf_configs", "."), ("rules/presets", "rules/presets"),
            ("tests/data/traces", "traces"), ("tests/data/stack_configs", "stack_configs")]
# Figures that differ from run to run, each the second group of its pattern. Keep this short:
# never a memory, bytes, FLOPs or modelled-time figure.
MASKS = [
    ("the planning time", re.compile(r"(planned in )(\d+(?:\.\d+)?)( s\b)")),  # train-plan
    ("seconds_to_plan", re.compile(r'("seconds_to_plan": )([-+.\deE]+)')),   # train-plan --json
]
COMMAND = re.compile(r"^\$ shardplan(\s|$)")
MARKER = re.compile(r"^\s*<!-- example: not run \((.*)\) -->\s*$")
MARKER_START = "<!-- example:"
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
EXIT_LINE = re.compile(r"^\[exit (\d+)\]$")
SHELL_OPERATOR = set("();<>|&")
TIMEOUT_S = 1800


@dataclass
class Example:
    doc: Path
    name: str              # the doc's name as printed (relative to the repository)
    line: int              # 1-based line of the command
    indent: str            # the fence's indentation, re-added by --update
    command_lines: list    # the command as written (without indentation)
    out_begin: int         # 0-based index of the first output line in the doc
    out_end: int           # 0-based index of the closing fence
    expected: list         # output lines as shown, the [exit N] line included
    not_run: str = None    # the marker's reason
    argv: list = field(default_factory=list)
    merge_stderr: bool = False

    def where(self):
        return f"{self.name}:{self.line}"


def display_name(path):
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def dedent(line, indent):
    """The line without the fence's indentation (less if the line has less)."""
    n = 0
    while n < len(indent) and n < len(line) and line[n] in " \t":
        n += 1
    return line[n:]


def parse_command(ex, errors):
    """Fills ex.argv and ex.merge_stderr from ex.command_lines; appends errors."""
    parts = []
    for i, line in enumerate(ex.command_lines):
        text = line[2:] if i == 0 else line
        last = i == len(ex.command_lines) - 1
        parts.append(text if last else text[:-1])
    command = " ".join(parts).rstrip()
    if command.endswith(" 2>&1"):
        ex.merge_stderr = True
        command = command[:-len(" 2>&1")]
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        argv = list(lexer)
    except ValueError as e:
        errors.append(f"{ex.where()}: the command cannot be split as a shell would: {e}")
        return
    bad = [a for a in argv if (a and set(a) <= SHELL_OPERATOR) or "$" in a or "`" in a]
    if bad:
        errors.append(f"{ex.where()}: shell syntax {bad[0]!r} is not run; an example is one "
                      "shardplan command, optionally ending in 2>&1")
    ex.argv = argv


def find_examples(doc, errors):
    """The `$ shardplan` blocks of one markdown file; problems appended to errors."""
    name = display_name(doc)
    lines = doc.read_text(encoding="utf-8").split("\n")
    examples = []
    marker_at = {}
    for i, line in enumerate(lines):
        if MARKER_START in line:
            m = MARKER.match(line)
            if not m or not m.group(1).strip():
                errors.append(f"{name}:{i + 1}: write the marker as "
                              "'<!-- example: not run (REASON) -->' with a reason, on its own line")
            else:
                marker_at[i] = m.group(1).strip()
    used_markers = set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group(1), m.group(2)
        close = i + 1
        while close < len(lines):
            rest = lines[close].strip()
            if rest.startswith(fence) and set(rest) <= {fence[0]}:
                break
            close += 1
        if close == len(lines):
            errors.append(f"{name}:{i + 1}: a code block that is never closed")
            break
        body = [dedent(l, indent) for l in lines[i + 1:close]]
        for k, text in enumerate(body):
            if COMMAND.match(text) and k > 0:
                errors.append(f"{name}:{i + 2 + k}: a `$ shardplan` line that is not the first "
                              "line of its block is not run: one command per block, first")
        if body and COMMAND.match(body[0]):
            n = 1
            while body[n - 1].endswith("\\") and n < len(body):
                n += 1
            ex = Example(doc=doc, name=name, line=i + 2, indent=indent, command_lines=body[:n],
                         out_begin=i + 1 + n, out_end=close, expected=body[n:])
            if i - 1 in marker_at:
                ex.not_run = marker_at[i - 1]
                used_markers.add(i - 1)
            parse_command(ex, errors)
            examples.append(ex)
        i = close + 1
    for k in sorted(set(marker_at) - used_markers):
        errors.append(f"{name}:{k + 1}: a 'not run' marker that is not on the line before a "
                      "`$ shardplan` block")
    return examples


def mask(line):
    for _, pattern in MASKS:
        line = pattern.sub(lambda m: m.group(1) + "#" + (m.group(3) if m.re.groups >= 3 else ""),
                           line)
    return line


def prepare_scratch(directory):
    for source, target in FIXTURES:
        src = ROOT / source
        for entry in sorted(src.iterdir()):
            if entry.is_dir() or target != ".":
                dst = directory / target / entry.name
                if entry.is_dir():
                    shutil.copytree(entry, dst)
                else:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(entry, dst)


@dataclass
class Result:
    lines: list            # what the command printed, as the block would show it
    stderr: str = ""       # stderr not shown by the block (must be empty)
    signal: int = None     # the signal that killed the command
    seconds: float = 0.0


def run(ex, binary, scratch_root):
    directory = Path(tempfile.mkdtemp(dir=scratch_root))
    try:
        prepare_scratch(directory)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDPLAN_")}
        start = time.monotonic()
        proc = subprocess.run([binary] + ex.argv[1:], cwd=directory, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT if ex.merge_stderr else subprocess.PIPE,
                              timeout=TIMEOUT_S)
        seconds = time.monotonic() - start
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    text = proc.stdout.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    result = Result(lines=lines, seconds=seconds)
    if proc.stderr:
        result.stderr = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode < 0:
        result.signal = -proc.returncode
    elif proc.returncode != 0:
        result.lines.append(f"[exit {proc.returncode}]")
    return result


def shifted_diff(ex, actual):
    """A unified diff of the masked outputs, hunks numbered by the doc's lines."""
    offset = ex.out_begin
    diff = difflib.unified_diff([mask(l) for l in ex.expected], [mask(l) for l in actual],
                                fromfile=f"{ex.where()} (the doc)",
                                tofile="what the binary prints", lineterm="")

    def renumber(m):
        return f"@@ -{int(m.group(1)) + offset}{m.group(2)} +{int(m.group(3)) + offset}{m.group(4)} @@"

    return [re.sub(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@", renumber, d) for d in diff]


def problems(ex, result):
    """What makes the result differ from the block: a list of message lines, empty if none."""
    out = []
    if result.signal is not None:
        out.append(f"{ex.where()}: the command was killed by signal {result.signal}")
    if result.stderr:
        out.append(f"{ex.where()}: the command printed on stderr, which the block does not show "
                   "(end the command with 2>&1 to show it):")
        out.extend("    " + l for l in result.stderr.rstrip("\n").split("\n"))
    if [mask(l) for l in ex.expected] != [mask(l) for l in result.lines]:
        masked = ", ".join(name for name, _ in MASKS)
        out.append(f"{ex.where()}: the output differs from the doc ({masked} shown as #):")
        out.extend(shifted_diff(ex, result.lines))
    return out


def updated_block(ex, result):
    """The new output lines: the binary's, keeping the doc's line where only a masked figure
    differs."""
    old = {mask(l): l for l in ex.expected}
    return [old.get(mask(l), l) for l in result.lines]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", metavar="BINARY")
    mode.add_argument("--update", metavar="BINARY")
    parser.add_argument("docs", nargs="*", type=Path,
                        help="markdown files (default: " + ", ".join(DOCS) + ")")
    args = parser.parse_args()
    binary = Path(args.check or args.update).resolve()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        sys.exit(f"doc_examples: {binary}: not an executable file")
    docs = args.docs or [ROOT / d for d in DOCS]
    errors = []
    examples = []
    for doc in docs:
        if not doc.is_file():
            errors.append(f"{doc}: no such file")
            continue
        examples += find_examples(doc, errors)
    if errors:
        print("\n".join(f"doc_examples: {e}" for e in errors), file=sys.stderr)
        return 1

    failed, not_run, new_blocks = 0, 0, []
    with tempfile.TemporaryDirectory(prefix="doc_examples.") as scratch_root:
        for ex in examples:
            shown = shlex.join(ex.argv) + (" 2>&1" if ex.merge_stderr else "")
            if ex.not_run:
                not_run += 1
                print(f"not run  {ex.where()}  {shown}  ({ex.not_run})")
                continue
            result = run(ex, binary, scratch_root)
            issues = problems(ex, result)
            status = "ok" if not issues else ("differs" if args.update else "FAILED")
            print(f"{status:8} {ex.where()}  {shown}  ({result.seconds:.1f} s)", flush=True)
            if not issues:
                continue
            if args.update and result.signal is None and not result.stderr:
                new_blocks.append((ex, updated_block(ex, result)))
            else:
                failed += 1
                print("\n".join(issues), flush=True)
    if args.update:
        write_updates(new_blocks)
    print(f"doc_examples: {len(examples)} examples: {len(examples) - not_run - failed} "
          f"{'passed' if args.check else 'run'}, {failed} failed, {not_run} not run (marked)")
    return 1 if failed else 0


def write_updates(new_blocks):
    by_doc = {}
    for ex, lines in new_blocks:
        by_doc.setdefault(ex.doc, []).append((ex, lines))
    for doc, items in by_doc.items():
        text = doc.read_text(encoding="utf-8").split("\n")
        for ex, lines in sorted(items, key=lambda item: -item[0].out_begin):
            text[ex.out_begin:ex.out_end] = [(ex.indent + l) if l else l for l in lines]
            print(f"updated  {ex.where()}")
        doc.write_text("\n".join(text), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Moves src/ into the folders of docs/design.md's layers (issue 40), on whatever tree it runs.

    python3 scripts/relayout.py [--dry-run] [--allow-unmapped]

Each file of MOVES (fnmatch patterns on a file's path, first match wins) is moved with `git mv`;
then every quoted #include in the repository that names a moved file, or sits in a moved file and
was written relative to it, is rewritten as a path relative to the including file; then the paths
of moved files written out elsewhere (CMake lists, docs, comments: `src/program/graph.cpp`) are
replaced by the new ones, and the library's source glob becomes one recursive glob. Running it
again changes nothing. A file left directly in src/ or src/program/ that no pattern names stops
the run (add it to MOVES), unless --allow-unmapped."""
import argparse
import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (pattern on the old path, new folder). Only files directly in src/ and src/program/ (and the
# whole src/program/primitives/ folder) move; the other folders of src/ keep their place.
MOVES = [
    # src/program: the program representation every pass and op shares.
    ("src/program/fields.hpp", "src/program/ir"),
    ("src/program/factors.hpp", "src/program/ir"),
    ("src/program/graph.*", "src/program/ir"),
    ("src/program/primitive.hpp", "src/program/ir"),
    ("src/program/primitives.hpp", "src/program/ir"),
    ("src/program/primitive_tests.hpp", "src/program/ir"),
    ("src/program/array_access.hpp", "src/program/ir"),
    # The compiler's passes: a traced graph in, a partitioned, fused, costed program out.
    ("src/program/propagate*", "src/program/compiler"),
    ("src/program/partition*", "src/program/compiler"),
    ("src/program/fuse.*", "src/program/compiler"),
    ("src/program/memory*", "src/program/compiler"),
    ("src/program/reshard_cost*", "src/program/compiler"),
    ("src/program/compile.*", "src/program/compiler"),
    ("src/program/spmd_check*", "src/program/compiler"),
    ("src/program/resolve_rules*", "src/program/compiler"),
    # What a compiled program's runs record.
    ("src/program/program_profile*", "src/program/analysis"),
    ("src/program/run_record*", "src/program/analysis"),
    # The tracing front end: tracing, transformations, sjit, running a compiled program.
    ("src/program/trace.*", "src/program/frontend"),
    ("src/program/autodiff*", "src/program/frontend"),
    ("src/program/sjit*", "src/program/frontend"),
    ("src/program/apply*", "src/program/frontend"),
    ("src/program/shard_and_gather*", "src/program/frontend"),
    ("src/program/remat*", "src/program/frontend"),
    ("src/program/program.cpp", "src/program/frontend"),
    # The op library: the primitives' definitions and kernels, and the ops built from them.
    ("src/program/primitives/*", "src/program/ops/primitives"),
    ("src/program/kernel_util.hpp", "src/program/ops/primitives"),
    ("src/program/ops.cpp", "src/program/ops"),
    ("src/program/optim*", "src/program/ops"),
    ("src/program/fused_loss*", "src/program/ops"),
    ("src/program/ring_attention*", "src/program/ops"),
    ("src/program/float8_linear*", "src/program/ops"),
    ("src/program/shard_map*", "src/program/ops"),
    # src/: the value types of the public API.
    ("src/dtype.cpp", "src/core"),
    ("src/shape.cpp", "src/core"),
    ("src/tree.cpp", "src/core"),
    ("src/mesh.cpp", "src/core"),
    ("src/partition_spec.cpp", "src/core"),
    ("src/named_sharding.cpp", "src/core"),
    ("src/format_bytes.cpp", "src/core"),
    ("src/error_context.hpp", "src/core"),
    # File formats: reading and writing files.
    ("src/input_file.*", "src/formats"),
    ("src/output_file.*", "src/formats"),
    ("src/json_impl.*", "src/formats"),
    ("src/yaml_input.*", "src/formats"),
    ("src/safetensors.*", "src/formats"),
    ("src/model_loader.*", "src/formats"),
    ("src/rule_file.*", "src/formats"),
    # The planner: rules applied to a tree of tensor specs, and its report.
    ("src/mesh_sharding_helper.*", "src/planner"),
    ("src/mesh_context.*", "src/planner"),
    ("src/sharding_rule.*", "src/planner"),
    ("src/plan_report.*", "src/planner"),
    # HTML pages and charts.
    ("src/html_page.*", "src/report"),
    ("src/bytes_chart.*", "src/report"),
    ("src/plan_html.*", "src/report"),
]

# Where a quoted include that is not beside its file is looked for (the include directories the
# CMake files give), in order.
SEARCH = ["include", "rules/include", "rules/src", "src/runtime", "src/program", "src/train",
          "src/profiler", "src", "tests", "tests/support", "bench", "examples"]
CODE = (".cpp", ".hpp", ".h", ".cc")
TEXT = CODE + (".txt", ".cmake", ".md", ".py", ".sh", ".in", ".json", ".yaml", ".yml")
INCLUDE = re.compile(r'^(\s*#\s*include\s+")([^"]+)(".*)$')
OLD_GLOB = re.compile(r"file\(GLOB SHARDPLAN_SOURCES CONFIGURE_DEPENDS[^)]*\)", re.S)
NEW_GLOB = ("file(GLOB_RECURSE SHARDPLAN_SOURCES CONFIGURE_DEPENDS src/*.cpp rules/src/*.cpp)\n"
            "# The command's sources and the GEMM copies (below) are built on their own.\n"
            "list(FILTER SHARDPLAN_SOURCES EXCLUDE REGEX \"/src/(cli|runtime/gemm)/\")")


def git_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def plan_moves(files):
    """{old path: new path} of the files still at an old place; the unmapped files."""
    moves, unmapped = {}, []
    for path in files:
        parent = os.path.dirname(path)
        movable = parent in ("src", "src/program") or path.startswith("src/program/primitives/")
        if not movable:
            continue
        for pattern, folder in MOVES:
            if fnmatch.fnmatch(path, pattern):
                if pattern.endswith("/*"):  # a whole folder: keep what is below it
                    rest = os.path.relpath(path, os.path.dirname(pattern))
                else:
                    rest = os.path.basename(path)
                moves[path] = f"{folder}/{rest}"
                break
        else:
            unmapped.append(path)
    return moves, unmapped


def resolve(including, name, exists):
    """The repository path an include names (beside the file first, then SEARCH), or None."""
    candidate = os.path.normpath(os.path.join(os.path.dirname(including), name))
    if candidate in exists:
        return candidate, True
    for folder in SEARCH:
        candidate = os.path.normpath(os.path.join(folder, name))
        if candidate in exists:
            return candidate, False
    return None, False


def rewrite_includes(files, moves, dry_run):
    exists = set(files)
    changed = 0
    for path in files:
        if not path.endswith(CODE):
            continue
        new_path = moves.get(path, path)
        text = (ROOT / path).read_text()
        lines = text.split("\n")
        for i, line in enumerate(lines):
            m = INCLUDE.match(line)
            if not m:
                continue
            target, beside = resolve(path, m.group(2), exists)
            if target is None or (target not in moves and not (beside and path in moves)):
                continue
            new_target = moves.get(target, target)
            rel = os.path.relpath(new_target, os.path.dirname(new_path))
            if rel != m.group(2):
                lines[i] = m.group(1) + rel + m.group(3)
                changed += 1
        new_text = "\n".join(lines)
        if new_text != text and not dry_run:
            (ROOT / path).write_text(new_text)
    return changed


def rewrite_paths(files, moves, dry_run):
    """Paths of moved files written in full ('src/program/graph.cpp') get their new value."""
    if not moves:
        return 0
    names = sorted(moves, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(n) for n in names) +
                         r")(?![\w/-]|\.\w)")
    changed = 0
    for path in files:
        if not path.endswith(TEXT) or path == "scripts/relayout.py":
            continue
        try:
            text = (ROOT / path).read_text()
        except UnicodeDecodeError:  # a binary test input named like text
            continue
        new_text, n = pattern.subn(lambda m: moves[m.group(1)], text)
        if path == "CMakeLists.txt":
            new_text = OLD_GLOB.sub(NEW_GLOB, new_text)
        if new_text != text:
            changed += max(n, 1)
            if not dry_run:
                (ROOT / path).write_text(new_text)
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    parser.add_argument("--allow-unmapped", action="store_true",
                        help="leave files no pattern names where they are")
    args = parser.parse_args()
    files = git_files()
    moves, unmapped = plan_moves(files)
    if unmapped and not args.allow_unmapped:
        sys.exit("relayout: no folder given for " + ", ".join(unmapped) +
                 " (add a pattern to MOVES in scripts/relayout.py)")
    # Includes and paths first, while every file is still where the includes say.
    n_includes = rewrite_includes(files, moves, args.dry_run)
    n_paths = rewrite_paths(files, moves, args.dry_run)
    for old, new in sorted(moves.items()):
        print(f"{old} -> {new}")
        if not args.dry_run:
            (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", old, new], cwd=ROOT, check=True)
    print(f"relayout: {len(moves)} files moved, {n_includes} includes and {n_paths} paths "
          f"rewritten" + (" (dry run)" if args.dry_run else ""))


if __name__ == "__main__":
    main()

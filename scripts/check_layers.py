#!/usr/bin/env python3
"""Checks the layering of docs/design.md ("Layers"): no #include from a lower layer to a higher one.

    check_layers.py [ROOT]      check the tree at ROOT (default: this repository)
    check_layers.py --selftest  check that the check finds an upward include and passes a tree without

The layers are the numbered list of the section "## Layers" of ROOT/docs/design.md, lowest first:
`N. **name**: `folder`, `folder` - what it holds`. Every file under src/ must sit in a listed folder
(the longest listed folder containing it decides its layer). Every quoted #include of a file in a
layer is resolved as the compiler does (beside the file, then include/ and rules/include/); one
that names a file of a higher layer is printed as `file:line: ...` with both layers. Includes
within a layer, or of files outside every layer (third-party headers), pass. Exits 1 on any
offence."""
import os
import re
import sys
import tempfile
from pathlib import Path

CODE = (".cpp", ".hpp", ".h", ".cc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LAYER = re.compile(r"^\d+\.\s+\*\*([^*]+)\*\*:\s*(.*)$")
SEARCH = ["include", "rules/include"]


def read_layers(root):
    """[(name, [folders])] lowest first, from docs/design.md's "## Layers" section."""
    text = (root / "docs" / "design.md").read_text()
    layers, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Layers" or line.startswith("## Layers ")
            continue
        m = LAYER.match(line) if inside else None
        if m:
            folders_text = re.split(r"\s[-\u2014]\s", m.group(2), maxsplit=1)[0]
            folders = [f.strip("/") for f in re.findall(r"`([^`]+)`", folders_text)]
            layers.append((m.group(1), folders))
    if not layers:
        sys.exit(f"check_layers: no numbered list of layers under '## Layers' in "
                 f"{root / 'docs' / 'design.md'}")
    return layers


def layer_of(path, folders):
    """(index, name) of the layer whose folder holds path (the longest such folder), or None."""
    best = None
    for folder, index, name in folders:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best[0]):
                best = (folder, index, name)
    return None if best is None else best[1:]


def check(root):
    """The offences (strings) of the tree at root."""
    layers = read_layers(root)
    folders = [(f, i, name) for i, (name, fs) in enumerate(layers) for f in fs]
    offences = []
    files = set()
    for top in sorted({f for f, _, _ in folders} | {"src"}):
        for dirpath, _, names in os.walk(root / top):
            for n in names:
                if n.endswith(CODE):
                    files.add(os.path.relpath(os.path.join(dirpath, n), root))
    for path in sorted(files):
        here = layer_of(path, folders)
        if here is None:
            offences.append(f"{path}: in no layer of docs/design.md's '## Layers' (add its "
                            f"folder to a layer)")
            continue
        for number, line in enumerate((root / path).read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
            if not (root / target).is_file():
                target = next((os.path.join(d, m.group(1)) for d in SEARCH
                               if (root / d / m.group(1)).is_file()), None)
            there = None if target is None else layer_of(target, folders)
            if there is not None and there[0] > here[0]:
                offences.append(f"{path}:{number}: includes {target}: layer '{here[1]}' "
                                f"({here[0] + 1}) must not include layer '{there[1]}' "
                                f"({there[0] + 1}), which is above it")
    return offences


def selftest():
    design = ("# Design\n\n## Layers\n1. **base**: `src/base` - below\n"
              "2. **top**: `src/top`, `src/also` - above\n\n## Other\n3. **x**: `src/x`\n")
    cases = [  # (files, expected offences as substrings, or [] for none)
        ({"src/top/a.cpp": '#include "../base/b.hpp"\n', "src/base/b.hpp": "",
          "src/also/c.cpp": '#include "../top/a.hpp"\n', "src/top/a.hpp": ""}, []),
        ({"src/base/b.cpp": '// x\n#include "../top/a.hpp"\n', "src/top/a.hpp": ""},
         ["src/base/b.cpp:2: includes src/top/a.hpp: layer 'base' (1)", "layer 'top' (2)"]),
        ({"src/x/y.cpp": ""}, ["src/x/y.cpp: in no layer"]),
    ]
    for files, expected in cases:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "docs").mkdir()
            (root / "docs" / "design.md").write_text(design)
            for name, text in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
            got = check(root)
            if not expected and got:
                sys.exit(f"check_layers selftest: a tree without upward includes gave {got}")
            if expected and not (len(got) == 1 and all(e in got[0] for e in expected)):
                sys.exit(f"check_layers selftest: expected one offence with {expected}, got {got}")
    print("check_layers selftest: passed")


def main():
    if sys.argv[1:] == ["--selftest"]:
        selftest()
        return
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    offences = check(root)
    for o in offences:
        print(o)
    layers = read_layers(root)
    print(f"check_layers: {len(offences)} offences over {len(layers)} layers")
    sys.exit(1 if offences else 0)


if __name__ == "__main__":
    main()

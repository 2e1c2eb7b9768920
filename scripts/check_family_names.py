#!/usr/bin/env python3
"""No model family is named in src/ outside its own declaration (docs/training.md, "Adding a model
family"). The families' names, model types and default presets are read from their declarations
(src/train/families/*.cpp); every other .cpp/.hpp under src/ is read with its comments removed and
fails on an identifier that contains one of those names (kGpt2, t5_loss, is_llama) or a string
literal that is one of them, or a preset of theirs (\"qwen2\", \"llama_fsdp\"). Prose in messages
(\"T5's step computes ...\") is allowed. Usage: check_family_names.py SRC_DIR"""
import pathlib
import re
import sys

FAMILIES = "train/families"
REGISTRY = "train/model_family.cpp"
# Not the training planner's families: the built-in LLaMA-2 7B weight list of `shardplan example`
# and `shardplan plan`'s default rules for it (src/cli/example_model.*).
EXAMPLE_MODEL = {"cli/example_model.hpp", "cli/example_model.cpp", "cli/example_cmd.cpp"}
ALLOWED = {("cli/main.cpp", "llama_fsdp_tp"), ("cli/main.cpp", "llama2_7b_tensors")}


def declared_names(src):
    names = set()
    for f in sorted((src / FAMILIES).glob("*.cpp")):
        text = f.read_text()
        names.update(re.findall(r'\.(?:name|default_preset|preset_without_tp)\s*=\s*"([^"]+)"', text))
        for body in re.findall(r"std::array<std::string_view,\s*\d+>\s*\w+\s*\{([^}]*)\}", text):
            names.update(re.findall(r'"([^"]+)"', body))
    return names


def strip_comments(text):
    """The code with comments blanked (string and character literals kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            d = text[i + 2:text.find("(", i)]
            j = text.find(")" + d + '"', i)
            out.append(text[i:j + len(d) + 2])
            i = j + len(d) + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    src = pathlib.Path(sys.argv[1])
    names = declared_names(src)
    if not names:
        print(f"no family declarations found under {src / FAMILIES}")
        return 1
    words = sorted({re.sub(r"[^a-z0-9]", "", n.split("_")[0]) for n in names}, key=len, reverse=True)
    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    string = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
    bad = []
    for f in sorted(list(src.rglob("*.cpp")) + list(src.rglob("*.hpp"))):
        rel = f.relative_to(src).as_posix()
        if rel.startswith(FAMILIES + "/") or rel == REGISTRY or rel in EXAMPLE_MODEL:
            continue
        for no, line in enumerate(strip_comments(f.read_text()).split("\n"), 1):
            literals = [m.group(1) for m in string.finditer(line)]
            code = string.sub('""', line)
            for m in ident.finditer(code):
                low = m.group(0).lower()
                parts = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", m.group(0)).lower().split("_")
                hit = next((w for w in words for p in parts if re.fullmatch(w + r"\d*", p)), None)
                if hit and (rel, m.group(0)) not in ALLOWED:
                    bad.append(f"{rel}:{no}: identifier '{m.group(0)}' names the family '{hit}'")
            for lit in literals:
                if (rel, lit) in ALLOWED:
                    continue
                if lit.lower() in names or any(lit.lower().startswith(n + "_") for n in names):
                    bad.append(f"{rel}:{no}: the string \"{lit}\" names a family's declaration")
    for b in bad:
        print(b)
    print(f"check_family_names: {len(bad)} name(s) of {len(names)} declared outside "
          f"{FAMILIES}/ and {REGISTRY}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

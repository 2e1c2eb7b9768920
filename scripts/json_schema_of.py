#!/usr/bin/env python3
"""Writes a JSON Schema (the subset tests/json_schema.hpp checks: type, properties, required,
items) of the JSON documents given, as the shape they have now: every key present is required,
arrays' items merged (a key is required when every item has it). Used once to pin a command's
--json output (docs/schemas/); after that the schema is edited by hand, with additions only.

usage: scripts/json_schema_of.py TITLE FILE... > docs/schemas/NAME.schema.json
"""
import json
import sys


def kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def merge(schemas):
    types = []
    for s in schemas:
        t = s["type"]
        for x in t if isinstance(t, list) else [t]:
            if x not in types:
                types.append(x)
    out = {"type": types[0] if len(types) == 1 else types}
    objects = [s for s in schemas if "properties" in s]
    if objects:
        keys = []
        for s in objects:
            keys += [k for k in s["properties"] if k not in keys]
        out["properties"] = {
            k: merge([s["properties"][k] for s in objects if k in s["properties"]]) for k in keys}
        out["required"] = [k for k in keys if all(k in s.get("required", []) for s in objects)]
    arrays = [s["items"] for s in schemas if "items" in s]
    if arrays:
        out["items"] = merge(arrays)
    return out


def schema_of(v):
    s = {"type": kind(v)}
    if isinstance(v, dict):
        s["properties"] = {k: schema_of(x) for k, x in v.items()}
        s["required"] = list(v.keys())
    elif isinstance(v, list) and v:
        s["items"] = merge([schema_of(x) for x in v])
    return s


def main():
    title, files = sys.argv[1], sys.argv[2:]
    docs = [json.load(open(f)) for f in files]
    s = merge([schema_of(d) for d in docs])
    s = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **s}
    json.dump(s, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

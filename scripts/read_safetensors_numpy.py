#!/usr/bin/env python3
"""Reads a checkpoint with numpy only, from the public safetensors format (an 8-byte
little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the
data), independently of shardplan. Usage: read_safetensors_numpy.py DIR_OR_FILE OUT.bin

Writes, for every tensor in name order, a line `name dtype shape` to stdout and its values as
float64 (little-endian) to OUT.bin, so that a test can compare them with its own. With a
directory it follows model.safetensors.index.json's weight map, checking that every mapped
tensor is in the file it is mapped to."""
import json
import os
import sys

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        buf = data[begin:end]
        if entry["dtype"] == "BF16":
            values = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view("<f4")
        else:
            values = np.frombuffer(buf, DTYPES[entry["dtype"]])
        shape = tuple(entry["shape"])
        out[name] = (entry["dtype"], shape, values.reshape(shape).astype("<f8"))
    return out


def main():
    path, out_path = sys.argv[1], sys.argv[2]
    tensors = {}
    index = os.path.join(path, "model.safetensors.index.json") if os.path.isdir(path) else None
    if index and os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        cache = {}
        for name, file in weight_map.items():
            if file not in cache:
                cache[file] = read_file(os.path.join(path, file))
            if name not in cache[file]:
                sys.exit(f"{name} is mapped to {file}, which does not hold it")
            tensors[name] = cache[file][name]
    else:
        tensors = read_file(path)
    with open(out_path, "wb") as out:
        for name in sorted(tensors):
            dtype, shape, values = tensors[name]
            print(name, dtype, ",".join(str(d) for d in shape))
            out.write(values.tobytes())


if __name__ == "__main__":
    main()

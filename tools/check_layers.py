#!/usr/bin/env python3
"""Checks that every source file includes only headers of its own layer and of
the layers below it (docs/layout.md). Exit 0 when the tree follows the layers;
1, with one line per wrong-way include, when it does not.

  check_layers.py [--root DIR]   check the tree at DIR (default: this repo)
  check_layers.py --self-test    check that a planted wrong-way include fails

A quoted include's layer is its first path component ("shard/chunk.h" is in
shard/); "strata/v1/...", "strata/internal/..." and "grpc/..." are the
generated protos; any other
"strata/X.h" is the public header core/include/strata/X.h or
client/include/strata/X.h. Angle-bracket includes are third-party.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

_BELOW = {
    "core": [],
    "proto": [],
    "kernels": ["core"],
    "storage": ["core"],
    "rpc": ["core", "proto"],
    "shard": ["kernels", "storage", "rpc", "core", "proto"],
    # The coordinator keeps its metadata in RocksDB; it uses no tier.
    "coordinator": ["rpc", "core", "proto", "storage/metadata_store.h"],
    "client": ["kernels", "rpc", "core", "proto"],
    "python": ["client", "core"],
    "examples": ["client", "kernels", "core"],
    "testing": ["shard", "coordinator", "client", "kernels", "storage", "rpc", "core", "proto"],
    "tools": ["testing", "shard", "coordinator", "client", "kernels", "storage", "rpc", "core",
              "proto"],
    "tests": ["testing", "shard", "coordinator", "client", "kernels", "storage", "rpc", "core",
              "proto"],
}
_SOURCE = re.compile(r"\.(h|cc|cu)$")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _layer_of_header(root, header):
    first = header.split("/", 1)[0]
    if header.startswith(("strata/v1/", "strata/internal/")) or first == "grpc":
        return "proto"
    if first == "strata":
        for layer in ("core", "client"):
            if os.path.exists(os.path.join(root, layer, "include", header)):
                return layer
        return None
    return first if first in _BELOW else None


def _allowed(layer, header, header_layer):
    if header_layer == layer:
        return True
    for entry in _BELOW[layer]:
        if entry == header_layer or entry == header:
            return True
    return False


def check(root):
    """Returns one message per wrong-way include under `root`."""
    problems = []
    for layer in sorted(_BELOW):
        top = os.path.join(root, layer)
        for directory, _, names in os.walk(top):
            for name in sorted(names):
                if not _SOURCE.search(name):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for header in _INCLUDE.findall(text):
                    header_layer = _layer_of_header(root, header)
                    if header_layer is None or _allowed(layer, header, header_layer):
                        continue
                    problems.append(f"{os.path.relpath(path, root)}: includes \"{header}\" "
                                    f"({header_layer}/), above or beside {layer}/")
    return problems


def self_test(root):
    """A copy of the tree with core/ including shard/ must fail; the copy
    as it is must pass."""
    with tempfile.TemporaryDirectory() as scratch:
        for layer in _BELOW:
            if os.path.isdir(os.path.join(root, layer)):
                shutil.copytree(os.path.join(root, layer), os.path.join(scratch, layer))
        if check(scratch):
            print("self-test: the unmodified copy fails", file=sys.stderr)
            return 1
        with open(os.path.join(scratch, "core", "wrong_way.h"), "w") as f:
            f.write('#include "shard/chunk.h"\n')
        problems = check(scratch)
        if len(problems) != 1 or "core/wrong_way.h" not in problems[0]:
            print(f"self-test: a planted wrong-way include gave {problems}", file=sys.stderr)
            return 1
    print("self-test: a wrong-way include in core/ is reported")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.root)
    problems = check(args.root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} wrong-way include(s); see docs/layout.md")
        return 1
    print("every include follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Count a crate's public surface from rustdoc JSON: public modules and public types.

A measurement, not a CI gate. Build the JSON with the installed nightly, then run this on it:

    K8S_OPENAPI_ENABLED_VERSION=1.37 cargo +nightly rustdoc -p kube-shard --lib \
        -- -Z unstable-options --output-format json
    python3 .ci/public-surface.py target/doc/kube_shard.json [--list]

Walks every module reachable from the crate root through public items and re-exports. A module (the root
included) and a type (struct, enum, union, trait, type alias) each count once, however many paths re-export
it; `--list` shows each at its first path. Items of other crates re-exported here are not counted.
"""
import json
import sys

TYPE_KINDS = ("struct", "enum", "union", "trait", "type_alias")


def kind_of(item):
    inner = item.get("inner", {})
    if isinstance(inner, dict) and inner:
        return next(iter(inner))
    return str(inner)


def walk(doc):
    index = doc["index"]
    root = str(doc["root"])
    modules, types, seen = {}, {}, set()

    def visit_module(mid, path):
        if (mid, path) in seen:
            return
        seen.add((mid, path))
        modules.setdefault(mid, path)
        for cid in index[mid]["inner"]["module"]["items"]:
            visit(str(cid), path, None)

    def visit(iid, path, rename):
        item = index.get(iid)
        if item is None or item.get("visibility") != "public":
            return
        kind = kind_of(item)
        if kind == "use":
            use = item["inner"]["use"]
            target = use.get("id")
            if target is None or str(target) not in index:
                return
            target = str(target)
            if use.get("is_glob"):
                tgt = index[target]
                if kind_of(tgt) == "module":
                    for cid in tgt["inner"]["module"]["items"]:
                        visit(str(cid), path, None)
                return
            visit_target(target, path, use["name"])
            return
        visit_target(iid, path, rename)

    def visit_target(iid, path, rename):
        item = index[iid]
        kind = kind_of(item)
        name = rename or item.get("name")
        if kind == "module":
            visit_module(iid, f"{path}::{name}")
        elif kind in TYPE_KINDS:
            types.setdefault(iid, f"{path}::{name}")

    visit_module(root, index[root]["name"])
    return list(modules.values()), sorted(types.values())


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    with open(args[0]) as f:
        doc = json.load(f)
    modules, types = walk(doc)
    if "--list" in sys.argv:
        print("modules:")
        for m in modules:
            print("  " + m)
        print("types:")
        for t in types:
            print("  " + t)
    print(f"public modules: {len(modules)} (the root included), public types: {len(types)}")


if __name__ == "__main__":
    main()

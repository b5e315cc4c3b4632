#!/usr/bin/env python3
"""Generate testserver's protobuf message table (messages.txt.gz) from the k8s-pb crate's sources and the
captured OpenAPI v2 document.

Usage: generate.py K8S_PB_SRC [OUT]
  K8S_PB_SRC  the `src` folder of the k8s-pb crate (e.g. ~/.cargo/registry/src/*/k8s-pb-0.9.0/src)
  OUT         default: messages.txt.gz beside this script

Each `#[derive(::prost::Message)]` struct becomes one line:
  NAME <TAB> FIELD <TAB> FIELD ...
where NAME is the OpenAPI definition name (`io.k8s.api.core.v1.Namespace`) and each FIELD is
`TAG[!]:JSONNAME:KIND[:TYPE]` (`!`: a zero value is kept — the field is required, or a Go pointer: see
POINTERS), KIND one of s (string), i (int32), l (int64), b (bool), y (bytes), d (double),
m (message TYPE) or I (a message TYPE whose fields are inlined in this one: a Go embedded struct), with a
prefix r (repeated) or M (map from string to the kind). JSON names come from the
OpenAPI definition's properties (matched without case and underscores); a message without a definition uses
lowerCamelCase. A column `*array` marks a message that stands for a Go slice type (`ExtraValue []string`): its
JSON is the list of its one repeated field. Lines starting `=` map a group/version/kind to its message (`=apps/v1/Deployment NAME`), from
the definitions' x-kubernetes-group-version-kind. Lines starting `#` are the report: the source version and
what the captured server (1.36.2) has that the messages do not.

The output is deterministic (gzip without a timestamp), so regenerating from the same inputs changes nothing.
"""
import gzip
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KIND = {"string": "s", "int32": "i", "int64": "l", "bool": "b", "double": "d", "message": "m"}


def module_name(rel):
    """`api/core/v1/mod.rs` -> `io.k8s.api.core.v1`"""
    parts = rel.split(os.sep)[:-1]
    if parts and parts[0] in ("apiextensions_apiserver", "kube_aggregator"):
        parts[0] = parts[0].replace("_", "-")
    return ".".join(["io", "k8s"] + parts)


def resolve(mod, rust_type):
    """The message a Rust type path names, from module `mod`."""
    t = rust_type.replace(" ", "").replace(",>", ">")
    t = re.sub(r"^::core::option::Option<(.*)>$", r"\1", t)
    t = re.sub(r"^::prost::alloc::vec::Vec<(.*)>$", r"\1", t)
    t = re.sub(r"^::prost::alloc::boxed::Box<(.*)>$", r"\1", t)
    segs = t.split("::")
    base = mod.split(".")
    ups = 0
    while segs and segs[0] == "super":
        ups += 1
        segs.pop(0)
    if ups:
        base = base[: len(base) - ups]
    else:
        return ".".join(base + segs)
    segs = [s.replace("_", "-") if i == 0 and s in ("apiextensions_apiserver", "kube_aggregator") else s
            for i, s in enumerate(segs)]
    return ".".join(base + segs)


def parse(src):
    messages = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            if rel.count(os.sep) < 2:
                continue
            mod = module_name(rel)
            text = open(path, encoding="utf-8").read()
            for m in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
                name, body = m.group(1), m.group(2)
                fields = []
                for attr, fname, rtype in fields_of(body):
                    tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
                    if attr.startswith("btree_map") or attr.startswith("map"):
                        k, v = re.search(r'map = "(\w+), (\w+)"', attr).groups()
                        if k != "string":
                            raise SystemExit(f"{mod}.{name}.{fname}: map key {k}")
                        if v == "message":
                            inner = re.search(r"BTreeMap<[^,]+,(.*?),?>$", rtype.replace(" ", "")).group(1)
                            kind = "Mm:" + resolve(mod, inner)
                        else:
                            kind = "M" + {"string": "s", "bytes": "y"}[v]
                    else:
                        first = attr.split(",")[0].strip()
                        rep = "r" if "repeated" in attr else ""
                        if first.startswith("bytes"):
                            kind = rep + "y"
                        elif first == "message":
                            kind = rep + "m:" + resolve(mod, rtype.replace("\n", ""))
                        else:
                            kind = rep + KIND[first]
                    fields.append((tag, fname, kind))
                if fields or "::prost::Message" in text[max(0, m.start() - 200):m.start()]:
                    messages[f"{mod}.{name}"] = fields
    return messages


def fields_of(body):
    """(prost attribute, field name, Rust type) of each field of a struct body."""
    for fm in re.finditer(r"#\[prost\(([^\]]*)\)\]\s*pub (?:r#)?(\w+):", body):
        depth, i = 0, fm.end()
        while i < len(body):
            c = body[i]
            if c == "<":
                depth += 1
            elif c == ">":
                depth -= 1
            elif c == "," and depth == 0:
                break
            i += 1
        yield fm.group(1), fm.group(2), " ".join(body[fm.end():i].split())


# Numbers and booleans that are pointers in the Go types (`*int32`, `*bool`): present means set, so a zero
# the sender wrote is kept (`replicas: 0`, `immutable: false`). Go's non-pointer scalars are always on the
# wire and `omitempty` drops their zero. The Go types are not in any input here: this list names the
# pointer fields kubectl's commands and everyday manifests set. (A description's "Defaults to N" is no
# guide: `Probe.timeoutSeconds` says so and is a plain int32.)
POINTERS = {
    "activeDeadlineSeconds", "allocateLoadBalancerNodePorts", "allowPrivilegeEscalation",
    "automountServiceAccountToken", "backoffLimit", "blockOwnerDeletion", "completions", "controller",
    "defaultMode", "deletionGracePeriodSeconds", "enableServiceLinks", "fsGroup", "hostUsers", "immutable",
    "minReplicas", "mode", "optional", "parallelism", "priority", "privileged", "readOnlyRootFilesystem",
    "replicas", "runAsGroup", "runAsNonRoot", "runAsUser", "setHostnameAsFQDN", "shareProcessNamespace",
    "startingDeadlineSeconds", "suspend", "terminationGracePeriodSeconds", "ttlSecondsAfterFinished",
    "revisionHistoryLimit", "progressDeadlineSeconds", "backoffLimitPerIndex", "maxFailedIndexes",
    "successfulJobsHistoryLimit", "failedJobsHistoryLimit", "tolerationSeconds", "partition",
    "expirationSeconds",
}


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "messages.txt.gz")
    version = os.path.basename(os.path.dirname(os.path.abspath(src)))
    v2 = json.loads(gzip.open(os.path.join(HERE, "..", "openapi", "v2.json.gz")).read())
    defs = v2["definitions"]
    # k8s-pb names messages in Rust case (`HttpGetAction`, `JsonSchemaProps`): use the definitions' names
    canon = {k.lower(): k for k in defs}

    def rename(n):
        return canon.get(n.lower(), n)

    def rename_kind(k):
        return re.sub(r"^([rM]?[mI]):(.*)$", lambda m: m.group(1) + ":" + rename(m.group(2)), k)

    messages = {rename(n): [(t, f, rename_kind(k)) for t, f, k in fs] for n, fs in parse(src).items()}
    lines = [f"# generated by testserver/protobuf/generate.py from {version} and the captured OpenAPI v2 "
             f"({v2.get('info', {}).get('version', '?')})"]
    # every property spelling of the document, for messages without a definition of their own (embedded
    # structs): `scale_io` is `scaleIO`, not `scaleIo`
    spellings = {}
    for d in defs.values():
        for p in d.get("properties", {}):
            spellings.setdefault(p.lower(), {}).setdefault(p, 0)
            spellings[p.lower()][p] += 1
    anywhere = {k: max(v, key=lambda p: (v[p], p)) for k, v in spellings.items()}
    names = {}  # message -> [(tag, json name, kind)]
    for name in sorted(messages):
        props = defs.get(name, {}).get("properties", {})
        by_key = {p.lower().replace("_", ""): p for p in props} if props else anywhere
        names[name] = [(tag, by_key.get(f.replace("_", "").lower()) or camel(f), kind)
                       for tag, f, kind in messages[name]]
    def effective(msg, depth=0):
        """The JSON names a message's object has, embedded structs expanded."""
        out = set()
        props = set(defs.get(msg, {}).get("properties", {}))
        for _, n, kind in names.get(msg, []):
            inner = kind[2:] if kind.startswith("m:") else None
            sub = effective(inner, depth + 1) if inner and depth < 8 else set()
            if props and n not in props and sub and sub <= props:
                out |= sub
            else:
                out.add(n)
        return out

    missing_fields = []
    for name in sorted(messages):
        props = set(defs.get(name, {}).get("properties", {}))
        required = set(defs.get(name, {}).get("required", []))
        cols, seen = [name], set()
        for tag, json_name, kind in names[name]:
            inner = kind[2:] if kind.startswith("m:") else None
            inner_names = effective(inner) if inner else set()
            if props and json_name not in props and inner and inner_names and inner_names <= props:
                # a Go embedded struct: its fields are inlined in the parent's JSON
                kind = "I" + kind[1:]
                seen |= inner_names
            seen.add(json_name)
            keep = json_name in required or (json_name in POINTERS and kind in ("i", "l", "b"))
            cols.append(f"{tag}{'!' if keep else ''}:{json_name}:{kind}")
        if name not in defs and [(n, k[:1]) for _, n, k in names[name]] == [("items", "r")]:
            # a Go slice type (`ExtraValue []string`): its JSON is the list itself
            cols.insert(1, "*array")
        for p in sorted(props - seen - {"apiVersion", "kind"}):
            missing_fields.append(f"{name}.{p}")
        lines.append("\t".join(cols))
    gvk_lines, missing_kinds = [], []
    for dname in sorted(defs):
        for gvk in defs[dname].get("x-kubernetes-group-version-kind", []):
            key = f"{gvk['group']}/{gvk['version']}/{gvk['kind']}"
            if dname.startswith("io.k8s.apiextensions-apiserver."):
                # a CRD's schema is JSON in JSON messages (`JSONSchemaProps`, `JSON`, the `…Or…`
                # unions): not decoded, a CRD in protobuf is refused
                missing_kinds.append(key)
            elif dname in messages:
                gvk_lines.append(f"={key}\t{dname}")
            elif not dname.endswith("List"):
                missing_kinds.append(key)
    lines += sorted(set(gvk_lines))
    lines += [f"# no message for kind {k} (a protobuf body is refused)" for k in sorted(set(missing_kinds))]
    lines += [f"# no field for {f} (a body that sets it cannot be protobuf-encoded by this version)"
              for f in missing_fields]
    data = ("\n".join(lines) + "\n").encode()
    with open(out, "wb") as fh:
        with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, filename="") as gz:
            gz.write(data)
    print(f"{out}: {len(messages)} messages, {len(gvk_lines)} kinds, "
          f"{len(set(missing_kinds))} kinds without a message, {len(missing_fields)} fields without a number")


if __name__ == "__main__":
    main()

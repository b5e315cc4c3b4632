#!/usr/bin/env bash
# Capture the discovery documents of a real kube-apiserver (legacy format) into discovery.json, the input of
# generate.py. Run from the repository root with a kubeconfig for a bare server, for example:
#   KUBECONFIG=$(../shared/realkube/realkube start kinds) testserver/kinds/capture.sh
#   ../shared/realkube/realkube stop kinds
# KUBECTL overrides the kubectl binary (default: realkube's, else kubectl on PATH).
set -euo pipefail
cd "$(dirname "$0")"
kubectl=${KUBECTL:-${REALKUBE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/realkube}/bin/kubectl}
[ -x "$kubectl" ] || kubectl=kubectl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kubectl" version -o json >"$tmp/version.json"
"$kubectl" get --raw /api >"$tmp/api.json"
"$kubectl" get --raw /apis >"$tmp/apis.json"
"$kubectl" get --raw /api/v1 >"$tmp/core-v1.json"
for gv in $(python3 -c 'import json,sys; [print(v["groupVersion"]) for g in json.load(open(sys.argv[1]))["groups"] for v in g["versions"]]' "$tmp/apis.json"); do
  "$kubectl" get --raw "/apis/$gv" >"$tmp/$(echo "$gv" | tr / -).json"
done
python3 - "$tmp" >discovery.json <<'PY'
import json, os, sys
d = sys.argv[1]
load = lambda f: json.load(open(os.path.join(d, f)))
version = load("version.json")["serverVersion"]
apis = load("apis.json")
out = {
    "serverVersion": {k: version[k] for k in ("major", "minor", "gitVersion")},
    "groups": [{"name": g["name"], "versions": [v["version"] for v in g["versions"]],
                "preferredVersion": g["preferredVersion"]["version"]} for g in apis["groups"]],
    "resources": {},
}
lists = [("v1", load("core-v1.json"))]
for g in apis["groups"]:
    for v in g["versions"]:
        lists.append((v["groupVersion"], load(v["groupVersion"].replace("/", "-") + ".json")))
for gv, doc in lists:
    out["resources"][gv] = [
        {k: r[k] for k in ("name", "singularName", "namespaced", "kind", "verbs", "shortNames", "categories", "group", "version") if k in r}
        for r in doc["resources"]
    ]
json.dump(out, sys.stdout, indent=1, sort_keys=True)
print()
PY
echo "captured $(python3 -c 'import json; d=json.load(open("discovery.json")); print(sum(len(v) for v in d["resources"].values()))' ) resources from $("$kubectl" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')" >&2

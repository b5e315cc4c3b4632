#!/usr/bin/env bash
# Capture the OpenAPI documents of a real kube-apiserver: /openapi/v2 into v2.json.gz, and /openapi/v3 (the
# index and every document it lists) into v3.json.gz, a JSON object from each path of the index to its
# document, with the index under "". testserver serves both and derives its strategic-merge and
# server-side-apply schema (merge keys, patch strategies, list types) from v2.json.gz at run time: no
# hand-typed table. Run from the repository root with a kubeconfig for a bare server, for example:
#   KUBECONFIG=$(../shared/realkube/realkube start openapi) testserver/openapi/capture.sh
#   ../shared/realkube/realkube stop openapi
# KUBECTL overrides the kubectl binary (default: realkube's, else kubectl on PATH).
set -euo pipefail
cd "$(dirname "$0")"
kubectl=${KUBECTL:-${REALKUBE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/realkube}/bin/kubectl}
[ -x "$kubectl" ] || kubectl=kubectl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kubectl" get --raw /openapi/v2 >"$tmp/v2.json"
"$kubectl" get --raw /openapi/v3 >"$tmp/index.json"
mkdir "$tmp/v3"
python3 -c 'import json,sys; [print(p) for p in json.load(open(sys.argv[1]))["paths"]]' "$tmp/index.json" |
  while read -r p; do "$kubectl" get --raw "/openapi/v3/$p" >"$tmp/v3/$(echo "$p" | tr / '|')"; done
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
out = {"": json.load(open(os.path.join(d, "index.json")))}
for f in sorted(os.listdir(os.path.join(d, "v3"))):
    out[f.replace("|", "/")] = json.load(open(os.path.join(d, "v3", f)))
json.dump(out, open(os.path.join(d, "v3.json"), "w"), sort_keys=True, separators=(",", ":"))
v2 = json.load(open(os.path.join(d, "v2.json")))
json.dump(v2, open(os.path.join(d, "v2.min.json"), "w"), sort_keys=True, separators=(",", ":"))
PY
gzip -9 -n -c "$tmp/v2.min.json" >v2.json.gz
gzip -9 -n -c "$tmp/v3.json" >v3.json.gz
echo "captured /openapi/v2 ($(stat -c %s v2.json.gz) bytes gzipped) and /openapi/v3 ($(stat -c %s v3.json.gz) bytes) from $("$kubectl" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')" >&2

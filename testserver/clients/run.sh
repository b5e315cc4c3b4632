#!/usr/bin/env bash
# Real clients against `kshard-dev testserver` (HTTPS, its CA in the kubeconfig):
#   - the bundled kubectl (kubectl_compare.py): every command exits 0, and with REAL_KUBECONFIG its output
#     equals the real server's after normalisation, or the difference is a documented one;
#   - with REAL_KUBECONFIG (a real server with the ShardedListAndWatch gate on), the differential test
#     (differential.py): the same request sequences to a second testserver (gate on) and to the real server,
#     answers compared field by field;
#   - the official Python client (python_client.py), installed with pip into a virtual environment.
#
# Environment:
#   KSHARD_DEV_BIN    the kshard-dev binary (default: target/debug/kshard-dev, built if missing)
#   KUBECTL           a kubectl binary; unset: the kubectl part is skipped (and it says so)
#   REAL_KUBECONFIG   a real kube-apiserver to compare kubectl's output with (optional)
#   KSHARD_PY_VENV    where the virtual environment goes (default: target/clients-venv)
# Run from anywhere; stops the testserver it starts on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target="$root/$target" ;; esac
kshard_dev=${KSHARD_DEV_BIN:-$target/debug/kshard-dev}
[ -x "$kshard_dev" ] || cargo build -p kshard-dev
work=$(mktemp -d)
ts_pid=
diff_pid=
cleanup() {
  [ -n "$ts_pid" ] && kill "$ts_pid" 2>/dev/null || true
  [ -n "$diff_pid" ] && kill "$diff_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$kshard_dev" testserver --kubeconfig-out "$work/kubeconfig" >"$work/out" 2>"$work/err" &
ts_pid=$!
for _ in $(seq 100); do
  grep -q '^serving ' "$work/out" 2>/dev/null && break
  sleep 0.1
done
grep -q '^serving https://' "$work/out" || { cat "$work/out" "$work/err"; echo "kshard-dev testserver did not start" >&2; exit 1; }
echo "testserver: $(head -1 "$work/out")"

if [ -z "${KUBECTL:-}" ]; then
  echo "kubectl: skipped (no KUBECTL; .ci/run takes it from ../shared/realkube)"
else
  python3 testserver/clients/kubectl_compare.py "$KUBECTL" "$work/kubeconfig" ${REAL_KUBECONFIG:+"$REAL_KUBECONFIG"}
fi

if [ -z "${REAL_KUBECONFIG:-}" ]; then
  echo "differential test: skipped (no REAL_KUBECONFIG)"
else
  "$kshard_dev" testserver --shard-selector on --kubeconfig-out "$work/kubeconfig-gate" >"$work/out-gate" 2>"$work/err-gate" &
  diff_pid=$!
  for _ in $(seq 100); do
    grep -q '^serving ' "$work/out-gate" 2>/dev/null && break
    sleep 0.1
  done
  grep -q '^serving https://' "$work/out-gate" || { cat "$work/out-gate" "$work/err-gate"; echo "the gate-on testserver did not start" >&2; exit 1; }
  python3 testserver/clients/differential.py "$work/kubeconfig-gate" "$REAL_KUBECONFIG"
fi

venv=${KSHARD_PY_VENV:-$target/clients-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import kubernetes' 2>/dev/null; then
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes; then
    if ! "$venv/bin/pip" index versions kubernetes --disable-pip-version-check >/dev/null 2>&1; then
      echo "python client: skipped (PyPI is unreachable: pip install kubernetes failed)"
      exit 0
    fi
    echo "pip install kubernetes failed although PyPI answers" >&2
    exit 1
  fi
fi
echo "python client: kubernetes $("$venv/bin/python" -c 'import kubernetes; print(kubernetes.__version__)')"
"$venv/bin/python" testserver/clients/python_client.py "$work/kubeconfig"

#!/usr/bin/env bash
# Run the end-to-end suite against a kind cluster made from a config, or against any cluster.
#
#   e2e/run.sh kind-config/sharded.yaml            # create, test, delete
#   e2e/run.sh kind-config/legacy.yaml --keep      # keep the cluster afterwards
#   e2e/run.sh --kubeconfig ~/.kube/config         # an existing cluster (or `kshard-dev testserver`)
#   e2e/run.sh --kubeconfig A --peer-kubeconfig B [--witness-kubeconfig W]
#                                                  # also the cross-cluster HA scenarios (`ha_real_*`)
#
# The HA scenarios need a second cluster (and a third for the witness); without them they are skipped, by
# name. The stopped-etcd scenario needs cluster A's etcd on this machine (it sends it SIGSTOP; its pid in
# etcd.pid beside the kubeconfig); elsewhere it is skipped.
# Needs: kind and a container runtime for the first two forms; nothing but an API server for the last.
# Figures go to E2E_REPORT (JSON lines) when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."

config=""
kubeconfig=""
keep=0
image="${KIND_IMAGE:-kindest/node:v1.36.0}"
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --kubeconfig) kubeconfig="$2"; shift ;;
    --peer-kubeconfig) export KSHARD_E2E_PEER_KUBECONFIG="$2"; shift ;;
    --witness-kubeconfig) export KSHARD_E2E_WITNESS_KUBECONFIG="$2"; shift ;;
    --image) image="$2"; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) config="$1" ;;
  esac
  shift
done

if [ -z "$kubeconfig" ]; then
  [ -n "$config" ] || { echo "usage: e2e/run.sh KIND_CONFIG [--keep] | --kubeconfig PATH" >&2; exit 2; }
  command -v kind >/dev/null || { echo "kind is not installed" >&2; exit 2; }
  name="kshard-e2e-$(basename "$config" .yaml)"
  kind create cluster --name "$name" --config "$config" --image "$image" --wait 120s
  kubeconfig="$(mktemp)"
  kind get kubeconfig --name "$name" > "$kubeconfig"
  if [ "$keep" = 0 ]; then
    trap 'kind delete cluster --name "$name"' EXIT
  else
    echo "keeping cluster $name; KUBECONFIG=$kubeconfig"
  fi
fi

# The multi-cluster scenarios skip themselves, by name, when their clusters are not given.
KUBECONFIG="$kubeconfig" cargo test -p kube-shard-e2e -- --ignored --test-threads=1

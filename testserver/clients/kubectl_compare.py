#!/usr/bin/env python3
"""Run the same kubectl commands against testserver and a real kube-apiserver and compare the outputs.

Usage: kubectl_compare.py KUBECTL TESTSERVER_KUBECONFIG [REAL_KUBECONFIG]

Two parts: manifests sent with `create -f` / `apply -f` (JSON bodies), then an everyday sequence in a
namespace of its own: the imperative creates (`create namespace|configmap|secret generic|deployment|
service clusterip|job|cronjob|serviceaccount|role|rolebinding|clusterrole|clusterrolebinding|
priorityclass|quota`, whose bodies kubectl sends as protobuf, and `run`, sent as JSON), then get, label,
annotate, patch, scale, rollout status, describe, delete and wait on what they created.

Every command must exit 0 on testserver, except those in EXPECTED_FAILURES, which must fail (non-zero)
the same way on both servers. With REAL_KUBECONFIG, each command also runs against the real server and the
outputs are compared after normalising names, uids, resourceVersions, timestamps, ages and IPs (for an
expected failure: the exit code, stdout and stderr). A difference fails the run unless the command is in
KNOWN_DIFFERENCES (each is listed in testserver/README.md, "Differences seen by kubectl"); a known
difference that went away is reported so the list can shrink. Without REAL_KUBECONFIG only the exit codes
are checked (and it says so). Cluster-scoped objects of the sequence carry the run's random name and are
deleted at the end (namespaces with --wait=false: without a controller manager they stay Terminating).
"""
import difflib
import json
import os
import random
import re
import string
import subprocess
import sys
import tempfile
import threading
import time

# Command name -> why the outputs differ (mirrored in testserver/README.md). Every other command's output
# equals the real server's after normalisation.
KNOWN_DIFFERENCES = {
}

# Command name -> why it fails (non-zero exit) on both servers alike: compared on exit code, stdout and
# stderr (normalised) instead of required to exit 0.
EXPECTED_FAILURES = {
    "seq: rollout status": "neither server runs a controller manager: the Deployment's status is never "
                           "written, so kubectl waits for the spec update to be observed and times out (exit 1)",
}

MANIFESTS = {
    "cm": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "labels": {"app": "demo"}},
           "data": {"k": "v"}},
    "secret": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "stringData": {"password": "hunter2"}},
    "deploy": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}},
    "svc": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
    "fin": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/hold"]}},
    "applied": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2", "labels": {"app": "demo"}},
                "data": {"a": "1", "b": "2"}},
    "applied2": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}, "data": {"a": "1", "c": "3"}},
    "ssa": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c3"}, "data": {"x": "1"}},
    "ssa_deploy": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
                   "spec": {"selector": {"matchLabels": {"app": "api"}},
                            "template": {"metadata": {"labels": {"app": "api"}},
                                         "spec": {"containers": [{"name": "api", "image": "nginx:1.27"}]}}}},
}


def commands(ns):
    """(name, args) in order; `{m:NAME}` is the path of a manifest file."""
    n = ["-n", ns]
    return [
        ("create ns", ["create", "-f", "{m:ns}"]),
        ("create cm", ["create", "-f", "{m:cm}"] + n),
        ("create secret", ["create", "-f", "{m:secret}"] + n),
        ("create deploy", ["create", "-f", "{m:deploy}"] + n),
        ("create svc", ["create", "-f", "{m:svc}"] + n),
        ("get cm -o json", ["get", "cm", "c1", "-o", "json"] + n),
        ("get cm -o yaml", ["get", "cm", "c1", "-o", "yaml"] + n),
        ("get cm -o name", ["get", "cm", "-o", "name"] + n),
        ("get cm (table)", ["get", "cm", "c1"] + n),
        ("get secret -o json", ["get", "secret", "s1", "-o", "json"] + n),
        ("get deploy -o json", ["get", "deploy", "web", "-o", "json"] + n),
        ("get deploy -o yaml", ["get", "deploy", "web", "-o", "yaml"] + n),
        ("get deploy (table)", ["get", "deploy"] + n),
        ("get svc -o json", ["get", "svc", "web", "-o", "json"] + n),
        ("get svc (table)", ["get", "svc", "web"] + n),
        ("get svc -o wide", ["get", "svc", "web", "-o", "wide"] + n),
        ("get deploy -o wide", ["get", "deploy", "-o", "wide"] + n),
        ("get secret (table)", ["get", "secret", "s1"] + n),
        ("get ns (table)", ["get", "ns", ns]),
        ("label", ["label", "cm", "c1", "tier=front"] + n),
        ("annotate", ["annotate", "cm", "c1", "note=hello"] + n),
        ("patch --type merge", ["patch", "cm", "c1", "--type", "merge", "-p", '{"data":{"k2":"v2"}}'] + n),
        ("patch --type json", ["patch", "cm", "c1", "--type", "json", "-p",
                               '[{"op":"replace","path":"/data/k","value":"v3"}]'] + n),
        ("get cm after patches", ["get", "cm", "c1", "-o", "json"] + n),
        ("apply (client-side)", ["apply", "-f", "{m:applied}"] + n),
        ("apply again (client-side)", ["apply", "-f", "{m:applied2}"] + n),
        ("get applied", ["get", "cm", "c2", "-o", "json"] + n),
        ("apply --server-side", ["apply", "--server-side", "--field-manager=ssa-a", "-f", "{m:ssa}"] + n),
        ("apply --server-side deploy", ["apply", "--server-side", "-f", "{m:ssa_deploy}"] + n),
        ("get managed fields", ["get", "cm", "c3", "-o", "json", "--show-managed-fields"] + n),
        ("patch (strategic)", ["patch", "deploy", "web", "-p",
                               '{"spec":{"template":{"spec":{"containers":[{"name":"side","image":"busybox:1"}]}}}}'] + n),
        ("get deploy after strategic", ["get", "deploy", "web", "-o", "json"] + n),
        ("explain", ["explain", "deployment.spec.strategy"]),
        ("explain --recursive", ["explain", "configmap", "--recursive"]),
        ("scale", ["scale", "deploy", "web", "--replicas=3"] + n),
        ("get deploy replicas", ["get", "deploy", "web", "-o", "jsonpath={.spec.replicas} {.metadata.generation}"] + n),
        ("get -w", ["get", "cm", "c1", "-w", "--request-timeout=2s", "-o", "name"] + n),
        ("describe cm", ["describe", "cm", "c1"] + n),
        ("describe deploy", ["describe", "deploy", "web"] + n),
        ("api-resources", ["api-resources"]),
        ("create held", ["create", "-f", "{m:fin}"] + n),
        ("delete held (no wait)", ["delete", "cm", "held", "--wait=false"] + n),
        ("wait --for=delete", ["wait", "--for=delete", "cm/held", "--timeout=20s"] + n),
        ("delete cm", ["delete", "cm", "c1"] + n),
        ("delete deploy", ["delete", "deploy", "web"] + n),
        ("get cm -o name after delete", ["get", "cm", "-o", "name"] + n),
    ] + everyday(ns)


def seq_names(ns):
    """The everyday sequence's namespace and its cluster-scoped names (unique per run: they carry `ns`)."""
    return {"ns": ns + "-seq", "clusterrole": ns + "-reader", "priorityclass": ns + "-high"}


def everyday(ns):
    """The imperative creates (kubectl sends their bodies as protobuf; `run` sends JSON) and an everyday
    sequence on what they created, in a namespace of their own made by `create namespace`."""
    names = seq_names(ns)
    s, cr, pc = names["ns"], names["clusterrole"], names["priorityclass"]
    n = ["-n", s]
    return [
        ("seq: create namespace", ["create", "namespace", s]),
        ("seq: create configmap", ["create", "configmap", "cfg", "--from-literal=color=blue",
                                   "--from-literal=size=m"] + n),
        ("seq: create secret generic", ["create", "secret", "generic", "creds", "--from-literal=user=admin",
                                        "--from-literal=password=hunter2"] + n),
        ("seq: create deployment", ["create", "deployment", "web", "--image=nginx"] + n),
        ("seq: create service clusterip", ["create", "service", "clusterip", "web", "--tcp=80:8080"] + n),
        ("seq: create job", ["create", "job", "once", "--image=busybox"] + n),
        ("seq: create cronjob", ["create", "cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *"] + n),
        ("seq: run", ["run", "pod1", "--image=nginx"] + n),
        ("seq: create serviceaccount", ["create", "serviceaccount", "bot"] + n),
        ("seq: create role", ["create", "role", "cm-reader", "--verb=get,list,watch", "--resource=configmaps"] + n),
        ("seq: create rolebinding", ["create", "rolebinding", "cm-reader", "--role=cm-reader",
                                     f"--serviceaccount={s}:bot"] + n),
        ("seq: create clusterrole", ["create", "clusterrole", cr, "--verb=get,list", "--resource=namespaces"]),
        ("seq: create clusterrolebinding", ["create", "clusterrolebinding", cr, f"--clusterrole={cr}",
                                            "--user=alice"]),
        ("seq: create priorityclass", ["create", "priorityclass", pc, "--value=1000",
                                       "--description=kubectl compare"]),
        # Last of the creates: nothing created after it in the namespace is counted.
        ("seq: create quota", ["create", "quota", "small", "--hard=pods=10,services=5"] + n),
        ("seq: get configmap (table)", ["get", "configmap", "cfg"] + n),
        ("seq: get configmap -o json", ["get", "configmap", "cfg", "-o", "json"] + n),
        ("seq: get secret -o json", ["get", "secret", "creds", "-o", "json"] + n),
        ("seq: get deployment (table)", ["get", "deployment", "web"] + n),
        ("seq: get deployment -o json", ["get", "deployment", "web", "-o", "json"] + n),
        ("seq: get service (table)", ["get", "service", "web"] + n),
        ("seq: get service -o json", ["get", "service", "web", "-o", "json"] + n),
        ("seq: get job -o json", ["get", "job", "once", "-o", "json"] + n),
        ("seq: get cronjob -o json", ["get", "cronjob", "tick", "-o", "json"] + n),
        ("seq: get pod -o json", ["get", "pod", "pod1", "-o", "json"] + n),
        ("seq: get serviceaccount -o json", ["get", "serviceaccount", "bot", "-o", "json"] + n),
        ("seq: get role -o json", ["get", "role", "cm-reader", "-o", "json"] + n),
        ("seq: get rolebinding -o json", ["get", "rolebinding", "cm-reader", "-o", "json"] + n),
        ("seq: get clusterrole -o json", ["get", "clusterrole", cr, "-o", "json"]),
        ("seq: get clusterrolebinding -o json", ["get", "clusterrolebinding", cr, "-o", "json"]),
        ("seq: get priorityclass -o json", ["get", "priorityclass", pc, "-o", "json"]),
        ("seq: get quota -o json", ["get", "quota", "small", "-o", "json"] + n),
        ("seq: get -l app=web (table)", ["get", "deployments,services", "-l", "app=web"] + n),
        ("seq: get -l run=pod1 -o name", ["get", "pods", "-l", "run=pod1", "-o", "name"] + n),
        ("seq: label", ["label", "configmap", "cfg", "tier=front"] + n),
        ("seq: annotate", ["annotate", "configmap", "cfg", "owner=team-a"] + n),
        ("seq: get -l tier=front -o name", ["get", "configmaps", "-l", "tier=front", "-o", "name"] + n),
        ("seq: patch --type merge", ["patch", "configmap", "cfg", "--type", "merge", "-p",
                                     '{"data":{"size":"l"}}'] + n),
        ("seq: patch (strategic)", ["patch", "deployment", "web", "-p",
                                    '{"spec":{"template":{"spec":{"containers":[{"name":"nginx",'
                                    '"image":"nginx:1.27"}]}}}}'] + n),
        ("seq: patch --type json", ["patch", "service", "web", "--type", "json", "-p",
                                    '[{"op":"add","path":"/metadata/labels/tier","value":"edge"}]'] + n),
        ("seq: get configmap after patches", ["get", "configmap", "cfg", "-o", "json"] + n),
        ("seq: get deployment after patch", ["get", "deployment", "web", "-o", "json"] + n),
        ("seq: get service after patch", ["get", "service", "web", "-o", "json"] + n),
        ("seq: scale", ["scale", "deployment", "web", "--replicas=2"] + n),
        ("seq: get deployment replicas", ["get", "deployment", "web", "-o",
                                          "jsonpath={.spec.replicas} {.metadata.generation}"] + n),
        ("seq: rollout status", ["rollout", "status", "deployment/web", "--timeout=5s"] + n),
        ("seq: describe configmap", ["describe", "configmap", "cfg"] + n),
        ("seq: describe deployment", ["describe", "deployment", "web"] + n),
        ("seq: delete pod", ["delete", "pod", "pod1"] + n),
        ("seq: delete deployment", ["delete", "deployment", "web"] + n),
        ("seq: delete service", ["delete", "service", "web"] + n),
        ("seq: delete job", ["delete", "job", "once"] + n),
        ("seq: delete cronjob", ["delete", "cronjob", "tick"] + n),
        ("seq: delete secret", ["delete", "secret", "creds"] + n),
        ("seq: delete quota", ["delete", "quota", "small"] + n),
        ("seq: delete rolebinding", ["delete", "rolebinding", "cm-reader"] + n),
        ("seq: delete role", ["delete", "role", "cm-reader"] + n),
        ("seq: delete serviceaccount", ["delete", "serviceaccount", "bot"] + n),
        ("seq: delete clusterrolebinding", ["delete", "clusterrolebinding", cr]),
        ("seq: delete clusterrole", ["delete", "clusterrole", cr]),
        ("seq: delete priorityclass", ["delete", "priorityclass", pc]),
        # The ConfigMap has no finalizer: it is deleted (without waiting) while kubectl waits.
        ("seq: wait --for=delete", ["wait", "--for=delete", "configmap/cfg", "--timeout=20s"] + n),
        ("seq: get after deletes -o name", ["get", "configmaps,secrets,deployments,services,pods,jobs,cronjobs,"
                                            "serviceaccounts,roles,rolebindings,resourcequotas", "-o", "name"] + n),
    ]


def background(ns):
    """Command name -> (delay, kubectl args) run on a thread `delay` seconds after the command starts."""
    s = seq_names(ns)["ns"]
    return {
        # Release the finalizer of cm/held while `kubectl wait` waits.
        "wait --for=delete": (1.5, ["patch", "cm", "held", "-n", ns, "--type", "merge", "-p",
                                    '{"metadata":{"finalizers":null}}']),
        "seq: wait --for=delete": (1.5, ["delete", "configmap", "cfg", "-n", s, "--wait=false"]),
    }


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")
DESCRIBE_TIME = re.compile(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} [+-]\d{4}")
RV = re.compile(r'(resourceVersion"?:\s*)"?\d+"?')
AGE = re.compile(r"(?<![\w.-])(\d+[smhd])+(?![\w.-])")
IP = re.compile(r"\b10\.96\.\d+\.\d+\b")


def normalise(text, ns):
    text = text.replace(ns, "NS")
    text = UUID.sub("UID", text)
    text = TIMESTAMP.sub("TIME", text)
    text = DESCRIBE_TIME.sub("TIME", text)
    text = RV.sub(r"\1RV", text)
    text = IP.sub("IP", text)
    text = AGE.sub("AGE", text)
    # Table columns are padded to the widest cell: after the substitutions, only the gaps differ.
    return "\n".join(re.sub(r"(?<=\S) {2,}", "  ", line.rstrip()) for line in text.splitlines())


def run(kubectl, kubeconfig, args, files):
    args = [files[a[3:-1]] if a.startswith("{m:") else a for a in args]
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    p = subprocess.run([kubectl] + args, env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def run_after(kubectl, kubeconfig, args, delay):
    """Run `kubectl args` after `delay` seconds on a thread (while another command waits)."""
    def go():
        time.sleep(delay)
        env = dict(os.environ, KUBECONFIG=kubeconfig)
        subprocess.run([kubectl] + args, env=env, capture_output=True, timeout=60)
    t = threading.Thread(target=go)
    t.start()
    return t


def cleanup(kubectl, kubeconfig, ns):
    """Delete what the run made at cluster scope (not compared). Namespaces are not waited for."""
    names = seq_names(ns)
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    for args in (["delete", "clusterrolebinding,clusterrole", names["clusterrole"], "--ignore-not-found"],
                 ["delete", "priorityclass", names["priorityclass"], "--ignore-not-found"],
                 ["delete", "namespace", ns, names["ns"], "--ignore-not-found", "--wait=false"]):
        subprocess.run([kubectl] + args, env=env, capture_output=True, timeout=60)


def session(kubectl, kubeconfig, label):
    ns = "kc-" + "".join(random.choice(string.ascii_lowercase) for _ in range(8))
    tmp = tempfile.mkdtemp()
    files = {}
    for name, m in list(MANIFESTS.items()) + [("ns", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})]:
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(m, f)
        files[name] = path
    out = {}
    after = background(ns)
    names = [name for name, _ in commands(ns)]
    assert len(set(names)) == len(names), "command names must be unique"
    try:
        for name, args in commands(ns):
            t = run_after(kubectl, kubeconfig, after[name][1], after[name][0]) if name in after else None
            code, stdout, stderr = run(kubectl, kubeconfig, args, files)
            if t:
                t.join()
            out[name] = (code, normalise(stdout, ns), normalise(stderr, ns), stderr.strip())
            state = "ok " if code == 0 else "fail (expected)" if name in EXPECTED_FAILURES else "FAIL"
            print(f"[{label}] {state} kubectl {' '.join(args)}", flush=True)
    finally:
        cleanup(kubectl, kubeconfig, ns)
    return out


def differs(real, ts):
    return "\n".join(difflib.unified_diff(real.splitlines(), ts.splitlines(), "real", "testserver", lineterm=""))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kubectl, ts_kc = sys.argv[1], sys.argv[2]
    real_kc = sys.argv[3] if len(sys.argv) > 3 else None
    failures = []
    ts = session(kubectl, ts_kc, "testserver")
    for name, (code, _, _, err) in ts.items():
        if name in EXPECTED_FAILURES:
            if code == 0:
                failures.append(f"{name}: exit 0 on testserver, expected to fail ({EXPECTED_FAILURES[name]})")
        elif code != 0:
            failures.append(f"{name}: exit {code} on testserver: {err}")
    if real_kc is None:
        print("no real server given: exit codes checked, outputs not compared")
    else:
        real = session(kubectl, real_kc, "real")
        same_count = 0
        for name, (code, stdout, stderr, err) in real.items():
            ts_code, ts_stdout, ts_stderr, _ = ts[name]
            if name in EXPECTED_FAILURES:
                if code == 0:
                    failures.append(f"{name}: exit 0 on the real server, expected to fail ({EXPECTED_FAILURES[name]})")
                    continue
                same = (code, stdout, stderr) == (ts_code, ts_stdout, ts_stderr)
                detail = (f"exit {code} on the real server, {ts_code} on testserver\n"
                          f"stdout:\n{differs(stdout, ts_stdout)}\nstderr:\n{differs(stderr, ts_stderr)}")
            else:
                if code != 0:
                    failures.append(f"{name}: exit {code} on the real server: {err}")
                    continue
                if ts_code != 0:
                    continue  # already a failure
                same = stdout == ts_stdout
                detail = differs(stdout, ts_stdout)
            if same:
                same_count += 1
            if not same and name not in KNOWN_DIFFERENCES:
                failures.append(f"{name}: output differs\n{detail}")
            elif not same:
                print(f"known difference, {name}: {KNOWN_DIFFERENCES[name]}")
            elif name in KNOWN_DIFFERENCES:
                print(f"NOTE: {name} now equals the real server: drop it from KNOWN_DIFFERENCES and the docs")
        print(f"compared {len(real)} commands with the real server: {same_count} equal")
    if failures:
        print("\n\n".join(failures))
        print(f"kubectl: {len(failures)} failures in {len(ts)} commands")
        sys.exit(1)
    print(f"kubectl: {len(ts)} commands ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Run the same kubectl commands against testserver and a real kube-apiserver and compare the outputs.

Usage: kubectl_compare.py KUBECTL TESTSERVER_KUBECONFIG [REAL_KUBECONFIG]

Every command must exit 0 on testserver. With REAL_KUBECONFIG, each command also runs against the real
server and the outputs are compared after normalising names, uids, resourceVersions, timestamps, ages and
IPs. A difference fails the run unless the command is in KNOWN_DIFFERENCES (each is listed in
testserver/README.md, "Differences seen by kubectl"); a known difference that went away is reported so the
list can shrink. Without REAL_KUBECONFIG only the exit codes are checked (and it says so).
"""
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

# Command name -> why the outputs differ (mirrored in testserver/README.md). Empty: every command's
# output equals the real server's after normalisation.
KNOWN_DIFFERENCES = {
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
    ]


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


def release_after(kubectl, kubeconfig, ns, delay):
    """Remove the finalizer of cm/held after `delay` seconds (while `kubectl wait` waits)."""
    def go():
        time.sleep(delay)
        env = dict(os.environ, KUBECONFIG=kubeconfig)
        subprocess.run([kubectl, "patch", "cm", "held", "-n", ns, "--type", "merge", "-p",
                        '{"metadata":{"finalizers":null}}'], env=env, capture_output=True, timeout=60)
    t = threading.Thread(target=go)
    t.start()
    return t


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
    for name, args in commands(ns):
        t = release_after(kubectl, kubeconfig, ns, 1.5) if name == "wait --for=delete" else None
        code, stdout, stderr = run(kubectl, kubeconfig, args, files)
        if t:
            t.join()
        out[name] = (code, normalise(stdout, ns), stderr.strip())
        print(f"[{label}] {'ok ' if code == 0 else 'FAIL'} kubectl {' '.join(args)}", flush=True)
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kubectl, ts_kc = sys.argv[1], sys.argv[2]
    real_kc = sys.argv[3] if len(sys.argv) > 3 else None
    failures = []
    ts = session(kubectl, ts_kc, "testserver")
    for name, (code, _, err) in ts.items():
        if code != 0:
            failures.append(f"{name}: exit {code} on testserver: {err}")
    if real_kc is None:
        print("no real server given: exit codes checked, outputs not compared")
    else:
        real = session(kubectl, real_kc, "real")
        for name, (code, stdout, err) in real.items():
            if code != 0:
                failures.append(f"{name}: exit {code} on the real server: {err}")
                continue
            same = stdout == ts[name][1]
            if not same and name not in KNOWN_DIFFERENCES:
                failures.append(f"{name}: output differs\n--- real\n{stdout}\n--- testserver\n{ts[name][1]}")
            elif not same:
                print(f"known difference, {name}: {KNOWN_DIFFERENCES[name]}")
            elif name in KNOWN_DIFFERENCES:
                print(f"NOTE: {name} now equals the real server: drop it from KNOWN_DIFFERENCES and the docs")
        print(f"compared {len(real)} commands with the real server")
    if failures:
        print("\n\n".join(failures))
        sys.exit(1)
    print(f"kubectl: {len(ts)} commands ok")


if __name__ == "__main__":
    main()

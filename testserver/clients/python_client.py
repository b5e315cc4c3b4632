#!/usr/bin/env python3
"""The official Python client (`pip install kubernetes`) against testserver: create, get, list, watch,
patch and delete of a ConfigMap and a Deployment, TLS verified from the kubeconfig.

Usage: python_client.py KUBECONFIG   (exits non-zero on the first failed check)
"""
import random
import string
import sys
import urllib3

from kubernetes import client, config, watch


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok   {what}", flush=True)


def main():
    kubeconfig = sys.argv[1]
    api_client = config.new_client_from_config(config_file=kubeconfig)
    conf = api_client.configuration
    check(conf.host.startswith("https://") and conf.verify_ssl and conf.ssl_ca_cert,
          "TLS verified with the kubeconfig's CA")
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    ns = "py-" + "".join(random.choice(string.ascii_lowercase) for _ in range(8))
    core.create_namespace({"metadata": {"name": ns}})

    # ConfigMap: create, get, list, watch, patch, delete.
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "c1", "labels": {"app": "py"}},
                                                "data": {"k": "v"}})
    check(len(cm.metadata.uid) == 36 and cm.metadata.resource_version, "create ConfigMap")
    check(core.read_namespaced_config_map("c1", ns).data == {"k": "v"}, "get ConfigMap")
    listed = core.list_namespaced_config_map(ns, label_selector="app=py")
    check([i.metadata.name for i in listed.items] == ["c1"], "list ConfigMaps by label")
    rv = listed.metadata.resource_version
    patched = core.patch_namespaced_config_map("c1", ns, {"data": {"k": "v2"}})
    check(patched.data == {"k": "v2"}, "patch ConfigMap")
    events = [(e["type"], e["object"].metadata.name, e["object"].data)
              for e in watch.Watch().stream(core.list_namespaced_config_map, ns,
                                            resource_version=rv, timeout_seconds=2)]
    check(events == [("MODIFIED", "c1", {"k": "v2"})], f"watch ConfigMaps from a resourceVersion: {events}")
    core.delete_namespaced_config_map("c1", ns)
    check(core.list_namespaced_config_map(ns).items == [], "delete ConfigMap")

    # Deployment: create, get, list, watch, patch (and /scale), delete.
    dep = {"metadata": {"name": "web"},
           "spec": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}
    created = apps.create_namespaced_deployment(ns, dep)
    check(created.metadata.generation == 1 and created.spec.replicas == 1, "create Deployment (defaults)")
    check(apps.read_namespaced_deployment("web", ns).spec.template.spec.containers[0].image == "nginx:1.27",
          "get Deployment")
    listed = apps.list_namespaced_deployment(ns)
    check([d.metadata.name for d in listed.items] == ["web"], "list Deployments")
    rv = listed.metadata.resource_version
    patched = apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 2}})
    check(patched.spec.replicas == 2 and patched.metadata.generation == 2, "patch Deployment (generation bumped)")
    scale = apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 4}})
    check(scale.spec.replicas == 4 and scale.status.selector == "app=web", "patch Deployment /scale")
    check(apps.read_namespaced_deployment_scale("web", ns).spec.replicas == 4, "get Deployment /scale")
    events = [(e["type"], e["object"].spec.replicas)
              for e in watch.Watch().stream(apps.list_namespaced_deployment, ns,
                                            resource_version=rv, timeout_seconds=2)]
    check(events == [("MODIFIED", 2), ("MODIFIED", 4)], f"watch Deployments from a resourceVersion: {events}")
    apps.delete_namespaced_deployment("web", ns)
    check(apps.list_namespaced_deployment(ns).items == [], "delete Deployment")

    # Verification is real: without the kubeconfig's CA the handshake fails.
    untrusting = client.Configuration()
    untrusting.host = conf.host
    untrusting.api_key = dict(conf.api_key)
    untrusting.api_key_prefix = dict(conf.api_key_prefix)
    untrusting.retries = 0
    try:
        client.CoreV1Api(client.ApiClient(untrusting)).list_namespace()
        check(False, "a client without the CA is refused")
    except urllib3.exceptions.MaxRetryError as e:
        check("CERTIFICATE_VERIFY_FAILED" in str(e), "a client without the CA is refused")
    print("python client: all checks passed")


if __name__ == "__main__":
    main()

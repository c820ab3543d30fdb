#!/usr/bin/env python3
"""Drives the embedded control plane with the official Python `kubernetes` client (a client this
project did not write), the way its examples and users do: typed APIs for the core and workload
kinds, every patch type, label selectors, paging, a watch, the scale subresource, custom
resources through CustomObjectsApi, discovery and the version endpoint.

Usage: python_client.py KUBECONFIG NAMESPACE

Each check prints `ok   NAME` or `FAIL NAME: <the client's error>`; the script goes on after a
failure (one gap should not hide the next) and exits 1 when any check failed. The namespace is
created by the script and must not exist yet (callers pass a unique one).
"""

import datetime
import sys
import time
import traceback

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

FAILED = []


def check(name):
    """Runs the decorated function at once as the check NAME, recording its outcome."""

    def run(fn):
        try:
            fn()
        except ApiException as e:  # the client's own error: status, reason and the server's body
            FAILED.append(name)
            print(f"FAIL {name}: ApiException({e.status} {e.reason}): {e.body}", flush=True)
        except Exception as e:  # noqa: BLE001 - any other client error fails the check too
            FAILED.append(name)
            last = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL {name}: {type(e).__name__}: {e} | {' / '.join(last)}", flush=True)
        else:
            print(f"ok   {name}", flush=True)
        return fn

    return run


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_status(code, fn):
    try:
        fn()
    except ApiException as e:
        expect(e.status == code, f"expected HTTP {code}, got {e.status}: {e.body}")
        return
    raise AssertionError(f"expected HTTP {code}, the call succeeded")


def main():
    kubeconfig, ns = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    core = client.CoreV1Api()
    apps = client.AppsV1Api()
    batch = client.BatchV1Api()
    custom = client.CustomObjectsApi()

    @check("version")
    def _():
        v = client.VersionApi().get_code()
        expect(v.major and v.git_version, f"version without major/gitVersion: {v}")

    @check("discovery: core api versions")
    def _():
        expect("v1" in core_api().get_api_versions().versions, "v1 not in /api")

    @check("discovery: api groups")
    def _():
        groups = {g.name: g for g in client.ApisApi().get_api_versions().groups}
        for g in ["apps", "batch", "apiextensions.k8s.io", "provisioning.dev"]:
            expect(g in groups, f"group {g} not in /apis: {sorted(groups)}")
        expect(groups["apps"].preferred_version.version == "v1", "apps preferred version")

    @check("discovery: resources of apps/v1")
    def _():
        res = {r.name for r in apps.get_api_resources().resources}
        for r in ["deployments", "deployments/scale", "deployments/status", "replicasets", "statefulsets"]:
            expect(r in res, f"{r} not in apps/v1: {sorted(res)}")

    @check("discovery: resources of v1")
    def _():
        res = {r.name: r for r in core.get_api_resources().resources}
        for r in ["pods", "nodes", "namespaces", "services", "configmaps", "secrets", "events"]:
            expect(r in res, f"{r} not in v1: {sorted(res)}")
        expect(res["nodes"].namespaced is False and res["pods"].namespaced is True, "scope of nodes/pods")

    @check("list pods, nodes, namespaces (all namespaces)")
    def _():
        core.list_pod_for_all_namespaces()
        core.list_node()
        names = [n.metadata.name for n in core.list_namespace().items]
        expect("default" in names, f"no default namespace: {names}")

    @check("create namespace")
    def _():
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        expect(core.read_namespace(ns).status.phase == "Active", "namespace not Active")

    @check("default/kubernetes service")
    def _():
        # It points at the address this server serves on (there is no service proxy to map 443).
        svc = core.read_namespaced_service("kubernetes", "default")
        host = client.Configuration.get_default_copy().host
        port = svc.spec.ports[0]
        expect(port.name == "https" and host.endswith(f"{svc.spec.cluster_ip}:{port.port}"), f"{host} vs {svc.spec}")

    configmap_checks(core, ns)
    deployment_checks(apps, ns)
    service_checks(core, ns)
    job_checks(batch, ns)
    selector_and_paging_checks(core, ns)
    watch_checks(core, ns)
    custom_resource_checks(custom, ns)
    dynamic_and_utils_checks(ns)
    other_kinds_checks(ns)

    @check("delete namespace")
    def _():
        core.delete_namespace(ns)

    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {', '.join(FAILED)}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


def core_api():
    return client.CoreApi()


def configmap_checks(core, ns):
    @check("configmap: create/read")
    def _():
        cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm1", labels={"app": "py"}), data={"a": "1"})
        created = core.create_namespaced_config_map(ns, cm)
        expect(created.metadata.uid and created.metadata.resource_version, "no uid/resourceVersion")
        got = core.read_namespaced_config_map("cm1", ns)
        expect(got.data == {"a": "1"}, f"data {got.data}")
        expect_status(409, lambda: core.create_namespaced_config_map(ns, cm))

    @check("configmap: replace (and a stale replace is 409)")
    def _():
        got = core.read_namespaced_config_map("cm1", ns)
        got.data["b"] = "2"
        replaced = core.replace_namespaced_config_map("cm1", ns, got)
        expect(replaced.data == {"a": "1", "b": "2"}, f"data {replaced.data}")
        expect_status(409, lambda: core.replace_namespaced_config_map("cm1", ns, got))

    @check("configmap: merge patch")
    def _():
        # The client picks strategic merge for a dict body by default; ask for a merge patch.
        out = core.patch_namespaced_config_map("cm1", ns, {"data": {"c": "3"}}, _content_type="application/merge-patch+json")
        expect(out.data.get("c") == "3", f"data {out.data}")

    @check("configmap: strategic merge patch")
    def _():
        out = core.patch_namespaced_config_map(
            "cm1", ns, {"metadata": {"labels": {"tier": "x"}}}, _content_type="application/strategic-merge-patch+json"
        )
        expect(out.metadata.labels == {"app": "py", "tier": "x"}, f"labels {out.metadata.labels}")

    @check("configmap: json patch")
    def _():
        out = core.patch_namespaced_config_map(
            "cm1", ns, [{"op": "replace", "path": "/data/a", "value": "10"}], _content_type="application/json-patch+json"
        )
        expect(out.data["a"] == "10", f"data {out.data}")

    @check("configmap: server-side apply")
    def _():
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"applied": "yes"}}
        out = core.patch_namespaced_config_map(
            "cm1", ns, body, field_manager="py-apply", force=True, _content_type="application/apply-patch+yaml"
        )
        expect(out.data.get("applied") == "yes", f"data {out.data}")
        managers = [m.manager for m in out.metadata.managed_fields or []]
        expect("py-apply" in managers, f"managers {managers}")

    @check("configmap: delete (and read after is 404)")
    def _():
        core.delete_namespaced_config_map("cm1", ns)
        expect_status(404, lambda: core.read_namespaced_config_map("cm1", ns))


def deployment_body(name, replicas):
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(name="web", image="nginx:1.27", ports=[client.V1ContainerPort(container_port=80)])
                    ]
                ),
            ),
        ),
    )


def deployment_checks(apps, ns):
    @check("deployment: create/read")
    def _():
        apps.create_namespaced_deployment(ns, deployment_body("web", 2))
        d = apps.read_namespaced_deployment("web", ns)
        expect(d.spec.replicas == 2, f"replicas {d.spec.replicas}")
        expect(d.spec.strategy and d.spec.strategy.type == "RollingUpdate", f"strategy default {d.spec.strategy}")
        expect(d.metadata.generation == 1, f"generation {d.metadata.generation}")

    @check("deployment: list")
    def _():
        names = [d.metadata.name for d in apps.list_namespaced_deployment(ns).items]
        expect(names == ["web"], f"names {names}")
        apps.list_deployment_for_all_namespaces()

    @check("deployment: replace image")
    def _():
        d = apps.read_namespaced_deployment("web", ns)
        d.spec.template.spec.containers[0].image = "nginx:1.28"
        out = apps.replace_namespaced_deployment("web", ns, d)
        expect(out.spec.template.spec.containers[0].image == "nginx:1.28", "image not replaced")
        expect(out.metadata.generation == 2, f"generation {out.metadata.generation}")

    @check("deployment: strategic merge patch of containers (merged by name)")
    def _():
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.29"}]}}}}
        out = apps.patch_namespaced_deployment("web", ns, patch, _content_type="application/strategic-merge-patch+json")
        c = out.spec.template.spec.containers
        expect(len(c) == 1 and c[0].image == "nginx:1.29" and c[0].ports[0].container_port == 80, f"containers {c}")

    @check("deployment: json patch")
    def _():
        patch = [{"op": "add", "path": "/metadata/annotations", "value": {"py": "json"}}]
        out = apps.patch_namespaced_deployment("web", ns, patch, _content_type="application/json-patch+json")
        expect(out.metadata.annotations == {"py": "json"}, f"annotations {out.metadata.annotations}")

    @check("deployment: server-side apply")
    def _():
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "side", "image": "busybox"}]},
                },
            },
        }
        out = apps.patch_namespaced_deployment(
            "web", ns, body, field_manager="py-apply", _content_type="application/apply-patch+yaml"
        )
        names = sorted(c.name for c in out.spec.template.spec.containers)
        expect(names == ["side", "web"], f"containers after apply {names}")

    @check("deployment: scale subresource read/patch/replace")
    def _():
        s = apps.read_namespaced_deployment_scale("web", ns)
        expect(s.spec.replicas == 2, f"scale {s.spec}")
        out = apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 4}})
        expect(out.spec.replicas == 4, f"patched scale {out.spec}")
        s = apps.read_namespaced_deployment_scale("web", ns)
        s.spec.replicas = 1
        apps.replace_namespaced_deployment_scale("web", ns, s)
        expect(apps.read_namespaced_deployment("web", ns).spec.replicas == 1, "replicas after scale replace")

    @check("deployment: status read/patch")
    def _():
        apps.read_namespaced_deployment_status("web", ns)
        out = apps.patch_namespaced_deployment_status("web", ns, {"status": {"observedGeneration": 1}})
        expect(out.status.observed_generation == 1, f"status {out.status}")

    @check("deployment: delete")
    def _():
        apps.delete_namespaced_deployment("web", ns, propagation_policy="Foreground")
        # Foreground deletion leaves the object with a finalizer until its dependants are gone
        # (there are none: no controller made ReplicaSets), so it goes at once or shortly after.
        for _ in range(50):
            try:
                apps.read_namespaced_deployment("web", ns)
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            time.sleep(0.1)
        raise AssertionError("deployment still there 5s after delete")


def service_checks(core, ns):
    @check("service: create (clusterIP allocated)/patch/delete")
    def _():
        svc = client.V1Service(
            metadata=client.V1ObjectMeta(name="svc1"),
            spec=client.V1ServiceSpec(
                selector={"app": "web"}, ports=[client.V1ServicePort(port=80, target_port=8080, name="http")]
            ),
        )
        out = core.create_namespaced_service(ns, svc)
        expect(out.spec.cluster_ip, f"no clusterIP: {out.spec}")
        expect(out.spec.type == "ClusterIP", f"type {out.spec.type}")
        out = core.patch_namespaced_service("svc1", ns, {"spec": {"ports": [{"port": 80, "targetPort": 9090, "name": "http"}]}})
        expect(out.spec.ports[0].target_port == 9090, f"ports {out.spec.ports}")
        gone = core.delete_namespaced_service("svc1", ns)
        expect(gone.metadata.name == "svc1", f"delete answered {gone}")

    @check("service: NodePort gets node ports kept across a replace")
    def _():
        svc = client.V1Service(
            metadata=client.V1ObjectMeta(name="svc2"),
            spec=client.V1ServiceSpec(type="NodePort", selector={"app": "web"}, ports=[client.V1ServicePort(port=80)]),
        )
        out = core.create_namespaced_service(ns, svc)
        port = out.spec.ports[0].node_port
        expect(port and 30000 <= port <= 32767 and out.spec.external_traffic_policy == "Cluster", f"spec {out.spec}")
        out.spec.selector = {"app": "other"}
        out = core.replace_namespaced_service("svc2", ns, out)
        expect(out.spec.ports[0].node_port == port, f"node port changed: {out.spec.ports}")
        core.delete_namespaced_service("svc2", ns)

    @check("pod: create/read (defaulted, never runs)/delete")
    def _():
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="pod1"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
        )
        out = core.create_namespaced_pod(ns, pod)
        c = out.spec.containers[0]
        expect(c.image_pull_policy == "Always" and out.spec.restart_policy == "Always", f"pod spec {out.spec}")
        expect(out.status.phase == "Pending", f"pod status {out.status}")
        gone = core.delete_namespaced_pod("pod1", ns)
        expect(gone.metadata.name == "pod1", f"delete answered {gone}")
        sa = core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="sa1")))
        gone = core.delete_namespaced_service_account("sa1", ns)
        expect(gone.metadata.uid == sa.metadata.uid, f"delete answered {gone}")


def job_checks(batch, ns):
    container = client.V1Container(name="c", image="busybox", command=["echo", "hi"])
    template = client.V1PodTemplateSpec(spec=client.V1PodSpec(containers=[container], restart_policy="Never"))

    @check("job: create/read/delete")
    def _():
        job = client.V1Job(metadata=client.V1ObjectMeta(name="job1"), spec=client.V1JobSpec(template=template))
        out = batch.create_namespaced_job(ns, job)
        expect(out.spec.backoff_limit == 6, f"backoffLimit default {out.spec.backoff_limit}")
        expect(out.spec.selector and out.spec.template.metadata.labels, "job selector/labels not generated")
        batch.read_namespaced_job("job1", ns)
        batch.delete_namespaced_job("job1", ns, propagation_policy="Background")

    @check("cronjob: create/patch/delete")
    def _():
        cj = client.V1CronJob(
            metadata=client.V1ObjectMeta(name="cj1"),
            spec=client.V1CronJobSpec(schedule="*/5 * * * *", job_template=client.V1JobTemplateSpec(spec=client.V1JobSpec(template=template))),
        )
        out = batch.create_namespaced_cron_job(ns, cj)
        expect(out.spec.concurrency_policy == "Allow", f"concurrencyPolicy default {out.spec.concurrency_policy}")
        out = batch.patch_namespaced_cron_job("cj1", ns, {"spec": {"suspend": True}})
        expect(out.spec.suspend is True, "suspend not patched")
        batch.list_cron_job_for_all_namespaces()
        batch.delete_namespaced_cron_job("cj1", ns)


def selector_and_paging_checks(core, ns):
    @check("label selectors and paging (limit/continue)")
    def _():
        for i in range(7):
            labels = {"set": "page", "parity": "even" if i % 2 == 0 else "odd"}
            core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"p{i}", labels=labels)))
        odd = core.list_namespaced_config_map(ns, label_selector="set=page,parity=odd").items
        expect(sorted(c.metadata.name for c in odd) == ["p1", "p3", "p5"], f"odd {[c.metadata.name for c in odd]}")
        notin = core.list_namespaced_config_map(ns, label_selector="set=page,parity notin (odd)").items
        expect(len(notin) == 4, f"notin {[c.metadata.name for c in notin]}")
        seen, cont, pages = [], None, 0
        while True:
            page = core.list_namespaced_config_map(ns, label_selector="set=page", limit=3, _continue=cont)
            pages += 1
            seen += [c.metadata.name for c in page.items]
            cont = page.metadata._continue
            if not cont:
                break
            expect(page.metadata.remaining_item_count in (None, 7 - len(seen)), f"remainingItemCount {page.metadata}")
        expect(pages == 3 and sorted(seen) == [f"p{i}" for i in range(7)], f"pages {pages} seen {seen}")
        by_name = core.list_namespaced_config_map(ns, field_selector="metadata.name=p2").items
        expect([c.metadata.name for c in by_name] == ["p2"], f"field selector {[c.metadata.name for c in by_name]}")
        anywhere = core.list_config_map_for_all_namespaces(field_selector=f"metadata.namespace={ns}", label_selector="set=page")
        expect(len(anywhere.items) == 7, f"all-namespaces list with selectors: {len(anywhere.items)}")
        core.delete_collection_namespaced_config_map(ns, label_selector="set=page")
        left = core.list_namespaced_config_map(ns, label_selector="set=page").items
        expect(left == [], f"left after deletecollection {left}")


def watch_checks(core, ns):
    @check("watch: ADDED/MODIFIED/DELETED from a resourceVersion")
    def _():
        rv = core.list_namespaced_config_map(ns).metadata.resource_version
        core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="w1"), data={"x": "1"}))
        core.patch_namespaced_config_map("w1", ns, {"data": {"x": "2"}})
        core.delete_namespaced_config_map("w1", ns)
        events = []
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=10):
            obj = ev["object"]
            if obj.metadata.name != "w1":
                continue
            events.append((ev["type"], obj.metadata.resource_version))
            if ev["type"] == "DELETED":
                w.stop()
        types = [t for t, _ in events]
        expect(types == ["ADDED", "MODIFIED", "DELETED"], f"events {events}")
        rvs = [int(r) for _, r in events]
        expect(rvs == sorted(rvs) and len(set(rvs)) == 3, f"resourceVersions not increasing: {rvs}")

    @check("watch from resourceVersion 1: its events, or 410 Gone as an ApiException")
    def _():
        w = watch.Watch()
        try:
            for _ev in w.stream(core.list_namespaced_config_map, ns, resource_version="1", timeout_seconds=3):
                pass
        except ApiException as e:
            expect(e.status == 410, f"expected 410 Gone, got {e.status}: {e.body}")
            return
        # The client turns an ERROR event with code 410 into ApiException; a server that still had
        # history from rv 1 answers with the events instead, which is also upstream behaviour.


GROUP, VERSION = "provisioning.dev", "v1alpha1"


def custom_resource_checks(custom, ns):
    ws_name = f"{ns}-ws"

    @check("custom resources: Workspace (cluster-scoped) create/get/list/patch/delete")
    def _():
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workspace",
            "metadata": {"name": ws_name, "labels": {"py": "yes"}},
            "spec": {
                "namespace": ns,
                "environment": "dev",
                "defaults": {"provider": "sim", "plan": "small", "image": "debian-12"},
                "providers": [{"name": "sim", "type": "simulated"}],
            },
        }
        out = custom.create_cluster_custom_object(GROUP, VERSION, "workspaces", body)
        expect(out["metadata"]["uid"], f"no uid: {out}")
        got = custom.get_cluster_custom_object(GROUP, VERSION, "workspaces", ws_name)
        expect(got["spec"]["environment"] == "dev", f"spec {got['spec']}")
        items = custom.list_cluster_custom_object(GROUP, VERSION, "workspaces", label_selector="py=yes")["items"]
        expect([i["metadata"]["name"] for i in items] == [ws_name], f"items {items}")
        out = custom.patch_cluster_custom_object(GROUP, VERSION, "workspaces", ws_name, {"metadata": {"annotations": {"a": "b"}}})
        expect(out["metadata"]["annotations"].get("a") == "b", f"annotations {out['metadata']}")
        custom.delete_cluster_custom_object(GROUP, VERSION, "workspaces", ws_name)

    @check("custom resources: Server (namespaced) create/get/list/patch/status/delete")
    def _():
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Server",
            "metadata": {"name": "srv1", "labels": {"role": "web"}},
            "spec": {"plan": "small"},
        }
        created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, "servers", body)
        got = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1")
        expect(got["spec"]["plan"] == "small", f"spec {got['spec']}")
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "servers", label_selector="role=web")["items"]
        expect(len(items) == 1, f"items {items}")
        custom.list_cluster_custom_object(GROUP, VERSION, "servers")
        out = custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1", {"spec": {"plan": "medium"}})
        expect(out["spec"]["plan"] == "medium" and out["metadata"]["generation"] == 2, f"after patch {out}")
        # status through its subresource; a status in a main-resource patch is ignored.
        out = custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "servers", "srv1", {"status": {"phase": "Pending"}}
        )
        expect(out.get("status", {}).get("phase") == "Pending", f"status {out.get('status')}")
        out = custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1", {"status": {"phase": "Ready"}})
        expect(out["status"]["phase"] == "Pending", f"status changed through the main resource: {out['status']}")
        got = custom.get_namespaced_custom_object_status(GROUP, VERSION, ns, "servers", "srv1")
        expect(got["status"]["phase"] == "Pending", f"status {got.get('status')}")
        expect_status(
            422,
            lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1", {"spec": {"plan": 7}}),
        )
        w = watch.Watch()
        seen = []
        for ev in w.stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, ns, "servers", resource_version=created["metadata"]["resourceVersion"], timeout_seconds=10
        ):
            seen.append((ev["type"], ev["object"]["metadata"]["name"], ev["object"].get("status", {}).get("phase")))
            if len(seen) == 2:
                w.stop()
        # The spec patch, then the status patch (the ignored status in a main-resource patch is a no-op).
        expect(seen == [("MODIFIED", "srv1", None), ("MODIFIED", "srv1", "Pending")], f"watch of servers: {seen}")
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1")
        expect_status(404, lambda: custom.get_namespaced_custom_object(GROUP, VERSION, ns, "servers", "srv1"))


def other_kinds_checks(ns):
    core, apps = client.CoreV1Api(), client.AppsV1Api()
    meta = client.V1ObjectMeta

    @check("authorization: SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview")
    def _():
        authz = client.AuthorizationV1Api()
        attrs = client.V1ResourceAttributes(verb="list", resource="pods", namespace=ns)
        review = authz.create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        )
        expect(review.status.allowed is True, f"review {review.status}")
        authz.create_self_subject_rules_review(client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace=ns)))
        who = client.AuthenticationV1Api().create_self_subject_review(client.V1SelfSubjectReview())
        expect(who.status.user_info.username, f"whoami {who.status}")

    @check("RBAC Role/RoleBinding and a ServiceAccount token (TokenRequest)")
    def _():
        rbac = client.RbacAuthorizationV1Api()
        rule = client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get"])
        rbac.create_namespaced_role(ns, client.V1Role(metadata=meta(name="r"), rules=[rule]))
        ref = client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="r")
        subject = client.RbacV1Subject(kind="ServiceAccount", name="sa-token", namespace=ns)
        rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(metadata=meta(name="rb"), role_ref=ref, subjects=[subject]))
        core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=meta(name="sa-token")))
        spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        tok = core.create_namespaced_service_account_token("sa-token", ns, client.AuthenticationV1TokenRequest(spec=spec))
        expect(tok.status.token and tok.status.expiration_timestamp, "no token")

    @check("Lease replace, core Event create/list, events.k8s.io Event create")
    def _():
        coord = client.CoordinationV1Api()
        coord.create_namespaced_lease(ns, client.V1Lease(metadata=meta(name="l"), spec=client.V1LeaseSpec(holder_identity="me")))
        lease = coord.read_namespaced_lease("l", ns)
        lease.spec.holder_identity = "you"
        expect(coord.replace_namespaced_lease("l", ns, lease).spec.holder_identity == "you", "lease not replaced")
        obj = client.V1ObjectReference(kind="Pod", name="x", namespace=ns)
        core.create_namespaced_event(ns, client.CoreV1Event(metadata=meta(name="e1"), involved_object=obj, reason="R", message="m", type="Normal"))
        names = [e.metadata.name for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=x").items]
        expect(names == ["e1"], f"events {names}")
        now = datetime.datetime.now(datetime.timezone.utc)
        ev = client.EventsV1Event(
            metadata=meta(name="e2"), event_time=now, reporting_controller="example.com/c", reporting_instance="i",
            action="Act", reason="R", regarding=obj, type="Normal",
        )
        client.EventsV1Api().create_namespaced_event(ns, ev)

    @check("StatefulSet, DaemonSet, ReplicaSet create (defaulted), StatefulSet scale, deletecollection")
    def _():
        def template(app):
            labels = {"app": app}
            return client.V1LabelSelector(match_labels=labels), client.V1PodTemplateSpec(
                metadata=meta(labels=labels), spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x:1")])
            )

        sel, tpl = template("sts")
        sts = apps.create_namespaced_stateful_set(
            ns, client.V1StatefulSet(metadata=meta(name="sts"), spec=client.V1StatefulSetSpec(service_name="sts", selector=sel, template=tpl))
        )
        expect(sts.spec.pod_management_policy == "OrderedReady" and sts.spec.update_strategy.type == "RollingUpdate", f"{sts.spec}")
        expect(apps.patch_namespaced_stateful_set_scale("sts", ns, {"spec": {"replicas": 3}}).spec.replicas == 3, "sts scale")
        sel, tpl = template("ds")
        ds = apps.create_namespaced_daemon_set(ns, client.V1DaemonSet(metadata=meta(name="ds"), spec=client.V1DaemonSetSpec(selector=sel, template=tpl)))
        expect(ds.spec.update_strategy.rolling_update.max_unavailable == 1, f"{ds.spec.update_strategy}")
        sel, tpl = template("rs")
        rs = apps.create_namespaced_replica_set(ns, client.V1ReplicaSet(metadata=meta(name="rs"), spec=client.V1ReplicaSetSpec(selector=sel, template=tpl)))
        expect(rs.spec.replicas == 1, f"{rs.spec}")
        apps.delete_collection_namespaced_stateful_set(ns)
        expect(apps.list_namespaced_stateful_set(ns).items == [], "statefulsets left after deletecollection")


def dynamic_and_utils_checks(ns):
    from kubernetes import dynamic, utils

    @check("utils.create_from_dict (a Deployment and a Service)")
    def _():
        docs = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "fromyaml", "namespace": ns},
                "spec": {
                    "selector": {"matchLabels": {"app": "fromyaml"}},
                    "template": {
                        "metadata": {"labels": {"app": "fromyaml"}},
                        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "fromyaml", "namespace": ns},
                "spec": {"selector": {"app": "fromyaml"}, "ports": [{"port": 80}]},
            },
        ]
        for d in docs:
            utils.create_from_dict(client.ApiClient(), d)

    @check("dynamic client: discovery, get/list/patch/delete of built-in and custom kinds")
    def _():
        dyn = dynamic.DynamicClient(client.ApiClient())
        deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
        d = deployments.get(name="fromyaml", namespace=ns)
        expect(d.spec.replicas == 1, f"replicas {d.spec.replicas}")
        deployments.patch(
            name="fromyaml", namespace=ns, body={"spec": {"replicas": 2}}, content_type="application/merge-patch+json"
        )
        names = [i.metadata.name for i in deployments.get(namespace=ns).items]
        expect(names == ["fromyaml"], f"deployments {names}")
        servers = dyn.resources.get(api_version=f"{GROUP}/{VERSION}", kind="Server")
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Server", "metadata": {"name": "dyn1"}, "spec": {"plan": "small"}}
        servers.server_side_apply(body=body, namespace=ns, field_manager="py-dynamic")
        expect(servers.get(name="dyn1", namespace=ns).spec.plan == "small", "server spec")
        workspaces = dyn.resources.get(api_version=f"{GROUP}/{VERSION}", kind="Workspace")
        expect(workspaces.namespaced is False and servers.namespaced is True, "scopes from discovery")
        servers.delete(name="dyn1", namespace=ns)
        deployments.delete(name="fromyaml", namespace=ns)
        dyn.resources.get(api_version="v1", kind="Service").delete(name="fromyaml", namespace=ns)


if __name__ == "__main__":
    main()

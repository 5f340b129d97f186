#!/usr/bin/env python3
"""Helpers of scripts/k8s-checks: each subcommand does one check or one chore, and
exits non-zero with a message when the check fails. Standard library plus PyYAML
(which kubernetes-validate brings). PyYAML is a YAML 1.1 reader, like kubectl's."""

import base64
import hashlib
import hmac
import json
import re
import socket
import sys
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def free_port(_args):
    """Prints a 127.0.0.1 port that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()


def contained(orig, new, path="$"):
    """Every key, item and value of `orig` is in `new`, keys in the same order, list
    items at the same index (inject only appends)."""
    if isinstance(orig, dict):
        if not isinstance(new, dict):
            fail(f"{path}: a mapping became {type(new).__name__}")
        keys = [k for k in new if k in orig]
        if keys != list(orig):
            fail(f"{path}: key order changed: {list(orig)} -> {keys}")
        for k, v in orig.items():
            contained(v, new[k], f"{path}.{k}")
    elif isinstance(orig, list):
        if not isinstance(new, list) or len(new) < len(orig):
            fail(f"{path}: a list lost items")
        for i, v in enumerate(orig):
            contained(v, new[i], f"{path}[{i}]")
    elif path.endswith(".terminationGracePeriodSeconds") and isinstance(new, int) and new >= orig:
        pass  # inject raises it (and says so) to cover the drain; never lowers it
    elif orig != new or type(orig) is not type(new):
        fail(f"{path}: {orig!r} became {new!r}")


def preserved(args):
    """preserved IN OUT: OUT keeps every document, field, value and key order of IN,
    read with a YAML 1.1 reader; documents without an idemgate container stay equal
    unless they are workloads."""
    orig, new = load_all(args[0]), load_all(args[1])
    if len(orig) != len(new):
        fail(f"{args[1]}: {len(orig)} documents became {len(new)}")
    for i, (o, n) in enumerate(zip(orig, new)):
        contained(o, n, f"{args[1]} document {i + 1}")
        if o.get("kind") in ("ConfigMap", "Service", "Secret") and o != n:
            fail(f"{args[1]} document {i + 1}: a {o['kind']} was changed")
    print(f"ok: {args[1]} keeps all of {args[0]}")


def pod_spec(obj):
    kind = obj["kind"]
    if kind == "Pod":
        return obj["metadata"], obj["spec"]
    if kind == "CronJob":
        t = obj["spec"]["jobTemplate"]["spec"]["template"]
    else:
        t = obj["spec"]["template"]
    return t["metadata"], t["spec"]


def sidecar_of(obj):
    meta, spec = pod_spec(obj)
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if c["name"] == "idemgate":
            return meta, spec, c
    fail(f"{obj['kind']}/{obj['metadata']['name']}: no idemgate container")


def same_sidecar(args):
    """same-sidecar PATCH INJECTED: the kustomize component's patch adds what
    `idemgate inject` adds (container, volumes, labels, annotations, grace period)."""
    patch = load_all(args[0])[0]
    injected = load_all(args[1])[0]
    pt = patch["spec"]["template"]
    meta, spec, container = sidecar_of(injected)
    checks = {
        "container": (pt["spec"]["initContainers"], [container]),
        "volumes": (pt["spec"]["volumes"], [v for v in spec["volumes"] if v["name"].startswith("idemgate-")]),
        "grace": (pt["spec"]["terminationGracePeriodSeconds"], spec["terminationGracePeriodSeconds"]),
        "labels": (pt["metadata"]["labels"], {"idemgate.io/webhooks": meta["labels"]["idemgate.io/webhooks"]}),
        "annotations": (pt["metadata"]["annotations"], meta["annotations"]),
    }
    for what, (a, b) in checks.items():
        if a != b:
            fail(f"{args[0]}: the {what} differs from what idemgate inject adds:\n{a}\n!=\n{b}")
    print(f"ok: {args[0]} adds the same sidecar as idemgate inject")


def check_sidecar(args):
    """check-sidecar FILE...: each injected pod's sidecar has the contract's wiring."""
    for path in args:
        for obj in load_all(path):
            if obj.get("kind") not in ("Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
                continue
            meta, spec, c = sidecar_of(obj)
            sc = c["securityContext"]
            env = {e["name"]: e for e in c["env"]}
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            problems = [
                p for p, ok in [
                    ("runAsNonRoot", sc.get("runAsNonRoot") is True),
                    ("readOnlyRootFilesystem", sc.get("readOnlyRootFilesystem") is True),
                    ("allowPrivilegeEscalation", sc.get("allowPrivilegeEscalation") is False),
                    ("capabilities drop ALL", sc.get("capabilities", {}).get("drop") == ["ALL"]),
                    ("seccomp RuntimeDefault", sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"),
                    ("ports webhooks/admin", set(ports) == {"webhooks", "admin"}),
                    ("liveness /healthz on admin", c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}),
                    ("readiness /readyz on admin", c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}),
                    ("requests and limits", {"requests", "limits"} <= set(c["resources"])),
                    ("IDEMGATE_UPSTREAM on localhost", env["IDEMGATE_UPSTREAM"]["value"].startswith("http://127.0.0.1:")),
                    ("IDEMGATE_CONFIG", env["IDEMGATE_CONFIG"]["value"] == "/etc/idemgate/idemgate.toml"),
                    ("scrape annotations", meta.get("annotations", {}).get("prometheus.io/port") == str(ports["admin"])
                        or "prometheus.io/port" in meta.get("annotations", {})),
                    ("grace period covers the drain", spec["terminationGracePeriodSeconds"] >= 30),
                    ("preStop", "preStop" in c.get("lifecycle", {})),
                ] if not ok
            ]
            all_ports = [p["containerPort"] for x in spec.get("containers", []) + spec.get("initContainers", []) for p in x.get("ports", [])]
            if len(all_ports) != len(set(all_ports)):
                problems.append(f"duplicate ports {all_ports}")
            if problems:
                fail(f"{path}: {obj['kind']}/{obj['metadata']['name']}: {', '.join(problems)}")
    print(f"ok: sidecar wiring in {len(args)} files")


def extract_rules(args):
    """extract-rules PROMETHEUSRULE OUT: the spec's groups as a plain rules file."""
    docs = [d for d in load_all(args[0]) if d.get("kind") == "PrometheusRule"]
    if not docs:
        fail(f"{args[0]}: no PrometheusRule")
    groups = [g for d in docs for g in d["spec"]["groups"]]
    with open(args[1], "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    print(f"ok: {sum(len(g['rules']) for g in groups)} rules in {len(groups)} groups -> {args[1]}")


def sign(secret, msg_id, ts, body):
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def post(url, body, headers, timeout=5):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def load(args):
    """load URL SECRET N: N unique signed deliveries, each sent twice (the copy must be
    replayed), plus a few with a wrong signature. Bounded: 3N+3 requests."""
    url, secret, n = args[0], args[1], int(args[2])
    run = f"{int(time.time())}"
    counts = {}
    for i in range(n):
        msg_id = f"msg_k8s_checks_{run}_{i}"
        body = json.dumps({"type": "invoice.paid", "data": {"id": msg_id, "amount": 4200}}).encode()
        ts = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(secret, msg_id, ts, body),
        }
        first, _ = post(url, body, headers)
        copy, copy_headers = post(url, body, headers)
        if first != 200 or copy != 200:
            fail(f"delivery {msg_id}: first {first}, copy {copy} (want 200, 200)")
        if copy_headers.get("idempotent-replayed") != "true":
            fail(f"delivery {msg_id}: the copy was not marked replayed: {copy_headers}")
        counts["forwarded"] = counts.get("forwarded", 0) + 1
        counts["replayed"] = counts.get("replayed", 0) + 1
    for i in range(3):
        msg_id = f"msg_k8s_checks_{run}_bad_{i}"
        ts = int(time.time())
        status, _ = post(url, b"{}", {
            "webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": sign("whsec_" + base64.b64encode(b"wrong-secret").decode(), msg_id, ts, b"{}"),
        })
        if status != 401:
            fail(f"a wrongly signed delivery got {status}, want 401")
    print(f"ok: sent {n} deliveries twice and 3 wrongly signed ones")


def load_async(args):
    """load-async URL SECRET N: N unique signed deliveries to an async route, each
    acknowledged (200) once queued; the sidecar's worker then delivers them."""
    url, secret, n = args[0], args[1], int(args[2])
    run = f"{int(time.time())}"
    for i in range(n):
        msg_id = f"msg_k8s_checks_async_{run}_{i}"
        body = json.dumps({"type": "invoice.paid", "data": {"id": msg_id}}).encode()
        ts = int(time.time())
        status, _ = post(url, body, {
            "content-type": "application/json", "webhook-id": msg_id,
            "webhook-timestamp": str(ts), "webhook-signature": sign(secret, msg_id, ts, body),
        })
        if status != 200:
            fail(f"async delivery {msg_id}: {status}, want 200 (acknowledged)")
    print(f"ok: {n} deliveries acknowledged by the async route")


def upstream(args):
    """upstream PORT: a tiny application on 127.0.0.1 that answers every POST 200."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length", 0))
            self.rfile.read(length)
            body = b'{"received":true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(args[0])), Handler).serve_forever()


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait_http(args):
    """wait-http URL SECONDS: polls until URL answers 200, or fails at the deadline."""
    url, deadline = args[0], time.time() + float(args[1])
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    fail(f"{url} did not answer 200 within {args[1]}s")


def query(prom, q):
    res = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    if res.get("status") != "success":
        fail(f"query {q!r}: {res}")
    return res["data"]["result"]


def prometheus_scraped(args):
    """prometheus-scraped PROM_URL N SECONDS: Prometheus has scraped the sidecar and
    sees N forwarded and N replayed deliveries; every loaded rule evaluates cleanly."""
    prom, n, deadline = args[0], int(args[1]), time.time() + float(args[2])
    seen = {}
    while time.time() < deadline:
        seen = {r["metric"].get("outcome"): float(r["value"][1])
                for r in query(prom, 'sum by (outcome) (idemgate_requests_total{route="standard"})')}
        if seen.get("forwarded", 0) >= n and seen.get("replayed", 0) >= n:
            break
        time.sleep(0.5)
    else:
        fail(f"Prometheus did not see {n} forwarded and {n} replayed deliveries in time: {seen}")
    print(f"ok: Prometheus sees idemgate_requests_total by outcome {seen}")
    up = query(prom, 'up{job="idemgate"}')
    if not up or up[0]["value"][1] != "1":
        fail(f"the scrape target is not up: {up}")
    # The rules: loaded, evaluated at least once, none in error.
    while time.time() < deadline:
        groups = get_json(f"{prom}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules):
            break
        time.sleep(0.5)
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    if not rules or bad:
        fail(f"rules not loaded or failing: {bad or 'none loaded'}")
    print(f"ok: {len(rules)} alerting rules evaluate cleanly on live data")


def wait_up(args):
    """wait-up PROM_URL SECONDS: waits for Prometheus' first successful scrape of the
    sidecar (target discovery alone takes a few seconds), so that the load that follows
    shows as an increase."""
    prom, deadline = args[0], time.time() + float(args[1])
    while time.time() < deadline:
        up = query(prom, 'up{job="idemgate"} == 1')
        if up:
            print("ok: Prometheus scrapes the sidecar")
            return
        time.sleep(0.5)
    fail(f"Prometheus did not scrape the sidecar within {args[1]}s")


def dashboard_queries(args):
    """dashboard-queries DASHBOARD PROM_URL: every panel query of the Grafana dashboard
    runs on the live Prometheus without error, and the main panels have data."""
    dash = json.load(open(args[0]))
    prom = args[1]
    subst = {"$namespace": ".*", "$route": ".*", "$__rate_interval": "1m", "$__range": "5m"}
    queries = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            q = t["expr"]
            for k, v in subst.items():
                q = q.replace(k, v)
            if "$" in q:
                fail(f"panel {panel['title']!r}: unknown variable in {q}")
            queries.append((panel["title"], q))
    total = len(queries)
    # Rates need two scrapes after the load: poll (bounded) until most panels have data.
    deadline = time.time() + float(args[2]) if len(args) > 2 else time.time() + 30
    while True:
        empty = [(title, q) for title, q in queries if not query(prom, q)]
        with_data = total - len(empty)
        if with_data >= total - 3 or time.time() > deadline:
            break
        time.sleep(1)
    for title, q in empty:
        print(f"  (no data: nothing of that kind happened) {title}: {q}")
    if with_data < total - 3:
        fail(f"only {with_data} of {total} dashboard queries returned data")
    print(f"ok: {total} dashboard queries run, {with_data} with data")


def metric_names(args):
    """metric-names METRICS_FILE FILE...: every idemgate_* metric named in the rules and
    the dashboard exists in the sidecar's live /metrics output."""
    live = open(args[0]).read()
    # Sample names, and family names (a histogram's base name appears only in # TYPE).
    exported = set(re.findall(r"^(?:# TYPE )?(idemgate_[a-z_]+)", live, re.M))
    for path in args[1:]:
        used = set(re.findall(r"idemgate_[a-z_]+_(?:total|seconds(?:_bucket|_count|_sum)?|info)|idemgate_in_flight", open(path).read()))
        missing = sorted(used - exported)
        if missing:
            fail(f"{path} uses metrics the sidecar does not export: {missing}")
        print(f"ok: {path}: {len(used)} metric names, all exported")
    for name in ["idemgate_requests_total", "idemgate_request_duration_seconds_bucket",
                 "idemgate_upstream_duration_seconds_bucket", "idemgate_store_duration_seconds_bucket",
                 "idemgate_store_errors_total", "idemgate_in_flight", "idemgate_lease_lost_total",
                 "idemgate_build_info"]:
        if name not in exported:
            fail(f"documented metric {name} is not in /metrics")


def flatten_lists(args):
    """flatten-lists OUT_DIR FILE...: copies each file to OUT_DIR with `kind: List`
    documents replaced by their items (the schemas have no List kind to check)."""
    import os
    for path in args[1:]:
        docs = []
        for d in load_all(path):
            docs.extend(d.get("items", []) if d.get("kind") == "List" else [d])
        with open(os.path.join(args[0], os.path.basename(path)), "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)


def crd_kinds_only(args):
    """crd-kinds-only LOG: kubernetes-validate found a schema for every kind but the
    Prometheus Operator's and cert-manager's (validated separately)."""
    allowed = ("PrometheusRule", "ServiceMonitor", "PodMonitor", "Certificate", "Issuer")
    bad = [l for l in open(args[0]) if "Couldn't find schema" in l and not any(f"kind {k} " in l for k in allowed)]
    if bad:
        fail("no schema for:\n" + "".join(bad))


def selected(selector, labels):
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def check_selectors(mwc, own_ns, problems):
    """Every namespace x pod labelling is sent to the injector by at most one webhook,
    and exactly when docs/kubernetes.md says: never in kube-system or the injector's
    namespace, never when the namespace or the pod says `disabled`, else when the
    namespace or the pod says `enabled`."""
    key = "idemgate.dev/inject"
    for ns_name in ("shop", "kube-system", own_ns):
        for ns_value in (None, "enabled", "disabled"):
            for pod_value in (None, "enabled", "disabled"):
                ns_labels = {"kubernetes.io/metadata.name": ns_name}
                if ns_value:
                    ns_labels[key] = ns_value
                pod_labels = {"app": "x"}
                if pod_value:
                    pod_labels[key] = pod_value
                hits = [w["name"] for w in mwc["webhooks"]
                        if selected(w.get("namespaceSelector", {}), ns_labels)
                        and selected(w.get("objectSelector", {}), pod_labels)]
                expected = (ns_name not in ("kube-system", own_ns)
                            and "disabled" not in (ns_value, pod_value)
                            and "enabled" in (ns_value, pod_value))
                if len(hits) > 1 or bool(hits) != expected:
                    problems.append(f"namespace {ns_name} ({key}={ns_value}), pod ({key}={pod_value}): "
                                    f"sent by {hits or 'no webhook'}, expected {'one' if expected else 'none'}")


def injector_manifests(args):
    """injector-manifests RENDERED INJECTED: the pieces of k8s/injector fit together
    (the webhook calls the Service on /mutate, the Service reaches the container, the
    Certificate covers the Service's name and fills the Secret the pods mount, the CA
    comes from that Certificate), the webhook is safe (Ignore, no side effects, v1,
    kube-system and its own namespace excluded, a reinvocation policy), the Deployment
    survives a drain (2 replicas, a PDB) and runs the image `idemgate inject` adds."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in load_all(args[0])}
    get = lambda kind, name: objs.get((kind, name)) or fail(f"k8s/injector: no {kind}/{name}")
    dep = get("Deployment", "idemgate-injector")
    svc = get("Service", "idemgate-injector")
    cert = get("Certificate", "idemgate-injector")
    mwc = get("MutatingWebhookConfiguration", "idemgate-injector")
    pdb = get("PodDisruptionBudget", "idemgate-injector")
    ns = dep["metadata"]["namespace"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    problems = []
    check = lambda ok, msg: ok or problems.append(msg)
    check(dep["spec"]["replicas"] >= 2, "the Deployment has fewer than 2 replicas")
    check(pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), "the PDB does not select the injector's pods")
    check(svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "the Service does not select the injector's pods")
    check(pod["metadata"]["labels"].get("idemgate.dev/inject") == "disabled", "the injector's pods do not opt out")
    args_ = c["args"]
    check(args_[0] == "injector", "the container does not run `idemgate injector`")
    flag = lambda name: next((a.split("=", 1)[1] for a in args_ if a.startswith(f"--{name}=")), None)
    listen_port = int(flag("listen").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (sp,) = svc["spec"]["ports"]
    check(ports.get(sp["targetPort"], sp["targetPort"]) == listen_port, "the Service's targetPort is not the --listen port")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secret_vol = next(v for v in pod["spec"]["volumes"] if "secret" in v)
    mount = mounts[secret_vol["name"]]
    check(flag("tls-cert") == f"{mount}/tls.crt" and flag("tls-key") == f"{mount}/tls.key", "--tls-cert/--tls-key are not the mounted Secret's files")
    check(secret_vol["secret"]["secretName"] == cert["spec"]["secretName"], "the pods mount another Secret than the Certificate's")
    check(f"{svc['metadata']['name']}.{ns}.svc" in cert["spec"]["dnsNames"], "the Certificate does not cover the Service's name")
    check(mwc["metadata"]["annotations"].get("cert-manager.io/inject-ca-from") == f"{ns}/{cert['metadata']['name']}", "inject-ca-from does not name the Certificate")
    # Renewals keep the CA: the serving Certificate is issued by a CA Issuer whose
    # Secret is an isCA Certificate's.
    issuer = get("Issuer", cert["spec"]["issuerRef"]["name"])
    ca_secret = issuer["spec"].get("ca", {}).get("secretName")
    cas = [o for o in objs.values() if o["kind"] == "Certificate" and o["spec"].get("secretName") == ca_secret]
    check(cas and cas[0]["spec"].get("isCA") is True, "the serving Certificate is not issued by a CA of its own")
    check(c.get("lifecycle", {}).get("preStop") is not None, "the injector has no preStop (calls would be refused while its endpoints are withdrawn)")
    check_selectors(mwc, ns, problems)
    workloads = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
    images = {sidecar_of(o)[2]["image"] for o in load_all(args[1]) if o["kind"] in workloads}
    check(images == {c["image"]}, f"the injector runs {c['image']}, inject adds {images}")
    for w in mwc["webhooks"]:
        n = w["name"]
        check(w["failurePolicy"] == "Ignore", f"{n}: failurePolicy is not Ignore")
        check(w["sideEffects"] == "None", f"{n}: sideEffects is not None")
        check(w["admissionReviewVersions"] == ["v1"], f"{n}: not admission.k8s.io/v1")
        check(w.get("reinvocationPolicy") in ("IfNeeded", "Never"), f"{n}: no reinvocationPolicy")
        s = w["clientConfig"]["service"]
        check((s["name"], s["namespace"], s["path"], s["port"]) == (svc["metadata"]["name"], ns, "/mutate", sp["port"]), f"{n}: does not call the Service's /mutate")
        check(w["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}], f"{n}: rules are not pod CREATE")
        excluded = [e for e in w["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
        check(excluded and {"kube-system", ns} <= set(excluded[0]["values"]), f"{n}: kube-system and {ns} are not excluded")
    if problems:
        fail("k8s/injector:\n  " + "\n  ".join(problems))
    print(f"ok: k8s/injector fits together ({len(mwc['webhooks'])} webhooks, namespace {ns})")


def injector_tls(args):
    """injector-tls PORT SNI CA: an injector on 127.0.0.1:PORT, reached by the name SNI
    and trusted through CA alone (as the API server does with the webhook's
    caBundle), injects a Pod."""
    import ssl
    port, sni, ca = int(args[0]), args[1], args[2]
    review = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "k8s-checks", "operation": "CREATE", "namespace": "default",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "app-"},
                       "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 3000}]}]}},
        },
    }
    ctx = ssl.create_default_context(cafile=ca)
    deadline = time.time() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname=sni) as s:
                    body = json.dumps(review).encode()
                    s.sendall(b"POST /mutate HTTP/1.1\r\nHost: " + sni.encode() + b"\r\nConnection: close\r\n"
                              b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
            break
        except ConnectionRefusedError:
            if time.time() > deadline:
                fail(f"no injector on port {port}")
            time.sleep(0.2)
    head, _, body = data.partition(b"\r\n\r\n")
    response = json.loads(body)["response"]
    if b" 200 " not in head.split(b"\r\n")[0] or response.get("uid") != "k8s-checks" or response.get("patchType") != "JSONPatch":
        fail(f"the injector did not inject: {head[:80]!r} {response}")
    print(f"ok: the injector serves {sni} with make-certs.sh's certificate and injects a Pod")


COMMANDS = {
    "free-port": free_port, "preserved": preserved, "same-sidecar": same_sidecar,
    "check-sidecar": check_sidecar, "extract-rules": extract_rules, "load": load,
    "upstream": upstream, "load-async": load_async, "wait-http": wait_http, "wait-up": wait_up, "prometheus-scraped": prometheus_scraped,
    "dashboard-queries": dashboard_queries, "metric-names": metric_names,
    "crd-kinds-only": crd_kinds_only, "flatten-lists": flatten_lists,
    "injector-manifests": injector_manifests, "injector-tls": injector_tls,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        fail(f"usage: k8s_checks.py {'|'.join(COMMANDS)} ARGS")
    COMMANDS[sys.argv[1]](sys.argv[2:])

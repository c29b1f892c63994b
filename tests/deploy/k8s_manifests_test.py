#!/usr/bin/python3
"""deploy/k8s: every overlay renders with kubectl kustomize, every rendered
document type-checks against Kubernetes' API types (kubernetes-types + tsc
--strict), and the manifests say what the README promises (native sidecar,
gRPC probes, non-root, read-only root, named ports, the client's
environment, the standalone planner's replicas). Each check also rejects a
deliberately broken copy."""
import os
import re

import yaml

from deploy_checks import (check, copy_deploy, finish, k8s_typescript, kustomize, source_dir,
                           tsc)

OVERLAYS = {
    "k8s/base": {"Job", "Service", "NetworkPolicy"},
    "k8s/overlays/standalone": {"Namespace", "Service", "Deployment", "Job", "NetworkPolicy",
                                "PodDisruptionBudget"},
}


def render(deploy, overlay):
    code, text = kustomize(os.path.join(deploy, overlay))
    return (list(yaml.safe_load_all(text)) if code == 0 else None), text


def type_check(deploy, documents):
    source, why = k8s_typescript(documents)
    if source is None:
        return 1, why
    return tsc({"manifests.ts": source}, deploy)


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def containers(doc):
    spec = pod_spec(doc)
    return spec.get("initContainers", []) + spec["containers"]


def check_job_id(env_list):
    """KNAPFORMER_JOB_ID is namespace/name/uid of the Job, each from the
    downward API, defined before it (Kubernetes expands $(VAR) only from
    earlier variables)."""
    names = [e["name"] for e in env_list]
    by_name = {e["name"]: e for e in env_list}
    job_id = by_name.get("KNAPFORMER_JOB_ID", {})
    check(job_id.get("value") ==
          "$(KNAPFORMER_JOB_NAMESPACE)/$(KNAPFORMER_JOB_NAME)/$(KNAPFORMER_JOB_UID)",
          "base: the job id is namespace/name/uid, unique per cluster and per run")
    want = {"KNAPFORMER_JOB_NAMESPACE": "metadata.namespace",
            "KNAPFORMER_JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']",
            "KNAPFORMER_JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']"}
    for name, path in want.items():
        entry = by_name.get(name, {})
        check(entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == path and
              name in names and "KNAPFORMER_JOB_ID" in names and
              names.index(name) < names.index("KNAPFORMER_JOB_ID"),
              f"base: {name} comes from {path}, before KNAPFORMER_JOB_ID")


def image_problems(deploy, rendered):
    """Where the manifests and the image build disagree: the image every
    planner container runs must be the one deploy/docker/build.sh builds
    (its tag the Dockerfile's version label), run as the Dockerfile's user."""
    with open(os.path.join(deploy, "docker", "build.sh")) as f:
        built = re.search(r'^readonly IMAGE_DEFAULT="([^"]+)"', f.read(), re.M)
    with open(os.path.join(deploy, "docker", "Dockerfile")) as f:
        dockerfile = f.read()
    version = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', dockerfile)
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    if not (built and version and user):
        return ["build.sh names no IMAGE_DEFAULT, or the Dockerfile no version label or USER"]
    problems = []
    if built[1].rsplit(":", 1)[-1] != version[1]:
        problems.append(f"build.sh builds {built[1]}, the Dockerfile's version label is {version[1]}")
    for overlay, docs in rendered.items():
        for doc in docs:
            if doc["kind"] not in ("Job", "Deployment"):
                continue
            spec = pod_spec(doc)
            for c in containers(doc):
                if c["name"] != "planner":
                    continue
                if c["image"] != built[1]:
                    problems.append(f"{overlay} {doc['kind']} runs {c['image']}, build.sh builds {built[1]}")
                context = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
                if (str(context.get("runAsUser")), str(context.get("runAsGroup"))) != user.groups():
                    problems.append(f"{overlay} {doc['kind']} runs the planner as "
                                    f"{context.get('runAsUser')}:{context.get('runAsGroup')}, "
                                    f"the image as {user[1]}:{user[2]}")
    return problems


def replica_problems(docs):
    """Where the standalone overlay's planner is not replicas that survive a
    death and a rolling update: three replicas behind a headless Service
    that trainers name with dns:///, one pod disrupted at a time (rolling
    update and PodDisruptionBudget), and a termination grace longer than
    the planner's drain."""
    problems = []
    job = next(d for d in docs if d["kind"] == "Job")
    service = next(d for d in docs if d["kind"] == "Service")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    spec = deployment["spec"]
    labels = spec["template"]["metadata"]["labels"]
    if spec.get("replicas", 1) < 3:
        problems.append(f"the Deployment runs {spec.get('replicas', 1)} replicas, not 3")
    if service["spec"].get("clusterIP") != "None":
        problems.append("the Service is not headless (clusterIP: None): a ClusterIP pins each "
                        "client's connection to one replica")
    name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    port = service["spec"]["ports"][0]["port"]
    address = pod_spec(job)["containers"][0]["env"][0]
    if address != {"name": "KNAPFORMER_PLANNER_ADDRESS", "value": f"dns:///{name}:{port}"}:
        problems.append(f"trainers are given {address}, not dns:///{name}:{port}")
    strategy = spec.get("strategy", {})
    rolling = strategy.get("rollingUpdate", {})
    if (strategy.get("type") != "RollingUpdate" or rolling.get("maxUnavailable") != 1 or
            rolling.get("maxSurge") != 0):
        problems.append(f"the update strategy {strategy} may drain two replicas at once")
    if (len(budgets) != 1 or budgets[0]["spec"].get("selector", {}).get("matchLabels") != labels
            or budgets[0]["spec"].get("maxUnavailable") != 1 or
            budgets[0]["metadata"].get("namespace") != deployment["metadata"]["namespace"]):
        problems.append("no PodDisruptionBudget of the planner's pods with maxUnavailable 1")
    planner = next(c for c in pod_spec(deployment)["containers"] if c["name"] == "planner")
    grace_ms = next((int(a.split("=", 1)[1]) for a in planner["args"]
                     if a.startswith("--shutdown-grace-ms=")), 5000)
    termination = pod_spec(deployment).get("terminationGracePeriodSeconds", 30)
    if termination * 1000 <= grace_ms + 1000:
        problems.append(f"terminationGracePeriodSeconds {termination} does not leave the "
                        f"planner's drain ({grace_ms} ms) a second to exit")
    return problems


def hardening_problems(docs):
    """Where a rendered overlay gives its pods more than they need: a
    service-account token mounted, a planner container without a CPU limit
    (its solver pool is sized by the quota), a namespace without the
    restricted Pod Security label, or a NetworkPolicy peer that any pod can
    join by labelling itself (a namespaceSelector that selects every
    namespace)."""
    problems = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Job", "Deployment"):
            if pod_spec(doc).get("automountServiceAccountToken") is not False:
                problems.append(f"{kind} {name}: its pods mount a service-account token")
            for c in containers(doc):
                if c["name"] == "planner" and "cpu" not in c["resources"].get("limits", {}):
                    problems.append(f"{kind} {name}/planner: no CPU limit")
        if kind == "Namespace":
            labels = doc["metadata"].get("labels", {})
            if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
                problems.append(f"Namespace {name}: Pod Security 'restricted' is not enforced")
        if kind == "NetworkPolicy":
            for rule in doc["spec"].get("ingress", []):
                for peer in rule.get("from", []):
                    selector = peer.get("namespaceSelector")
                    if selector is not None and not selector.get("matchLabels"):
                        problems.append(f"NetworkPolicy {name}: a rule admits pods of every "
                                        f"namespace by their own labels: {peer}")
    return problems


def secret_mounts(doc, container):
    """Where `container` of `doc`'s pods sees each Secret: {mount path: secret name}."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod_spec(doc).get("volumes", [])
               if "secret" in v}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])
            if m["name"] in volumes}


def security_problems(docs):
    """Where the shared planner (the standalone overlay) trusts its callers:
    no TLS, or job tokens' keys and revocation list not from mounted
    Secrets, probes on the TLS port (the
    kubelet's speak no TLS), or trainers without a token from a Secret and
    the CA to verify the planner by."""
    problems = []
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    planner = next(c for c in containers(deployment) if c["name"] == "planner")
    args = dict(a.split("=", 1) for a in planner["args"] if a.startswith("--") and "=" in a)
    mounts = secret_mounts(deployment, planner)

    def from_secret(path):
        return any(path.startswith(m + "/") for m in mounts)

    if args.get("--auth") not in ("token", "mtls"):
        problems.append(f"planner: --auth is {args.get('--auth', 'none')}: any caller may act "
                        "as any job")
    if args.get("--auth") == "token":
        for flag in ("--auth-key-file", "--auth-revoked-file"):
            if not from_secret(args.get(flag, "")):
                problems.append(f"planner: {flag} is not in a mounted Secret")
    for flag in ("--tls-cert", "--tls-key"):
        if not from_secret(args.get(flag, "")):
            problems.append(f"planner: {flag} is not in a mounted Secret (plaintext gRPC)")
    health = args.get("--health-listen", "")
    health_port = int(health.rsplit(":", 1)[1]) if ":" in health else None
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = planner.get(probe, {}).get("grpc", {}).get("port")
        if port != health_port:
            problems.append(f"planner: the {probe} asks port {port}, not the plaintext health "
                            f"listener ({health or 'none'}): the kubelet speaks no TLS")
    job = next(d for d in docs if d["kind"] == "Job")
    trainer = pod_spec(job)["containers"][0]
    env = {e["name"]: e for e in trainer["env"]}
    if "secretKeyRef" not in env.get("KNAPFORMER_PLANNER_TOKEN", {}).get("valueFrom", {}):
        problems.append("trainer: KNAPFORMER_PLANNER_TOKEN does not come from a Secret")
    ca = env.get("KNAPFORMER_PLANNER_TLS_CA", {}).get("value", "")
    if not any(ca.startswith(m + "/") for m in secret_mounts(job, trainer)):
        problems.append(f"trainer: KNAPFORMER_PLANNER_TLS_CA ({ca or 'unset'}) is not in a "
                        "mounted Secret")
    return problems


def main():
    deploy = source_dir()
    rendered = {}
    for overlay, kinds in OVERLAYS.items():
        docs, text = render(deploy, overlay)
        check(docs is not None, f"kubectl kustomize {overlay}" + ("" if docs else f": {text}"))
        if docs is None:
            continue
        rendered[overlay] = docs
        check({d["kind"] for d in docs} == kinds, f"{overlay} renders {sorted(kinds)}")
        code, out = type_check(deploy, docs)
        check(code == 0, f"{overlay}: every document type-checks" + ("" if code == 0 else f"\n{out}"))
        for doc in docs:
            if doc["kind"] not in ("Job", "Deployment"):
                continue
            spec = pod_spec(doc)
            check(spec["securityContext"].get("runAsNonRoot") is True,
                  f"{overlay} {doc['kind']}: pods run as non-root")
            for c in containers(doc):
                check(c["securityContext"].get("readOnlyRootFilesystem") is True,
                      f"{overlay} {doc['kind']}/{c['name']}: read-only root filesystem")
                if c["name"] == "planner":
                    # The shared planner's probes ask its plaintext health port.
                    shared = overlay == "k8s/overlays/standalone"
                    ports = {"grpc", "metrics"} | ({"health"} if shared else set())
                    check({p["name"] for p in c["ports"]} == ports,
                          f"{overlay}: planner ports are named {', '.join(sorted(ports))}")
                    check(c["readinessProbe"]["grpc"] == {"port": 50052 if shared else 50051,
                                                          "service": "knapformer.v1.Planner"},
                          f"{overlay}: planner readiness is the gRPC health of the Planner service")
                    check("grpc" in c["livenessProbe"], f"{overlay}: planner liveness is gRPC")
                    check("cpu" in c["resources"]["requests"], f"{overlay}: planner requests CPU")

    if "k8s/base" in rendered:
        job = next(d for d in rendered["k8s/base"] if d["kind"] == "Job")
        sidecar = pod_spec(job)["initContainers"][0]
        check(sidecar["name"] == "planner" and sidecar.get("restartPolicy") == "Always",
              "base: the planner is a native sidecar (init container, restartPolicy Always)")
        env_list = pod_spec(job)["containers"][0]["env"]
        env = {e["name"] for e in env_list}
        check({"KNAPFORMER_PLANNER_ADDRESS", "KNAPFORMER_JOB_ID", "KNAPFORMER_GROUP_ID",
               "KNAPFORMER_PLANNER_DEADLINE_SECONDS"} <= env,
              "base: the trainer gets every variable client/environment.h reads")
        check_job_id(env_list)
        policy = next(d for d in rendered["k8s/base"] if d["kind"] == "NetworkPolicy")
        job_pods = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
        check(policy["spec"]["podSelector"]["matchLabels"] == job_pods,
              "base: the NetworkPolicy covers the Job's pods")
        rules = policy["spec"]["ingress"]
        check(any(r.get("from") == [{"podSelector": {"matchLabels": job_pods}}] and
                  "ports" not in r for r in rules),
              "base: the Job's pods reach each other (trainer traffic and the sidecar)")
        for r in rules:
            peers = r.get("from", [])
            check(peers and all("podSelector" in p for p in peers),
                  "base: every ingress rule names the pods it admits (none open to all)")
            if peers and peers[0]["podSelector"]["matchLabels"] != job_pods:
                check(r.get("ports") == [{"port": "metrics", "protocol": "TCP"}],
                      "base: pods outside the Job reach the metrics port only")
    if "k8s/overlays/standalone" in rendered:
        docs = rendered["k8s/overlays/standalone"]
        job = next(d for d in docs if d["kind"] == "Job")
        check("initContainers" not in pod_spec(job), "standalone: the Job has no sidecar")
        problems = replica_problems(docs)
        check(not problems, "standalone: 3 planner replicas behind a headless Service the "
              "trainers name (dns:///), disrupted one at a time, drained before SIGKILL" +
              "".join(f"\n  {p}" for p in problems))
        service = next(d for d in docs if d["kind"] == "Service")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        check(service["metadata"].get("namespace") == deployment["metadata"]["namespace"] and
              service["spec"]["selector"] ==
              deployment["spec"]["template"]["metadata"]["labels"],
              "standalone: the Service selects the planner Deployment in its namespace")
        policy = next(d for d in docs if d["kind"] == "NetworkPolicy"
                      and d["metadata"]["name"] == "knapformer-planner")
        check(policy["metadata"]["namespace"] == deployment["metadata"]["namespace"] and
              policy["spec"]["podSelector"]["matchLabels"] ==
              deployment["spec"]["template"]["metadata"]["labels"],
              "standalone: a NetworkPolicy covers the shared planner's pods")
        grpc_rules = [r for r in policy["spec"]["ingress"]
                      if {"port": "grpc", "protocol": "TCP"} in r.get("ports", [])]
        trainer_label = {"knapformer.io/trainer": "true"}
        clients = {"knapformer.io/planner-clients": "true"}
        check(len(grpc_rules) == 1 and grpc_rules[0]["from"] ==
              [{"namespaceSelector": {"matchLabels": clients},
                "podSelector": {"matchLabels": trainer_label}}],
              "standalone: only pods labelled knapformer.io/trainer, in namespaces labelled "
              "knapformer.io/planner-clients, reach the planner's gRPC")
        check(all("ports" in r for r in policy["spec"]["ingress"]),
              "standalone: no rule opens every port of the planner")
        check(trainer_label.items() <= job["spec"]["template"]["metadata"]["labels"].items(),
              "standalone: the training Job's pods carry the trainer label")
        problems = security_problems(docs)
        check(not problems, "standalone: TLS and job tokens from mounted Secrets, probes on the "
              "plaintext health port, trainers with a token and the CA from Secrets" +
              "".join(f"\n  {p}" for p in problems))
        for mistake, breaks, named in [
            ("--auth=none", lambda p: p["args"].remove("--auth=token"), "--auth is none"),
            ("no TLS", lambda p: p["args"].remove("--tls-cert=/etc/knapformer/tls/tls.crt"),
             "--tls-cert is not in a mounted Secret"),
            ("no revocation list",
             lambda p: p["args"].remove("--auth-revoked-file=/etc/knapformer/auth/revoked"),
             "--auth-revoked-file is not in a mounted Secret"),
            ("probes on the TLS port",
             lambda p: p["readinessProbe"]["grpc"].update(port=50051),
             "the readinessProbe asks port 50051"),
        ]:
            copy, _ = render(deploy, "k8s/overlays/standalone")
            planner = next(c for c in containers(next(d for d in copy
                                                      if d["kind"] == "Deployment"))
                           if c["name"] == "planner")
            breaks(planner)
            problems = security_problems(copy)
            check(any(named in p for p in problems), f"broken: {mistake} is rejected ({problems})")

    for overlay, docs in rendered.items():
        problems = hardening_problems(docs)
        check(not problems, f"{overlay}: no service-account token, CPU-limited planners, "
              "restricted namespaces, no NetworkPolicy peer chosen by its own labels" +
              "".join(f"\n  {p}" for p in problems))

    problems = image_problems(deploy, rendered)
    check(not problems, "the planner image the manifests run is the one deploy/docker builds, "
          "as its user" + "".join(f"\n  {p}" for p in problems))

    # Deliberately broken inputs must be rejected.
    docs, _ = render(deploy, "k8s/overlays/standalone")
    if docs:
        def deployment_of(d):
            return next(x for x in d if x["kind"] == "Deployment")

        def service_of(d):
            return next(x for x in d if x["kind"] == "Service")

        for mistake, breaks, named in [
            ("one replica", lambda d: deployment_of(d)["spec"].update(replicas=1), "1 replicas"),
            ("a ClusterIP Service", lambda d: service_of(d)["spec"].pop("clusterIP"),
             "not headless"),
            ("two drained at once",
             lambda d: deployment_of(d)["spec"]["strategy"]["rollingUpdate"].update(
                 maxUnavailable=2), "may drain two"),
            ("no budget", lambda d: d.remove(
                next(x for x in d if x["kind"] == "PodDisruptionBudget")), "PodDisruptionBudget"),
            ("SIGKILL before the drain ends",
             lambda d: pod_spec(deployment_of(d)).update(terminationGracePeriodSeconds=5),
             "terminationGracePeriodSeconds 5"),
            ("a host:port address",
             lambda d: pod_spec(next(x for x in d if x["kind"] == "Job"))["containers"][0]
             ["env"][0].update(value="knapformer-planner.knapformer-system.svc:50051"),
             "not dns:///"),
        ]:
            copy, _ = render(deploy, "k8s/overlays/standalone")
            breaks(copy)
            problems = replica_problems(copy)
            check(any(named in p for p in problems),
                  f"broken: {mistake} is named ({problems})")
    broken = copy_deploy(deploy)
    base = os.path.join(broken, "k8s", "base")
    with open(os.path.join(base, "kustomization.yaml"), "a") as f:
        f.write("  - no-such-file.yaml\n")
    code, _ = kustomize(base)
    check(code != 0, "broken: kustomize rejects a missing resource")
    with open(os.path.join(broken, "docker", "build.sh")) as f:
        script = f.read()
    with open(os.path.join(broken, "docker", "build.sh"), "w") as f:
        f.write(script.replace('IMAGE_DEFAULT="knapformer/planner:', 'IMAGE_DEFAULT="knapformer/planner:9'))
    problems = image_problems(broken, rendered)
    check(any("build.sh builds knapformer/planner:9" in p for p in problems),
          "broken: an image tag the manifests do not run is named")
    docs, _ = render(deploy, "k8s/base")
    if docs:
        def kind_of(d, kind):
            return next(x for x in d if x["kind"] == kind)

        def planner_of(d):
            return next(c for c in containers(kind_of(d, "Deployment")) if c["name"] == "planner")

        for mistake, breaks, named in [
            ("a token mounted",
             lambda d: pod_spec(kind_of(d, "Deployment")).pop("automountServiceAccountToken"),
             "mount a service-account token"),
            ("no CPU limit", lambda d: planner_of(d)["resources"]["limits"].pop("cpu"),
             "no CPU limit"),
            ("no Pod Security label",
             lambda d: kind_of(d, "Namespace")["metadata"].pop("labels"),
             "'restricted' is not enforced"),
            ("any namespace's self-labelled trainers",
             lambda d: kind_of(d, "NetworkPolicy")["spec"]["ingress"][0]["from"][0].update(
                 namespaceSelector={}),
             "admits pods of every namespace"),
        ]:
            copy, _ = render(deploy, "k8s/overlays/standalone")
            for doc in copy:
                if doc["kind"] == "NetworkPolicy" and doc["metadata"]["name"] != "knapformer-planner":
                    copy.remove(doc)  # kind_of finds the planner's
            breaks(copy)
            problems = hardening_problems(copy)
            check(any(named in p for p in problems),
                  f"broken: {mistake} is rejected ({problems})")
        job = next(d for d in docs if d["kind"] == "Job")
        pod_spec(job)["containers"][0]["imagePullPolicyy"] = "Always"
        code, out = type_check(deploy, docs)
        check(code != 0 and "imagePullPolicyy" in out, "broken: an unknown field fails the type check")
        docs, _ = render(deploy, "k8s/base")
        job = next(d for d in docs if d["kind"] == "Job")
        pod_spec(job)["initContainers"][0]["ports"][0]["containerPort"] = "fifty"
        code, out = type_check(deploy, docs)
        check(code != 0 and "not assignable to type 'number'" in out,
              "broken: a wrong type fails the type check")
        docs, _ = render(deploy, "k8s/base")
        del next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"]
        code, out = type_check(deploy, docs)
        check(code != 0 and "containers" in out,
              "broken: a missing required field fails the type check")
        docs, _ = render(deploy, "k8s/base")
        next(d for d in docs if d["kind"] == "NetworkPolicy")["spec"]["policyTypes"] = "Ingress"
        code, out = type_check(deploy, docs)
        check(code != 0 and "not assignable to type 'string[]'" in out,
              "broken: a NetworkPolicy field of the wrong type fails the type check")
        docs.append({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "x"}})
        code, out = type_check(deploy, docs)
        check(code != 0, "broken: a kind without a type fails the type check")
    finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""deploy/k8s: every overlay renders with kubectl kustomize, every rendered
document type-checks against Kubernetes' API types (kubernetes-types + tsc
--strict), and the manifests say what the README promises (native sidecar,
gRPC probes, non-root, read-only root, named ports, the client's
environment). Each check also rejects a deliberately broken copy."""
import os

import yaml

from deploy_checks import (check, copy_deploy, finish, k8s_typescript, kustomize, source_dir,
                           tsc)

OVERLAYS = {
    "k8s/base": {"Job", "Service"},
    "k8s/overlays/standalone": {"Namespace", "Service", "Deployment", "Job"},
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
                    check({p["name"] for p in c["ports"]} == {"grpc", "metrics"},
                          f"{overlay}: planner ports are named grpc and metrics")
                    check(c["readinessProbe"]["grpc"] == {"port": 50051,
                                                          "service": "knapformer.v1.Planner"},
                          f"{overlay}: planner readiness is the gRPC health of the Planner service")
                    check("grpc" in c["livenessProbe"], f"{overlay}: planner liveness is gRPC")
                    check("cpu" in c["resources"]["requests"], f"{overlay}: planner requests CPU")

    if "k8s/base" in rendered:
        job = next(d for d in rendered["k8s/base"] if d["kind"] == "Job")
        sidecar = pod_spec(job)["initContainers"][0]
        check(sidecar["name"] == "planner" and sidecar.get("restartPolicy") == "Always",
              "base: the planner is a native sidecar (init container, restartPolicy Always)")
        env = {e["name"] for e in pod_spec(job)["containers"][0]["env"]}
        check({"KNAPFORMER_PLANNER_ADDRESS", "KNAPFORMER_JOB_ID", "KNAPFORMER_GROUP_ID",
               "KNAPFORMER_PLANNER_DEADLINE_SECONDS"} <= env,
              "base: the trainer gets every variable client/environment.h reads")
    if "k8s/overlays/standalone" in rendered:
        docs = rendered["k8s/overlays/standalone"]
        job = next(d for d in docs if d["kind"] == "Job")
        check("initContainers" not in pod_spec(job), "standalone: the Job has no sidecar")
        address = pod_spec(job)["containers"][0]["env"][0]
        check(address["value"] == "knapformer-planner.knapformer-system.svc:50051",
              "standalone: trainers point at the shared planner Service")
        service = next(d for d in docs if d["kind"] == "Service")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        check(service["metadata"].get("namespace") == deployment["metadata"]["namespace"] and
              service["spec"]["selector"] ==
              deployment["spec"]["template"]["metadata"]["labels"],
              "standalone: the Service selects the planner Deployment in its namespace")

    # Deliberately broken inputs must be rejected.
    broken = copy_deploy(deploy)
    base = os.path.join(broken, "k8s", "base")
    with open(os.path.join(base, "kustomization.yaml"), "a") as f:
        f.write("  - no-such-file.yaml\n")
    code, _ = kustomize(base)
    check(code != 0, "broken: kustomize rejects a missing resource")
    docs, _ = render(deploy, "k8s/base")
    if docs:
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
        docs.append({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "x"}})
        code, out = type_check(deploy, docs)
        check(code != 0, "broken: a kind without a type fails the type check")
    finish()


if __name__ == "__main__":
    main()

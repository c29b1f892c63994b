"""Shared pieces of the deploy checks (tests/deploy/*_test.py).

Every check runs on the real files of the source tree (found through a
runfile's symlink) and is also run on a deliberately broken copy, which it
must reject: a check that cannot fail proves nothing.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

FAILURES = []


def source_dir(runfile="deploy/checks/package.json"):
    """The repository's deploy/ folder (runfiles are symlinks into it)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(runfile)))


def temp_dir():
    return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        FAILURES.append(what)


def finish():
    print(f"{len(FAILURES)} failures")
    sys.exit(1 if FAILURES else 0)


def run(argv, **kwargs):
    """(exit code, stdout + stderr), bounded."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=kwargs.pop("timeout", 120), **kwargs)
    return done.returncode, done.stdout


def tsc(sources, deploy):
    """Type-checks TypeScript `sources` ({name: text}) against the pinned npm
    packages; (exit code, output)."""
    modules = os.path.join(deploy, "checks", "node_modules")
    if not os.path.isdir(os.path.join(modules, "typescript")):
        return 1, f"{modules}: missing; run scripts/setup.sh (npm ci in deploy/checks)"
    work = temp_dir()
    os.symlink(modules, os.path.join(work, "node_modules"))
    for name, text in sources.items():
        with open(os.path.join(work, name), "w") as out:
            out.write(text)
    return run(["node", os.path.join(modules, "typescript", "bin", "tsc"), "--noEmit", "--strict",
                "--skipLibCheck", "--module", "esnext", "--moduleResolution", "bundler",
                "--target", "es2020", *sources.keys()], cwd=work)


# Kubernetes kinds the manifests may use, and their kubernetes-types module.
K8S_TYPES = {
    ("batch/v1", "Job"): ("batch_v1", "kubernetes-types/batch/v1"),
    ("apps/v1", "Deployment"): ("apps_v1", "kubernetes-types/apps/v1"),
    ("v1", "Service"): ("core_v1", "kubernetes-types/core/v1"),
    ("v1", "Namespace"): ("core_v1", "kubernetes-types/core/v1"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking_v1",
                                                "kubernetes-types/networking/v1"),
    ("policy/v1", "PodDisruptionBudget"): ("policy_v1", "kubernetes-types/policy/v1"),
}


def kustomize(directory):
    """(exit code, rendered YAML or the error)."""
    return run(["kubectl", "kustomize", directory])


def k8s_typescript(documents):
    """One typed constant per document; None and the reason for an unknown kind."""
    imports, body = {}, []
    for i, doc in enumerate(documents):
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key not in K8S_TYPES:
            return None, f"document {i}: no type for {key}"
        alias, module = K8S_TYPES[key]
        imports[alias] = module
        body.append(f"export const doc{i}: {alias}.{key[1]} = {json.dumps(doc, indent=2)};")
    head = [f"import type * as {a} from '{m}';" for a, m in sorted(imports.items())]
    return "\n".join(head + body) + "\n", ""


def dashboard_typescript(dashboard_json_text):
    return ("import type { Dashboard } from '@grafana/schema';\n"
            f"export const dashboard: Dashboard = {dashboard_json_text};\n")


def static_prometheus_config(deploy, target, scrape_interval=None):
    """The project's prometheus.yml with its Kubernetes discovery replaced by
    one static target carrying the labels discovery would give a planner pod
    (Debian's Prometheus is built without Kubernetes discovery). The
    relabelling and rules are the project's."""
    with open(os.path.join(deploy, "prometheus", "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    for scrape in config["scrape_configs"]:
        scrape.pop("kubernetes_sd_configs")
        scrape["static_configs"] = [{
            "targets": [target],
            "labels": {
                "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
                "__meta_kubernetes_pod_container_port_name": "metrics",
                "__meta_kubernetes_namespace": "ci",
                "__meta_kubernetes_pod_name": "planner-0",
            },
        }]
        if scrape_interval:
            scrape["scrape_interval"] = scrape_interval
    if scrape_interval:
        config["global"]["scrape_interval"] = scrape_interval
        config["global"]["evaluation_interval"] = scrape_interval
    config["rule_files"] = [os.path.join(deploy, "prometheus", f) for f in config["rule_files"]]
    return yaml.safe_dump(config)


def copy_deploy(deploy):
    """A writable copy of deploy/ (without node_modules) to break on purpose."""
    copy = os.path.join(temp_dir(), "deploy")
    shutil.copytree(deploy, copy, ignore=shutil.ignore_patterns("node_modules"))
    os.symlink(os.path.join(deploy, "checks", "node_modules"),
               os.path.join(copy, "checks", "node_modules"))
    return copy

#!/usr/bin/python3
"""deploy/grafana: the dashboard type-checks against @grafana/schema's
Dashboard (tsc --strict), every panel queries Prometheus for the selected
jobs, and it covers what the issue asks for. A deliberately broken copy
must fail the type check."""
import json
import os

from deploy_checks import check, dashboard_typescript, finish, source_dir, tsc

WANTED = {  # a metric (or recording rule) each group of panels must read
    "WIR": "knapformer_planner_wir_after_ratio",
    "max/mean": "max_over_mean_after",
    "planning latency": "knapformer_planner_planning_duration_seconds_bucket",
    "rendezvous wait": "knapformer_planner_rendezvous_wait_seconds_bucket",
    "errors": "knapformer_planner_requests_total",
    "bytes moved": "knapformer_planner_moved_bytes_total",
    "slow ranks": "knapformer_rank_speed",
}


def main():
    deploy = source_dir()
    path = os.path.join(deploy, "grafana", "knapformer-planner.json")
    with open(path) as f:
        text = f.read()
    code, out = tsc({"dashboard.ts": dashboard_typescript(text)}, deploy)
    check(code == 0, "the dashboard type-checks as @grafana/schema Dashboard" + ("" if code == 0 else f"\n{out}"))

    dashboard = json.loads(text)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    check(all(t.get("expr") for p in dashboard["panels"] for t in p["targets"]),
          "every panel target has a PromQL expression")
    check(all('job_id=~"$job_id"' in e for e in exprs), "every query filters by the job variable")
    # With planner replicas each series exists once per pod: a panel shows
    # one line per job (and group), aggregated over the replicas.
    per_pod = [e for e in exprs
               if not e.startswith(("sum by (", "max by (", "histogram_quantile(", "job_id:"))]
    check(not per_pod, f"every query aggregates over planner replicas (not: {per_pod})")
    check(len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids are unique")
    for what, metric in WANTED.items():
        check(any(metric in e for e in exprs), f"a panel shows {what}")

    for mistake, broken in [
        ("an unknown property", text.replace('"gridPos"', '"gridPoss"', 1)),
        ("a wrong type", text.replace('"title": "knapformer planner"', '"title": 7', 1)),
    ]:
        code, _ = tsc({"dashboard.ts": dashboard_typescript(broken)}, deploy)
        check(code != 0, f"broken: {mistake} fails the type check")
    finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""deploy/prometheus: promtool check rules, promtool test rules (the unit
tests of every recording rule and alert), and promtool check config of the
scrape config (its Kubernetes discovery swapped for a static target, which
Debian's Prometheus lacks). Each also rejects a deliberately broken copy."""
import os
import re

from deploy_checks import (check, copy_deploy, finish, run, source_dir,
                           static_prometheus_config, temp_dir)


def promtool(*args, cwd=None):
    return run(["promtool", *args], cwd=cwd)


def check_config(deploy):
    path = os.path.join(temp_dir(), "prometheus.yml")
    with open(path, "w") as f:
        f.write(static_prometheus_config(deploy, "127.0.0.1:9464"))
    return promtool("check", "config", path)


def main():
    deploy = source_dir()
    rules = os.path.join(deploy, "prometheus")
    code, out = promtool("check", "rules", "knapformer-rules.yml", cwd=rules)
    # Every rule of the file, as promtool counts them.
    with open(os.path.join(rules, "knapformer-rules.yml")) as f:
        written = sum(1 for line in f if re.match(r"\s*- (alert|record):", line))
    check(code == 0 and f"SUCCESS: {written} rules found" in out,
          f"promtool check rules ({written} rules)" + ("" if code == 0 else f"\n{out}"))
    code, out = promtool("test", "rules", "knapformer-rules.test.yml", cwd=rules)
    check(code == 0, "promtool test rules" + ("" if code == 0 else f"\n{out}"))
    code, out = check_config(deploy)
    check(code == 0, "promtool check config" + ("" if code == 0 else f"\n{out}"))

    broken = copy_deploy(deploy)
    broken_rules = os.path.join(broken, "prometheus")
    path = os.path.join(broken_rules, "knapformer-rules.yml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("max by (job_id) (knapformer_planner_max_over_mean_after_ratio)",
                             "max by (job_id) (knapformer_planner_max_over_mean_after_ratio"))
    code, _ = promtool("check", "rules", "knapformer-rules.yml", cwd=broken_rules)
    check(code != 0, "broken: check rules rejects a PromQL syntax error")

    with open(path, "w") as f:  # valid, but the alert threshold changes
        f.write(text.replace("> 1.10", "> 1.30"))
    code, out = promtool("test", "rules", "knapformer-rules.test.yml", cwd=broken_rules)
    check(code != 0 and "KnapformerImbalanceHigh" in out,
          "broken: test rules catches an alert that no longer fires")

    with open(os.path.join(broken_rules, "prometheus.yml"), "a") as f:
        f.write("    scrape_intervall: 5s\n")
    code, _ = check_config(broken)
    check(code != 0, "broken: check config rejects an unknown field")
    finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""One live test of the whole ops path on 127.0.0.1: the real planner
(`knapformer serve`) and a real Prometheus with the project's scrape config
(discovery swapped for a static target) and rules; a driver plans steps,
sends a refused request and lets a step time out; then every dashboard
query and every recording rule must return data, the counters must hold the
driven values, and the rendezvous-timeout alert must fire.

  live_prometheus_test.py KNAPFORMER_BINARY DRIVE_PLANNER_BINARY
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import yaml

from deploy_checks import check, finish, source_dir, static_prometheus_config, temp_dir

JOB = "live-job"
STEPS = 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.25)
    check(False, f"{what} within {seconds} s")
    return None


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode()
    except OSError:
        return None


def query(prometheus, expr):
    """The result vector of an instant query ([] for no data or an error)."""
    body = http_get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if body is None:
        return []
    answer = json.loads(body)
    return answer["data"]["result"] if answer.get("status") == "success" else []


def dashboard_queries(deploy):
    with open(os.path.join(deploy, "grafana", "knapformer-planner.json")) as f:
        dashboard = json.load(f)
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$job_id", JOB).replace("$__rate_interval", "1m")
            yield f"panel '{panel['title']}' {target['refId']}", expr


def recording_rules(deploy):
    with open(os.path.join(deploy, "prometheus", "knapformer-rules.yml")) as f:
        rules = yaml.safe_load(f)
    return [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]


def stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main():
    knapformer, drive = (os.path.abspath(p) for p in sys.argv[1:3])
    deploy = source_dir()
    work = temp_dir()
    processes = []
    try:
        port_file = os.path.join(work, "ports")
        planner = subprocess.Popen(
            [knapformer, "serve", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
             "--rendezvous-timeout-ms", "500", "--port-file", port_file],
            stdout=open(os.path.join(work, "planner.log"), "w"), stderr=subprocess.STDOUT)
        processes.append(planner)
        ports = wait_for("the planner writes its ports",
                         lambda: os.path.exists(port_file) and open(port_file).read().split(), 20)
        if not ports:
            return
        grpc_port, metrics_port = ports

        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(static_prometheus_config(deploy, f"127.0.0.1:{metrics_port}", "1s"))
        web = free_port()
        prometheus_url = f"http://127.0.0.1:{web}"
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
        processes.append(prometheus)
        if not wait_for("Prometheus is ready",
                        lambda: http_get(f"{prometheus_url}/-/ready") is not None, 30):
            print(open(os.path.join(work, "prometheus.log")).read())
            return

        def drive_planner(what):
            done = subprocess.run([drive, grpc_port, JOB, what], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=120)
            return done.returncode == 0, done.stdout
        ok, out = drive_planner(str(STEPS))
        check(ok, f"the driver planned {STEPS} steps" + ("" if ok else f": {out}"))
        # Prometheus must see the job's fault counters at 0 before the faults.
        wait_for("the job's counters are scraped",
                 lambda: query(prometheus_url, f'knapformer_planner_rendezvous_timeouts_total'
                                               f'{{job_id="{JOB}"}} == 0'), 30)
        ok, out = drive_planner("faults")
        check(ok, "the driver sent a refused request and a step that timed out" +
              ("" if ok else f": {out}"))

        check(wait_for("the planner is scraped as up",
                       lambda: query(prometheus_url, 'up{job="knapformer-planner"} == 1'), 30)
              is not None, "up{job=\"knapformer-planner\"} is 1")
        for name, expr in dashboard_queries(deploy):
            result = wait_for(f"{name} has data", lambda: query(prometheus_url, expr), 40)
            check(bool(result), f"{name}: {expr}")
        for record in recording_rules(deploy):
            result = wait_for(f"{record} has data",
                              lambda: query(prometheus_url, f'{record}{{job_id="{JOB}"}}'), 40)
            check(bool(result), f"recording rule {record}")

        steps = query(prometheus_url, f'knapformer_planner_steps_total{{job_id="{JOB}"}}')
        check(bool(steps) and float(steps[0]["value"][1]) == STEPS,
              f"steps_total says {STEPS} steps, scraped with job_id (not exported_job) "
              f"and the pod label from the relabelling: {steps}")
        check(bool(steps) and steps[0]["metric"].get("pod") == "planner-0",
              "the relabelling adds the pod label")
        refused = query(prometheus_url, f'knapformer_planner_requests_total{{job_id="{JOB}",'
                                        f'code="INVALID_ARGUMENT"}}')
        check(bool(refused) and float(refused[0]["value"][1]) == 1, "one refused request counted")

        def timeout_alert():
            body = http_get(f"{prometheus_url}/api/v1/alerts")
            alerts = json.loads(body)["data"]["alerts"] if body else []
            return [a for a in alerts if a["labels"]["alertname"] == "KnapformerRendezvousTimeouts"
                    and a["labels"].get("job_id") == JOB and a["state"] == "firing"]
        check(bool(wait_for("the rendezvous-timeout alert fires", timeout_alert, 30)),
              "KnapformerRendezvousTimeouts fires for the timed-out step")

        # The checker itself must be able to fail: a misspelled metric has no data.
        check(query(prometheus_url, f'knapformer_planner_stepz_total{{job_id="{JOB}"}}') == [],
              "broken: a query of a misspelled metric returns no data")
    finally:
        for process in reversed(processes):
            stop(process)
    finish()


if __name__ == "__main__":
    main()

"""The Python keywords of a planner that checks who may act as a job:
planner_token= (and KNAPFORMER_PLANNER_TOKEN) reach an embedded planner run
with auth="token"; a token is refused over plaintext off this machine unless
planner_mesh_tls= says a mesh encrypts; planner_tls= names bad input
precisely."""
import hashlib
import hmac
import os
import time

import pytest
import torch.distributed as dist

from knapformer.launch import run_world

KEY = "0123456789abcdef0123456789abcdef"


def job_token(job_id, token_id="0123456789abcdef"):
    """What `knapformer token --job JOB_ID --ttl 1h` prints for a key file
    holding KEY (server/job_token.h's format)."""
    mac = lambda text: hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()
    expires = int(time.time()) + 3600
    key_id = mac("knapformer key id")[:8]
    signed = mac(f"knapformer token v2\njob\n{expires}\n{key_id}\n{token_id}\n{job_id}")
    return f"kf2.job.{expires}.{key_id}.{token_id}.{signed}.{job_id}"


def token_world(rank, size, keys):
    import knapformer

    server = (knapformer.PlannerServer("127.0.0.1:0", auth="token", auth_key_file=keys)
              if rank == 0 else None)
    address = [server.address if server else None]
    dist.broadcast_object_list(address, src=0)
    sources = {}
    for name, token, mode in [("keyword", job_token("auth-job"), "group"),
                              ("keyword per-rank", job_token("auth-job"),
                               "per-rank"),
                              ("another job's", job_token("other"), "group"),
                              ("environment", None, "group")]:
        if token is None:
            os.environ["KNAPFORMER_PLANNER_TOKEN"] = job_token("auth-job")
        balancer = knapformer.SequenceBalancer("g1n2", planner_address=address[0],
                                               job_id="auth-job", planner_token=token,
                                               planner_mode=mode, planner_deadline=20)
        balancer.plan_routing([5 + rank, 3], 16)
        summary = balancer.get_routing_plan_summary()
        sources[name] = (summary["source"], summary.get("local_reason", ""))
    os.environ.pop("KNAPFORMER_PLANNER_TOKEN", None)
    dist.barrier()
    if server:
        server.shutdown(grace=1)
    return sources


def test_the_token_reaches_a_planner_that_checks_it(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    for sources in run_world(token_world, 2, str(keys)):
        assert sources["keyword"][0] == "planner service"
        assert sources["keyword per-rank"][0] == "planner service"
        assert sources["environment"][0] == "planner service"
        source, reason = sources["another job's"]
        assert source == "local planner" and "the token is for job 'other'" in reason, reason


def tls_world(rank, size, tls):
    import knapformer

    try:
        knapformer.SequenceBalancer("g1n2", planner_address="127.0.0.1:1", planner_tls=tls)
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "accepted"


@pytest.mark.parametrize("tls, text", [
    ({"ca": "/no/such/ca.pem"}, "planner_tls_ca: cannot read '/no/such/ca.pem'"),
    ({"cert": "/etc/hostname"}, "a client certificate needs its key"),
    ({"root": "/x"}, "planner_tls: needs a dict of PEM file paths with the keys ca, cert and key"),
    ("/x", "planner_tls: needs a dict"),
])
def test_bad_tls_settings_name_the_field(tls, text):
    for message in run_world(tls_world, 2, tls):
        assert text in message, message


def plaintext_world(rank, size, mesh):
    import knapformer

    try:
        knapformer.SequenceBalancer("g1n2", planner_address="planner.example:50051",
                                    job_id="j", planner_token=job_token("j"),
                                    planner_mesh_tls=mesh)
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "accepted"


def test_a_token_is_refused_in_clear_off_this_machine_unless_a_mesh_encrypts():
    for message in run_world(plaintext_world, 2, None):
        assert ("planner_token: the token would cross the network in clear to "
                "'planner.example:50051' (no TLS)") in message, message
    for message in run_world(plaintext_world, 2, True):
        assert message == "accepted", message

"""What `trillium cluster` starts (cluster/plan.py): ports, the cores split, the router's flags."""

from __future__ import annotations

import pytest

from trillium.cluster.plan import ClusterConfig, plan_replicas, router_argv


def _flag(argv: list[str] | tuple[str, ...], name: str) -> str:
    return argv[list(argv).index(name) + 1]


def test_replicas_get_their_own_ports_and_cores_and_the_engine_flags() -> None:
    config = ClusterConfig(
        replicas=2, policy="kv_aware", replica_port=9001, kv_events_port=6000, engine_args=("--kv-cache-gib", "0.1")
    )
    a, b = plan_replicas(config, cores=[0, 1, 2, 3])
    assert (a.url, b.url) == ("http://127.0.0.1:9001", "http://127.0.0.1:9002")
    assert (a.cores, b.cores) == ((0, 1), (2, 3))
    assert _flag(a.argv, "--num-threads") == "2" and _flag(b.argv, "--port") == "9002"
    assert _flag(b.argv, "--kv-events-endpoint") == "tcp://127.0.0.1:6001" and b.kv_events == "tcp://127.0.0.1:6001"
    assert a.argv[-2:] == ("--kv-cache-gib", "0.1")


def test_more_threads_than_cores_share_them_unpinned_and_a_wildcard_host_is_reached_on_loopback() -> None:
    config = ClusterConfig(replicas=3, host="0.0.0.0", num_threads=6, policy="round_robin")
    specs = plan_replicas(config, cores=[0, 1])
    assert all(s.cores is None and _flag(s.argv, "--num-threads") == "2" for s in specs)
    assert all("--kv-events-endpoint" not in s.argv for s in specs)  # only kv_aware publishes
    assert specs[0].url.startswith("http://127.0.0.1:") and config.url == "http://127.0.0.1:8000"


def test_the_router_checks_readiness_and_subscribes_to_every_replica_for_kv_aware() -> None:
    config = ClusterConfig(replicas=2, policy="kv_aware", router_port=7000)
    specs = plan_replicas(config, cores=[0, 1])
    argv = router_argv(config, specs, model="m", block_size=32)
    assert _flag(argv, "--health-check-endpoint") == "/health/ready"
    assert _flag(argv, "--policy") == "kv_aware" and _flag(argv, "--port") == "7000"
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    assert sources == [f"{s.url}={s.kv_events}" for s in specs]
    assert _flag(argv, "--kv-event-block-size") == "32" and _flag(argv, "--kv-event-model") == "m"
    plain = router_argv(ClusterConfig(policy="cache_aware"), specs, model="m", block_size=16)
    assert "--kv-event-source" not in plain


def test_the_routers_own_parser_takes_the_flags() -> None:
    """The flags are the installed vllm-router's (a renamed flag fails here, not at start-up)."""
    router_args = pytest.importorskip("vllm_router.router_args")
    import argparse

    config = ClusterConfig(replicas=2, policy="kv_aware")
    argv = router_argv(config, plan_replicas(config, cores=[0, 1]), model="m", block_size=16)
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert args.policy == "kv_aware" and args.health_check_endpoint == "/health/ready"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"replicas": 0}, "--replicas"),
        ({"policy": "fastest"}, "--policy"),
        ({"engine_args": ("--port", "1")}, "--port is set per replica"),
        ({"engine_args": ("--num-threads=4",)}, "--num-threads is set per replica"),
        ({"engine_args": ("--ssl-certfile", "c.pem")}, "--ssl-certfile: .*terminate TLS in front of the router"),
        ({"router_port": 8001}, "overlap"),
        ({"policy": "kv_aware", "kv_events_port": 8001, "replicas": 1}, "overlap"),
    ],
)
def test_bad_settings_are_refused_naming_the_flag(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ClusterConfig(**kwargs)

"""Command line: ``trillium serve``, ``trillium chat``, ``trillium usage``, ``trillium hash-key``."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from typing import TYPE_CHECKING

from trillium.cluster.plan import POLICIES
from trillium.config import KV_CACHE_DTYPES, PRECISIONS, REASONING_PARSERS, WEIGHT_FORMATS, EngineConfig

if TYPE_CHECKING:
    from trillium.server.tls import ServerTLS


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="GGUF file or Hugging Face directory (default: embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="weights, activations and KV dtype (auto: fp32 for quantized GGUF weights, else bf16 "
        "if the CPU has native bf16 math, else fp32)",
    )
    parser.add_argument(
        "--device",
        default=None,
        choices=["cpu", "cuda", "auto"],
        help="where the model runs (auto: cuda when a GPU is visible; default: $TRILLIUM_DEVICE, else cpu). "
        "On cuda the dtype defaults to bf16 and GGUF quantized weights are dequantized to it at load",
    )
    parser.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="cuda: run decode steps eagerly instead of replaying captured CUDA graphs",
    )
    parser.add_argument("--max-running", type=int, default=64, help="requests decoding at once")
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests waiting for a running slot before new ones get 503 + Retry-After (shared fairly by "
        "tenant: one under its fair share may still queue up to twice this)",
    )
    parser.add_argument("--max-tokens-per-step", type=int, default=2048, help="token budget of one step")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length limit (default: the model's)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache size in GiB")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument(
        "--weights",
        default="auto",
        choices=list(WEIGHT_FORMATS),
        help="auto: run a GGUF file's quantized weights with the quantized kernel where this CPU can "
        "(AVX2, AVX-512), with int16 activations under --precision auto, else exact; quantized: fp32 "
        "activations (exact); quantized-int16: activations rounded to int16 per block (near-exact, "
        "faster); quantized-int8: to int8 (approximate, as llama.cpp); dense: dequantize at load",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=list(PRECISIONS),
        help="auto: the fastest arithmetic measured to hold quality on this CPU (bench/quality.py); "
        "exact: fp32 everywhere, bit-faithful to Hugging Face",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=list(KV_CACHE_DTYPES),
        help="the KV cache's dtype, apart from the compute dtype (auto: the compute dtype; bf16 halves the "
        "bytes per token within the quality contract)",
    )
    parser.add_argument(
        "--no-prefix-cache",
        dest="enable_prefix_cache",
        action="store_false",
        help="disable reuse of cached KV for shared prompt prefixes",
    )
    parser.add_argument("--num-threads", type=int, default=None, help="compute threads (default: all cores)")
    parser.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='speculative decoding: n-gram prompt lookup with 5 drafts by default, "off" turns it off; '
        'e.g. \'{"method": "ngram", "num_speculative_tokens": 5, '
        '"prompt_lookup_max": 4}\' or \'{"method": "draft", "model": PATH, "num_speculative_tokens": 4}\' '
        "(off for a step once disable_by_batch_size requests run: measured at start-up unless given)",
    )


# ``trillium serve --max-*``: one flag per field of ``server.limits.InputLimits`` (its defaults and why).
_LIMIT_FLAGS = {
    "max_body_bytes": "request body size; larger is a 413 before it is read (default: 8 MiB)",
    "max_json_depth": "nesting depth of a JSON schema in a request (default: 64)",
    "max_messages": "chat messages in one request (default: 2048)",
    "max_prompt_chars": "prompt or message characters before tokenization, and token ids to detokenize "
    "(default: 16 x max-model-len, at least 65536)",
    "max_logit_bias": "logit_bias entries (default: 1024)",
    "max_stop_chars": "characters of all stop strings together (default: 4096)",
    "max_output_tokens": "n x max_tokens of one request (default: 4 x max-model-len)",
    "max_grammar_bytes": "size of a structured-output constraint as JSON (default: 262144)",
    "max_kv_tokens": "n x (prompt + max_tokens) of one request (default: the KV cache's size in tokens)",
    "max_prompts": "prompts in one completions request (default: 256)",
    "max_prompt_logprobs": "prompt logprob entries of one request: prompt tokens x (k + 1) x choices (default: 65536)",
}


def _limit_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input limits (a request over one is a 4xx naming the field)")
    for name, help in _LIMIT_FLAGS.items():
        group.add_argument("--" + name.replace("_", "-"), type=int, default=None, metavar="N", help=help)


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        cuda_graphs=args.cuda_graphs,
        max_running=args.max_running,
        max_waiting=args.max_waiting,
        max_tokens_per_step=args.max_tokens_per_step,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        block_size=args.block_size,
        num_threads=args.num_threads,
        served_model_name=getattr(args, "served_model_name", None),
        reasoning_parser=getattr(args, "reasoning_parser", None),
        enable_prefix_cache=args.enable_prefix_cache,
        kv_events_endpoint=getattr(args, "kv_events_endpoint", None),
        weights=args.weights,
        precision=args.precision,
        kv_cache_dtype=args.kv_cache_dtype,
        step_timeout_s=getattr(args, "step_timeout", 30.0),
        structured_strict_formats=getattr(args, "structured_strict_formats", False),
        **_speculation(getattr(args, "speculative_config", None)),
    )


def _server_tls(args: argparse.Namespace) -> ServerTLS | None:
    """``--ssl-*`` as a checked :class:`ServerTLS` (None without them). Raises ValueError
    (ConfigError: a file that does not load, named)."""
    from trillium.server.tls import ServerTLS

    if args.ssl_certfile is None and args.ssl_keyfile is None:
        if args.ssl_ca_certs is not None:
            raise ValueError("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile")
        return None
    if args.ssl_certfile is None or args.ssl_keyfile is None:
        raise ValueError("--ssl-certfile and --ssl-keyfile go together")
    tls = ServerTLS(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
    tls.check()
    return tls


def _speculation(flag: str | None) -> dict[str, str]:
    """``--speculative-config`` as EngineConfig's argument: not given, EngineConfig's default stands."""
    return {"speculative_config": flag} if flag is not None else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trillium", description="trillium LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    _engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None, help="model id clients use (default: from the model file)")
    serve.add_argument(
        "--reasoning-parser",
        default=None,
        choices=list(REASONING_PARSERS),
        help="split a thinking model's <think> section out of the answer: reasoning_content in chat "
        "completions, reasoning items in the Responses API (default: the whole output is content)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file with tenants, API key hashes, limits and the usage ledger "
        "(default: no keys, no limits, no ledger)",
    )
    serve.add_argument(
        "--kv-events-endpoint",
        default=None,
        metavar="tcp://HOST:PORT",
        help="publish prefix-cache events (vLLM's KV-event format) on a ZMQ PUB socket bound here, for "
        "vllm-router's kv_aware policy (needs trillium[cluster])",
    )
    serve.add_argument("--log-requests", action="store_true", help="print one JSON line per finished request (stderr)")
    tls_flags = serve.add_argument_group("TLS (HTTPS only; the files are read again on SIGHUP)")
    tls_flags.add_argument("--ssl-certfile", default=None, metavar="FILE", help="the server's certificate chain (PEM)")
    tls_flags.add_argument("--ssl-keyfile", default=None, metavar="FILE", help="its private key (PEM)")
    tls_flags.add_argument(
        "--ssl-ca-certs",
        default=None,
        metavar="FILE",
        help="CA certificates (PEM): clients must present a certificate signed by one (mutual TLS)",
    )
    serve.add_argument(
        "--step-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a model step running longer than max(this, 10x the recent p99 step) turns /health to 503",
    )
    serve.add_argument(
        "--structured-strict-formats",
        action="store_true",
        help="refuse a JSON schema naming a format the server does not know (400); by default such a "
        "format is ignored and named in the response's X-Trillium-Warning header",
    )
    _limit_args(serve)

    usage = sub.add_parser("usage", help="per-tenant usage totals from the ledger")
    usage.add_argument("--config", default=None, metavar="FILE", help="the server's config (its ledger path)")
    usage.add_argument("--ledger", default=None, metavar="PATH", help="the ledger file itself")
    usage.add_argument("--since", default=None, help="start: 24h, 7d, an ISO date or date-time, or unix seconds")
    usage.add_argument("--until", default=None, help="end (default: now); same forms as --since")
    usage.add_argument("--tenant", default=None, help="only this tenant")
    usage.add_argument("--json", action="store_true", help="print JSON instead of a table")

    hash_key = sub.add_parser("hash-key", help="print a new API key and its hash for the config file")
    hash_key.add_argument("--stdin", action="store_true", help="hash the keys read from stdin, one per line")

    inspect = sub.add_parser("inspect", help="what a model file is and what serving it takes, without loading it")
    inspect.add_argument(
        "path", nargs="?", default=None, help="a .gguf file or Hugging Face directory (default: embedded)"
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")

    chat = sub.add_parser("chat", help="chat with the model in the terminal")
    _engine_args(chat)
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.7)

    cluster = sub.add_parser(
        "cluster",
        help="N replicas of `trillium serve` behind vllm-router, as one service (needs trillium[cluster])",
        description="Starts --replicas `trillium serve` processes (the cores split between them) and vllm-router "
        "in front; restarts a replica that dies and puts it back in the router; SIGINT/SIGTERM drains and "
        "stops everything. Every other flag is passed to each `trillium serve` as given (e.g. --kv-cache-gib).",
    )
    cluster.add_argument("--replicas", type=int, default=2)
    cluster.add_argument(
        "--policy",
        default="cache_aware",
        choices=POLICIES,
        help="the router's policy; kv_aware routes on the replicas' published prefix-cache contents",
    )
    cluster.add_argument("--host", default="127.0.0.1", help="where the router and the replicas listen")
    cluster.add_argument("--router-port", type=int, default=8000, help="the one URL clients use")
    cluster.add_argument("--replica-port", type=int, default=8001, help="replica i listens on this + i")
    cluster.add_argument("--kv-events-port", type=int, default=5557, help="kv_aware: replica i publishes on this + i")
    cluster.add_argument("--router-metrics-port", type=int, default=29000, help="the router's Prometheus exporter")
    cluster.add_argument(
        "--num-threads", type=int, default=None, help="compute threads across all replicas (default: all cores)"
    )
    cluster.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long to wait for the replicas to exit before SIGKILL (each replica "
        "itself finishes in-flight requests for up to 10 s)",
    )
    cluster.add_argument(
        "--router-args",
        default="",
        metavar="'FLAGS'",
        help="more vllm-router flags, quoted as one argument (e.g. '--router-temperature 0.1')",
    )
    cluster.add_argument(
        "--router-log-level", default="warning", choices=["debug", "info", "warning", "error"], help="vllm-router's"
    )

    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "cluster":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "cluster":
        logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # its probes, every second
        from trillium.cluster.plan import ClusterConfig
        from trillium.cluster.supervise import run_cluster

        try:
            cluster_config = ClusterConfig(
                replicas=args.replicas,
                policy=args.policy,
                host=args.host,
                router_port=args.router_port,
                replica_port=args.replica_port,
                kv_events_port=args.kv_events_port,
                router_metrics_port=args.router_metrics_port,
                num_threads=args.num_threads,
                engine_args=tuple(rest),
                router_log_level=args.router_log_level,
                router_args=tuple(shlex.split(args.router_args)),
            )
        except ValueError as exc:
            parser.error(str(exc))
        if args.drain_timeout < 0:
            parser.error(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
        return run_cluster(cluster_config, drain_timeout_s=args.drain_timeout)
    if args.command == "serve":
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from trillium.metering.tenants import load_access_config
        from trillium.serve import run_server
        from trillium.server.limits import InputLimits

        try:
            config = _engine_config(args)
            access = load_access_config(args.config) if args.config else None
            limits = InputLimits(
                **{name: getattr(args, name) for name in _LIMIT_FLAGS if getattr(args, name) is not None}
            )
            tls = _server_tls(args)
        except ValueError as exc:
            parser.error(str(exc))
        from trillium.cluster.kv_events import EndpointError

        try:
            return run_server(
                config,
                host=args.host,
                port=args.port,
                access=access,
                log_requests=args.log_requests,
                limits=limits,
                config_path=args.config,
                tls=tls,
            )
        except EndpointError as exc:
            parser.error(str(exc))
    if args.command == "usage":
        from trillium.metering.commands import print_usage

        try:
            return print_usage(
                ledger=args.ledger,
                config=args.config,
                since=args.since,
                until=args.until,
                tenant=args.tenant,
                as_json=args.json,
            )
        except (ValueError, OSError) as exc:
            parser.error(str(exc))
    if args.command == "inspect":
        from trillium.model_info import print_report
        from trillium.models import default_model_path

        try:
            return print_report(args.path or default_model_path(), args.json)
        except (ValueError, OSError) as exc:
            parser.error(str(exc))
    if args.command == "hash-key":
        from trillium.metering.commands import print_key_hashes

        return print_key_hashes(from_stdin=args.stdin)
    if args.command == "chat":
        logging.basicConfig(level="WARNING")
        from trillium.chat import run_chat

        return run_chat(
            _engine_config(args), system=args.system, max_tokens=args.max_tokens, temperature=args.temperature
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())

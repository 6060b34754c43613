"""The ``haltwire`` command.

Exit codes: 0 success; 1 a runtime failure (or, for the operator commands, a refused request
or a tampered audit log); 2 bad usage or bad configuration (the message names the file, the key
and the problem), or an upstream that does not start; 3 the control plane cannot be reached.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from haltwire import __version__, logs
from haltwire.config import ConfigError
from haltwire.errors import unwrapped
from haltwire.identity import token_sha256

EXIT_RUNTIME = 1
EXIT_USAGE = 2
#: How long a gateway that did not start waits for its server to answer what it holds and stop.
STOP_GRACE_S = 5.0


def _gateway(args: argparse.Namespace) -> int:
    from haltwire.access_log import logged
    from haltwire.gateway import ControlUnreachable, UpstreamError, WrongRole, create_app, redis_pool_size
    from haltwire.gateway.config import load_config
    from haltwire.listener import check_descriptors
    from haltwire.serve import CannotListen, fast_loop, listen, owned_server
    from haltwire.store.idempotency import IdempotencyUnavailable

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"haltwire gateway: {exc}", file=sys.stderr)
        return EXIT_USAGE
    host = args.host or config.gateway.host
    port = args.port if args.port is not None else config.gateway.port
    # The bind host is a name the gateway is served under (haltwire.gateway.hosts).
    config = config.model_copy(
        update={"gateway": config.gateway.model_copy(update={"host": host, "port": port})}
    )
    try:
        app = create_app(config)
    except ConfigError as exc:  # control.token_env names an unset variable
        print(f"haltwire gateway: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        redis_pool = redis_pool_size(config) if config.counters.backend == "redis" else 0
        check_descriptors([config.gateway.listener], redis_pool)
        sock = listen(host, port)  # before the upstreams start: a taken port is said at once
    except (CannotListen, ConfigError) as exc:
        print(f"haltwire gateway: {exc}", file=sys.stderr)
        return EXIT_RUNTIME

    async def run() -> int:
        # The app is served while it starts: /healthz answers at once, /readyz 503 until its
        # upstreams and stops are in, and a call waits for them. Nothing at the gateway reads
        # X-Forwarded-*: its access log names the peer that connected, and no request pays for
        # uvicorn's check of them.
        server = owned_server(logged(app, args.access_log), config.gateway.listener, forwarded=False)
        served = anyio.Event()
        status = 0
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                await server.serve([sock])
                served.set()
                if not app.started:
                    tg.cancel_scope.cancel()  # stopped while it was starting: no more start

            async def stop_on_signals() -> None:
                # SIGINT or SIGTERM: the server stops (at once on a second one), then the app.
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        app.start_state.given_up()  # calls waiting for a start under way: 503
                        server.force_exit = server.should_exit
                        server.should_exit = True

            tg.start_soon(stop_on_signals)
            tg.start_soon(serve)
            async with AsyncExitStack() as stack:  # the app's, closed once the server has ended
                try:
                    await app.start(stack)
                except (UpstreamError, ControlUnreachable, WrongRole, IdempotencyUnavailable) as exc:
                    print(f"haltwire gateway: {exc}", file=sys.stderr)
                    status = EXIT_USAGE
                    server.should_exit = True  # after answering the calls that waited (503)
                    with anyio.move_on_after(STOP_GRACE_S):
                        await served.wait()
                    tg.cancel_scope.cancel()
                    return status
                names = ", ".join(u.name for u in config.upstreams)
                print(
                    f"haltwire gateway {__version__} on http://{host}:{port}/mcp "
                    f"(upstreams: {names}; counters: {config.counters.backend})",
                    file=sys.stderr,
                    flush=True,
                )
                await served.wait()
            tg.cancel_scope.cancel()  # the signal receiver
        return status

    try:
        return anyio.run(run, backend_options=fast_loop())
    except KeyboardInterrupt:
        return 0


def _executor(args: argparse.Namespace) -> int:
    from haltwire.executor import ExecutorMisconfigured, UpstreamError, WrongRole, run_executor
    from haltwire.gateway.config import load_config
    from haltwire.serve import fast_loop

    try:
        config = load_config(args.config)
        if config.executor is None:
            raise ConfigError(f"{args.config}: executor: the section is missing (the executor's token)")
        assert config.control is not None  # the config requires it with [executor]
        control_url = ", ".join(config.control.urls)
        config.executor.resolve_token()
        for n, upstream in enumerate(config.upstreams):
            upstream.resolve_headers(f"upstreams[{n}]")  # a headers_env variable not set: exit 2
    except ConfigError as exc:
        print(f"haltwire executor: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> None:
        # The executor's own failures come out of its task group as themselves.
        with unwrapped():
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_signals, tg.cancel_scope)
                await tg.start(run_executor, config)
                names = ", ".join(u.name for u in config.upstreams)
                print(
                    f"haltwire executor {__version__}: committing intents through {names} "
                    f"(control plane {control_url})",
                    file=sys.stderr,
                    flush=True,
                )

    try:
        anyio.run(run, backend_options=fast_loop())
    except KeyboardInterrupt:
        return 0
    except (UpstreamError, ExecutorMisconfigured, WrongRole) as exc:
        print(f"haltwire executor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


async def _cancel_on_signals(scope: anyio.CancelScope) -> None:
    """SIGINT or SIGTERM: cancel ``scope``, a clean stop (exit 0). The executor stopped mid-intent
    leaves it as a crash would, and the next executor takes it up from there (issue 5)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


def _control(args: argparse.Namespace) -> int:
    from haltwire.control import load_control_config
    from haltwire.control.stores import audit_key
    from haltwire.control_processes import serve_agents, serve_main
    from haltwire.listener import check_descriptors
    from haltwire.serve import CannotListen, fast_loop, listen
    from haltwire.store.registry import RegistryUnavailable

    try:
        config = load_control_config(args.config)
        if config.leases is not None:
            config.leases.lease_keys()  # a secret_env naming an unset variable is a usage error
        if config.broker is not None and not config.broker.generate:
            from haltwire.control.broker import BrokerKeys

            BrokerKeys.from_config(config.broker)  # so is a broker key that cannot be loaded
        audit_key(config)  # and an audit key that is missing or short (made here when it may be)
    except ConfigError as exc:
        print(f"haltwire control: {exc}", file=sys.stderr)
        return EXIT_USAGE
    section = config.control
    if args.agents_process is not None:  # the child of the command below
        try:
            check_descriptors([section.agent_listener])
            anyio.run(serve_agents, config, args.agents_process, args.access_log, backend_options=fast_loop())
        except KeyboardInterrupt:
            return 0
        except (ConfigError, RegistryUnavailable) as exc:
            print(f"haltwire control (agents' listener): {exc}", file=sys.stderr)
            return EXIT_RUNTIME
        return 0
    host = args.host or section.host
    port = args.port if args.port is not None else section.port
    admin_host = args.host or section.admin_host or section.host
    admin_port = args.admin_port if args.admin_port is not None else section.admin_port_for(port)
    enforcement_host = args.host or section.enforcement_host or section.host
    enforcement_port = (
        args.enforcement_port if args.enforcement_port is not None else section.enforcement_port_for(port)
    )
    try:
        # Two processes, each with its own open-file limit (the child inherits the raised one).
        check_descriptors([section.agent_listener])
        check_descriptors([section.admin_listener, section.enforcement_listener])
        sock = listen(host, port)
        admin_sock = listen(admin_host, admin_port)
        enforcement_sock = listen(enforcement_host, enforcement_port)
    except (CannotListen, ConfigError) as exc:
        print(f"haltwire control: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    admin_port = admin_sock.getsockname()[1]
    enforcement_port = enforcement_sock.getsockname()[1]

    def announce() -> None:  # once the registry is open: a URL printed is a URL served
        print(
            f"haltwire control {__version__} on http://{host}:{port} for agents, "
            f"http://{admin_host}:{admin_port} for operators, "
            f"http://{enforcement_host}:{enforcement_port} for gateways and executors "
            f"(registry: {config.registry.backend})",
            file=sys.stderr,
            flush=True,
        )

    try:
        anyio.run(
            serve_main,
            config,
            Path(args.config),
            sock,
            admin_sock,
            enforcement_sock,
            logs.argv(args),
            announce,
            backend_options=fast_loop(),
        )
    except KeyboardInterrupt:
        return 0
    except RegistryUnavailable as exc:
        print(f"haltwire control: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return 0


def _egress(args: argparse.Namespace) -> int:
    from haltwire.egress import EgressProxy, load_config
    from haltwire.listener import ListenerLimits, check_descriptors
    from haltwire.serve import CannotListen, fast_loop, listen
    from haltwire.watch import ControlUnreachable, WrongRole

    try:
        config = load_config(args.config)
        config.control.resolve_token()  # a token_env naming an unset variable is a usage error
        proxy = EgressProxy(config)  # and so is a lease secret that is missing or short
    except ConfigError as exc:
        print(f"haltwire egress: {exc}", file=sys.stderr)
        return EXIT_USAGE
    host = args.host or config.egress.host
    try:
        # Each client connection holds two descriptors: its own and its target's.
        check_descriptors([ListenerLimits(max_connections=2 * config.egress.max_connections)])
        # Before the control plane is asked anything: a taken port is said at once.
        sock = listen(host, args.port if args.port is not None else config.egress.port)
    except (CannotListen, ConfigError) as exc:
        print(f"haltwire egress: {exc}", file=sys.stderr)
        return EXIT_RUNTIME

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            port = await tg.start(proxy.run, sock)
            print(
                f"haltwire egress {__version__} on http://{host}:{port} "
                f"(control plane {', '.join(config.control.urls)})",
                file=sys.stderr,
                flush=True,
            )
            # SIGINT or SIGTERM: every connection is closed and the proxy ends.
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break

    try:
        with unwrapped():
            anyio.run(run, backend_options=fast_loop())
    except KeyboardInterrupt:
        return 0
    except WrongRole as exc:
        print(f"haltwire egress: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ControlUnreachable as exc:
        print(f"haltwire egress: {exc}", file=sys.stderr)
        return 3
    return 0


def _hash_token(args: argparse.Namespace) -> int:
    print(token_sha256(args.token))
    return 0


def _suspend(args: argparse.Namespace) -> int:
    from haltwire.killswitch_command import suspend

    return suspend(args)


def _demo(args: argparse.Namespace) -> int:
    if args.demo == "upstream":
        from haltwire.demo.upstream import main as upstream_main

        upstream_main(args.rest)
        return 0
    if args.demo == "refunds":
        from haltwire.demo.refunds import main as refunds_main

        return refunds_main(args.rest)
    from haltwire.demo.loop import main as loop_main

    status: int = loop_main(args.rest)
    return status


def _drill(args: argparse.Namespace) -> int:
    from haltwire.drill.command import run

    return run(args)


def _tripwires_test(args: argparse.Namespace) -> int:
    from haltwire.gateway.config import load_config
    from haltwire.tripwires.backtest import main as backtest

    try:
        rules = load_config(args.config).tripwires
    except ConfigError as exc:
        print(f"haltwire tripwires test: {exc}", file=sys.stderr)
        return 2
    return backtest(args, rules)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haltwire", description="Stops AI agents that must stop.")
    parser.add_argument("--version", action="version", version=f"haltwire {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True)

    gw = sub.add_parser("gateway", help="run the MCP gateway")
    logs.add_arguments(gw)
    gw.add_argument("--config", required=True, help="the gateway's TOML config file")
    gw.add_argument("--host", default=None, help="override gateway.host")
    gw.add_argument("--port", type=int, default=None, help="override gateway.port")
    gw.set_defaults(func=_gateway)

    ctl = sub.add_parser("control", help="run the control plane (stop registry, audit log, watch)")
    logs.add_arguments(ctl)
    ctl.add_argument("--config", required=True, help="the control plane's TOML config file")
    ctl.add_argument("--host", default=None, help="override control.host")
    ctl.add_argument("--port", type=int, default=None, help="override control.port")
    ctl.add_argument("--admin-port", type=int, default=None, help="override control.admin_port")
    ctl.add_argument("--enforcement-port", type=int, default=None, help="override control.enforcement_port")
    ctl.add_argument("--agents-process", default=None, help=argparse.SUPPRESS)
    ctl.set_defaults(func=_control)

    ex = sub.add_parser("executor", help="run the executor: it commits the intents of irreversible tools")
    logs.add_arguments(ex)
    ex.add_argument("--config", required=True, help="the gateway's TOML config file, with [executor]")
    ex.set_defaults(func=_executor)

    eg = sub.add_parser("egress", help="run the egress proxy: a run's network traffic, cut when it is stopped")
    logs.add_arguments(eg)
    eg.add_argument("--config", required=True, help="the egress proxy's TOML config file")
    eg.add_argument("--host", default=None, help="override egress.host")
    eg.add_argument("--port", type=int, default=None, help="override egress.port")
    eg.set_defaults(func=_egress)

    ht = sub.add_parser("hash-token", help="print the SHA-256 of a token, for token_sha256 in the config")
    ht.add_argument("token")
    ht.set_defaults(func=_hash_token)

    for name, verb in (("suspend", "add identities to"), ("unsuspend", "remove identities from")):
        sp = sub.add_parser(name, help=f"{verb} the kill-switch file (written atomically)")
        sp.add_argument("agents", nargs="+", metavar="AGENT")
        where = sp.add_mutually_exclusive_group(required=True)
        where.add_argument("--config", help="the gateway's TOML config: its gateway.suspended_file")
        where.add_argument("--file", help="the kill-switch file itself (relative to the working directory)")
        sp.set_defaults(func=_suspend)

    tw = sub.add_parser("tripwires", help="per-call tripwires: backtest rules on call logs")
    tws = tw.add_subparsers(dest="tripwires_command", required=True)
    t = tws.add_parser("test", help="replay call logs ([call_log]) through the config's [[tripwires]]")
    t.add_argument("--config", required=True, help="the gateway's TOML config file, with [[tripwires]]")
    t.add_argument("--log", required=True, action="append", help="a call log (repeat, oldest first)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.add_argument("--expect-same", action="store_true", help="exit 1 if the firings differ from the log's")
    t.set_defaults(func=_tripwires_test)

    from haltwire.control.operator import add_parsers
    from haltwire.up import add_parsers as add_up_parsers

    add_parsers(sub)
    add_up_parsers(sub)

    dr = sub.add_parser("drill", help="stop canary agents at every rung; measure the time to the last side effect")
    dr.add_argument("--embedded", action="store_true", help="drill a stack of its own (the embedded default)")
    dr.add_argument("--reps", type=int, default=5, help="stops per rung (default 5)")
    dr.add_argument(
        "--rungs",
        default="sdk,gateway,model,broker,egress,executor,fail_closed",
        help="the rungs, comma-separated (default: all)",
    )
    dr.add_argument("--json", action="store_true", help="print the figures as JSON")
    dr.add_argument("--html", type=Path, default=None, metavar="FILE", help="write a self-contained HTML report")
    from haltwire.drill import add_running_stack_arguments  # light: argparse only

    add_running_stack_arguments(dr)
    dr.add_argument("--seed", type=int, default=None, help="seed the random moments of the stops")
    # Tests: break the gateway rung on purpose (a gateway without [control] nor [leases], or none).
    dr.add_argument("--break", dest="broken", choices=["gateway-without-control", "no-gateway"], help=argparse.SUPPRESS)
    dr.set_defaults(func=_drill)

    demo = sub.add_parser(
        "demo",
        help="run a demo: 'loop' (the seed's scenarios), 'refunds' (the refund incident) or 'upstream'",
    )
    demo.add_argument("demo", choices=["loop", "refunds", "upstream"])
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if hasattr(args, "log_format"):  # a server command (haltwire.logs.add_arguments)
        logs.configure_from(args)
    else:
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    sys.exit(args.func(args))

"""Who may import whom (docs/architecture.md, "Layers"), checked on the source.

Imports go one way: HTTP -> rules -> the process's state -> ``store/``; the gateway, the
executor and the runtime SDK share only the small modules at the package root and
``upstreams/``; nothing imports the control plane's routes but the package that serves them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from import_graph import SRC, cycles, graph, imports, imports_of_test_files, modules

GRAPH = graph()

#: The control plane's rules and state: no HTTP framework in them. (``operator`` is the operator
#: CLI, a client of the API over HTTP, not part of the served plane.)
CONTROL_RULES = [
    m
    for m in GRAPH
    if m.startswith("haltwire.control.")
    and not m.startswith("haltwire.control.routes")
    and m != "haltwire.control.operator"
]
#: What a web framework is; rules must not import any of it.
HTTP = ("starlette", "sse_starlette", "fastapi", "httpx2", "aiohttp", "uvicorn")

#: Modules allowed past 450 lines, and why (none today).
LONG_MODULES: dict[str, str] = {}


def _third_party(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_no_module_imports_itself_back_through_others() -> None:
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    # The check above could pass by finding nothing at all: show it finds a planted circle.
    pkg = tmp_path / "haltwire"
    (pkg / "control").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "control" / "__init__.py").write_text("")
    (pkg / "control" / "app.py").write_text("from haltwire.control.runs import x\n")
    (pkg / "control" / "runs.py").write_text("def f():\n    from haltwire.control import app\n")
    assert cycles(graph(tmp_path)) == [["haltwire.control.app", "haltwire.control.runs"]]


@pytest.mark.parametrize("module", sorted(CONTROL_RULES))
def test_control_rules_know_nothing_of_http(module: str) -> None:
    path = modules()[module]
    assert _third_party(path) & set(HTTP) == set()
    assert not any(t.startswith("haltwire.control.routes") for t in GRAPH[module]), "rules import no route"


def test_nothing_imports_the_routes_but_the_control_package_and_the_routes() -> None:
    users = {
        m
        for m, targets in GRAPH.items()
        if any(t.startswith("haltwire.control.routes") for t in targets)
        and not m.startswith("haltwire.control.routes")
    }
    assert users == {"haltwire.control"}


def test_the_gateway_imports_no_store_but_its_counters_and_idempotency_records() -> None:
    for module, targets in GRAPH.items():
        if not module.startswith("haltwire.gateway"):
            continue
        stores = {t for t in targets if t.startswith("haltwire.store")}
        # (and the Redis client those two share, ``haltwire.store.redis``)
        mine = ("haltwire.store.counters", "haltwire.store.idempotency", "haltwire.store.redis")
        allowed = {t for t in stores if t.startswith(mine)}
        assert stores == allowed, module
        assert not any(t.startswith("haltwire.control") for t in targets), module


@pytest.mark.parametrize("package", ["haltwire.runtime", "haltwire.executor"])
def test_the_runtime_and_the_executor_use_no_gateway_or_control_plane_internals(package: str) -> None:
    for module, targets in GRAPH.items():
        if not module.startswith(package):
            continue
        # The executor reads the gateway's config file, so it reads its schema; nothing else.
        bad = {
            t
            for t in targets
            if t.startswith(("haltwire.gateway", "haltwire.control", "haltwire.store"))
            and t != "haltwire.gateway.config"
        }
        assert bad == set(), module


#: The egress proxy's rules and state (``haltwire.egress``): no HTTP parser, socket or web
#: framework in them; ``proxy``, ``relay`` and ``server`` are its HTTP edge and process.
EGRESS_RULES = [
    "haltwire.egress.profiles",
    "haltwire.egress.auth",
    "haltwire.egress.sni",
    "haltwire.egress.config",
    "haltwire.egress.connections",
]


def test_the_egress_proxy_uses_no_gateway_control_plane_or_store_internals() -> None:
    # It shares with the gateway only the package root's modules (leasecheck, watch, tokens, ...).
    assert any(m.startswith("haltwire.egress.") for m in GRAPH)
    for module, targets in GRAPH.items():
        if not module.startswith("haltwire.egress"):
            continue
        bad = {
            t
            for t in targets
            if t.startswith(
                ("haltwire.gateway", "haltwire.control", "haltwire.store", "haltwire.runtime", "haltwire.executor")
            )
        }
        assert bad == set(), module


@pytest.mark.parametrize("module", EGRESS_RULES)
def test_the_egress_rules_know_nothing_of_http(module: str) -> None:
    assert _third_party(modules()[module]) & {*HTTP, "h11"} == set()
    assert not GRAPH[module] & {"haltwire.egress.proxy", "haltwire.egress.relay", "haltwire.egress.server"}


def test_the_drill_is_a_client_of_the_other_processes() -> None:
    # Like the demos: the runtime SDK, the demos' process helpers, the package root's small modules.
    assert any(m.startswith("haltwire.drill.") for m in GRAPH)
    internals = ("haltwire.gateway", "haltwire.control", "haltwire.store", "haltwire.executor", "haltwire.egress")
    for module, targets in GRAPH.items():
        if module.startswith("haltwire.drill"):
            assert {t for t in targets if t.startswith(internals)} == set(), module


def test_haltwire_up_is_a_client_of_the_other_processes() -> None:
    # It starts them as processes and talks to them over HTTP and MCP: no internals of theirs.
    assert any(m.startswith("haltwire.up.") for m in GRAPH)
    internals = ("haltwire.gateway", "haltwire.control", "haltwire.store", "haltwire.executor", "haltwire.egress")
    for module, targets in GRAPH.items():
        if module.startswith("haltwire.up"):
            assert {t for t in targets if t.startswith(internals)} == set(), module


def test_the_store_imports_no_process() -> None:
    for module, targets in GRAPH.items():
        if module.startswith("haltwire.store"):
            bad = {
                t
                for t in targets
                if t.startswith(("haltwire.control", "haltwire.gateway", "haltwire.executor", "haltwire.runtime"))
            }
            assert bad == set(), module


def test_a_rule_module_is_not_imported_by_the_state_it_works_on() -> None:
    # plane.py is state: the rules take it, it never calls them.
    rules = {f"haltwire.control.{m}" for m in ("access", "stops", "runs", "credentials", "intents", "reports")}
    assert GRAPH["haltwire.control.plane"] & rules == set()


def test_no_module_is_over_450_lines() -> None:
    long = {
        name: len(path.read_text().splitlines())
        for name, path in modules().items()
        if len(path.read_text().splitlines()) > 450 and name not in LONG_MODULES
    }
    assert long == {}


def test_the_graph_sees_imports_inside_functions() -> None:
    # cli.py imports each command's package inside its handler (start-up time): those count.
    known = modules()
    targets = {t for t, _ in imports("haltwire.cli", SRC / "haltwire" / "cli.py", known)}
    assert "haltwire.control" in targets


def test_no_test_file_imports_another() -> None:
    # Shared test helpers live in helper modules (stops_harness.py, runs_harness.py, ...), so a
    # test file can change without breaking the tests of another.
    assert imports_of_test_files() == []


def test_the_test_file_check_finds_an_import_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("import test_b\n")
    (tmp_path / "helper.py").write_text("def f():\n    from test_c import x\n")
    (tmp_path / "test_d.py").write_text("from helper import f\nimport testing\n")
    assert imports_of_test_files(tmp_path) == [("helper.py", 2, "test_c"), ("test_a.py", 1, "test_b")]

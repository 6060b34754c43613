"""Helpers that hold the control plane's answers to its OpenAPI document: ``conforms`` checks one
response, ``schemathesis`` runs the fuzzer's CLI against a live control plane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jsonschema_rs
import pytest

from control_harness import TOKEN
from haltwire.control.routes import document

#: ``--max-examples`` (fuzzed cases per operation) of the schemathesis tests: a short run by
#: default, and the soak variant's (``-m soak``) longer one.
SCHEMATHESIS_EXAMPLES = [
    pytest.param("4", id="4-examples"),
    pytest.param("10", id="10-examples", marks=pytest.mark.soak),
]

#: The schemathesis 4 checks the run applies (the CLI names them so).
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"

# A 200 from /v1/watch never ends: schemathesis reads an event stream until it has
# max-stream-events events or the request timeout passes. A `since` at or past the newest
# revision sends no event, so each such case costs one timeout: the watch gets the coverage
# phase (boundary values, bad values, missing parts) but no random fuzzing.
CONFIG = """
[[operations]]
include-path = "/v1/watch"
request-timeout = 2.0
max-stream-events = 1
phases.fuzzing.enabled = false

[phases.stateful]
max-steps = 4
generation.max-examples = 10
"""


def conforms(response: httpx2.Response, method: str, path: str) -> Any:
    """Assert ``response`` is documented for this operation and matches its schema; its body."""
    doc = document()
    documented = doc["paths"][path][method]["responses"]
    assert str(response.status_code) in documented, (method, path, response.status_code, response.text)
    content = documented[str(response.status_code)]["content"]
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type in content, (method, path, media_type)
    if media_type != "application/json":
        return None
    body = response.json()
    validate(content[media_type]["schema"], body)
    return body


def validate(schema: dict[str, Any], instance: Any) -> None:
    # The component refs resolve against a root that carries the components.
    root = {**schema, "components": document()["components"]}
    jsonschema_rs.Draft202012Validator(root).validate(instance)


async def schemathesis(tmp_path: Path, base_url: str, role: str, *args: str) -> tuple[int, str]:
    """Run the schemathesis CLI against a live control plane: its exit code and output."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color", "run"),
        *("--url", base_url, "--header", f"Authorization: Bearer {TOKEN[role]}", "--checks", CHECKS),
        *("--request-timeout", "10", "--generation-database", "none", *args),
    ]
    done = await anyio.run_process(command, cwd=tmp_path, check=False, stderr=subprocess.STDOUT)
    return done.returncode, done.stdout.decode(errors="replace")

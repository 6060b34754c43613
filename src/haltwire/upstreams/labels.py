"""Tool labels: how far a call to a tool can be taken back once it has started.

- ``cancellable``: reads only; cutting it off loses nothing.
- ``bounded``: it may change something, but repeating it or cutting it off does no further harm.
- ``irreversible``: it changes something for good (a refund, an email); a call cut off at its
  deadline may or may not have happened.

A tool's label comes from the upstream's ``labels`` table in the config, else from the
upstream's MCP tool annotations when ``trust_annotations`` is on, else it is
``irreversible``: an upstream whose word is not trusted cannot talk its way into a weaker
label. Annotations are read with the MCP spec's defaults (``readOnlyHint`` false,
``destructiveHint`` true, ``idempotentHint`` false), so a tool that says nothing is
``irreversible`` too.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcp.types import ToolAnnotations

from haltwire.config import Label
from haltwire.meta import LABEL_META

__all__ = ["LABEL_META", "Label", "from_annotations", "label_of", "unknown_tools"]



def from_annotations(annotations: ToolAnnotations | None) -> Label:
    """The label an upstream's annotations claim, with the spec's defaults for missing hints."""
    a = annotations or ToolAnnotations()
    if a.read_only_hint is True:
        return "cancellable"
    destructive = a.destructive_hint is not False
    idempotent = a.idempotent_hint is True
    if destructive and not idempotent:
        return "irreversible"
    return "bounded"


def label_of(
    tool: str,
    annotations: ToolAnnotations | None,
    *,
    configured: Mapping[str, Label],
    trust_annotations: bool,
) -> Label:
    """One tool's label: the config's, else the trusted annotations', else ``irreversible``."""
    label = configured.get(tool)
    if label is not None:
        return label
    if trust_annotations:
        return from_annotations(annotations)
    return "irreversible"


def unknown_tools(configured: Mapping[str, Label], listed: set[str]) -> list[str]:
    """The configured tool names the upstream does not list (a start-up error)."""
    return sorted(name for name in configured if name not in listed)

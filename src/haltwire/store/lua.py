"""Redis Lua scripts, kept as ``.lua`` files beside the module that runs them."""

from __future__ import annotations

from importlib.resources import files


def lua_script(package: str, name: str) -> str:
    """The text of script ``name`` in ``package``; read through importlib.resources so it also
    works from a zip or wheel install, not only from a source tree."""
    return files(package).joinpath(name).read_text(encoding="utf-8")

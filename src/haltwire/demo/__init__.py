"""Demos: a demo upstream MCP server, a scripted agent, and the scenarios of ``haltwire demo``."""

"""Tripwires: automated detectors, measured outside the model, that stop work through the same
stop API as operators (role ``tripwire``).

Per-call rules (``rules``: steps, money through tools, rates, policy hits, repetition, content
signals) run in the gateway (``engine``), on the gateway's counter stores; when one trips the
gateway refuses at once and ``writer`` writes the stop to the control plane.

``detectors``: content signals on tool output (the ``Detector`` interface, the built-in
detector, the adapter for a model-based one).
"""

"""Tripwires: automated detectors measured outside the model that stop a run.

``detectors``: content signals on tool output (the ``Detector`` interface, the built-in
detector, the adapter for a model-based one).
"""

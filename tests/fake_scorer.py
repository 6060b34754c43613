"""A stand-in for a model-based prompt-injection classifier (no model can run in tests).

The only fake in tests/test_detectors.py: it scores by a keyword where a real adapter would
run a model, so ``load_detector("fake_scorer:...")`` exercises the adapter point end to end.
"""

from __future__ import annotations

from haltwire.tripwires.detectors import ScoreThreshold


def score(text: str) -> float:
    """1.0 when the text says "pwned", else 0.1."""
    return 1.0 if "pwned" in text.lower() else 0.1


def FakeGuard() -> ScoreThreshold:  # a factory, named as a user's class would be
    return ScoreThreshold(score, threshold=0.5, name="fake-guard", chunk_chars=64)


#: An instance, usable as a spec without being called.
GUARD = FakeGuard()
#: Not a detector: load_detector must refuse it.
NOT_A_DETECTOR = 42


def broken_factory() -> ScoreThreshold:
    raise RuntimeError("model weights not found")

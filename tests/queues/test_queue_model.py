"""The queue core against a plain model of Kestrel's semantics (tests/support/queue_model.py):
random sequences of sets, gets, reliable reads, flushes, deletes, reader creation, expiry,
limits, disconnects, restarts and kill -9 on a real server, every reply and every reader's
stats compared.  CI runs a bounded number of sequences; ``scripts/queue-model`` the long run."""

from __future__ import annotations

import os

import queue_model

#: Sequences per CI run (about two minutes on a loaded machine); KESTRELD_MODEL_EXAMPLES overrides.
EXAMPLES = int(os.environ.get("KESTRELD_MODEL_EXAMPLES", "20"))


def test_queue_core_matches_the_model():
    runs, steps = queue_model.run(EXAMPLES, steps=40)
    print(f"model-based test: {runs} sequences, {steps} steps checked")
    assert runs >= EXAMPLES

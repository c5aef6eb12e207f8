"""The short CI version of bench/faults.py: randomised kill -9 trials must converge.

The embedded and HTTP scenarios run in CI as test_sync's crash tests; here the teammates
scenario (two clones indexing into one workspace at once, one killed) runs one trial,
and all three run under `-m slow`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "faults.py"


def faults(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH), "--no-json", *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_concurrent_teammates_killed_at_random_converge() -> None:
    out = faults("--trials", "1", "--files", "80", "--kills", "2", "--scenarios", "teammates",
                 "--seed", "1")
    assert "trials / converged: 1 / 1" in out
    assert "teammates trial 0: " in out and " 0 kills" not in out  # a kill happened


@pytest.mark.slow
def test_every_scenario_killed_at_random_converges() -> None:
    out = faults("--trials", "2", "--files", "300", "--kills", "3")
    assert "trials / converged: 6 / 6" in out

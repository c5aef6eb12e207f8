"""The `codeveil` command run in the test's own process with click's CliRunner: the same
command code, without a Python start-up and the imports of the index stack each call.

For tests about what a command does with files, not about the process around it (exit
codes and one-line errors of a real process, signals, concurrency stay in test_cli and
the tests that start processes).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from click.testing import CliRunner

from retrieval.faces.cli import main as cli_main


def run_in_process(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`codeveil ARGS` in `cwd` with the hashing embedder (and `env`), as `tests.test_cli.run`
    runs it in a subprocess; the result has the same fields."""
    runner = CliRunner(env={"CODEVEIL_EMBEDDER": "hashing", **env})
    with contextlib.chdir(cwd):
        result = runner.invoke(cli_main, args, catch_exceptions=False)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)

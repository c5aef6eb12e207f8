"""Import statements binding a name to the file that defines it (retrieval.agent.imports)."""

from __future__ import annotations

import pytest

from retrieval.agent.imports import binds_to_definition

DEFINING = {"src/pkg/retry.py", "web/lib/util.ts", "internal/clock/clock.go"}


@pytest.mark.parametrize(("rel", "language", "text", "bound"), [
    ("src/pkg/sub/use.py", "python", "from ..retry import backoff\n", True),
    ("src/pkg/sub/use.py", "python", "from ...retry import backoff\n", False),
    ("app/use.py", "python", "from pkg import retry\nretry.backoff(1)\n", True),
    ("app/use.py", "python", "from pkg import retry\nbackoff(1)\n", False),
    ("app/use.py", "python", "from pkg.retry import (\n    other,\n    backoff as b,\n)\n",
     True),
    ("app/use.py", "python", "import pkg.retry\npkg.retry.backoff(1)\n", True),
    ("app/use.py", "python", "from pkg.other import backoff\n", False),
    ("web/app/a.js", "javascript", "const { backoff } = require('../lib/util');\n", True),
    ("web/app/a.js", "javascript", "const { backoff } = require('lib/util');\n", False),
    ("web/lib/b.ts", "typescript", "import type { backoff } from './util.js';\n", True),
    ("cmd/run.go", "go", 'package main\n\nimport c "example.com/x/internal/clock"\n\n'
     "func f() { c.backoff() }\n", True),
    ("cmd/run.go", "go", 'package main\n\nimport "example.com/x/internal/clock"\n\n'
     "func f() { backoff() }\n", False),
    ("internal/clock/other.go", "go", "package clock\n\nfunc f() { backoff() }\n", True),
    ("lib/x.rb", "ruby", "require 'retry'\nbackoff\n", False),
])
def test_imports_bind_a_name_to_its_defining_file(rel: str, language: str, text: str,
                                                  bound: bool) -> None:
    assert binds_to_definition(rel, text, language, "backoff", DEFINING) is bound

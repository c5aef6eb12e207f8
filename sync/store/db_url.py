"""Database URLs as `--store` takes them: telling one from a data dir, and writing one
where it may be seen (logs, errors) without its password. Imports nothing optional."""

from __future__ import annotations

import os
import re

URL_SCHEMES = ("postgresql://", "postgres://")

_PASSWORD_IN_URL = re.compile(r"(://[^:/@?#]*:)[^@/?#]*@")
_PASSWORD_PARAM = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def is_database_url(spec: str | os.PathLike[str]) -> bool:
    """Whether a store spec names a PostgreSQL database (else it is a data dir)."""
    return isinstance(spec, str) and spec.startswith(URL_SCHEMES)


def mask_url(url: str) -> str:
    """`url` with its password, in either place a URL may carry one, replaced by ***."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", url))

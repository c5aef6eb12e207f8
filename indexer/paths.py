"""Where codeveil keeps its files outside a repo. One function per place, each with an
environment override, so tests (and users) can redirect them."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    """User cache dir (embedding cache shared by all repos). Override: CODEVEIL_CACHE_DIR."""
    env = os.environ.get("CODEVEIL_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("codeveil"))


def config_dir() -> Path:
    """User config dir (workspace keys). Override: CODEVEIL_CONFIG_DIR."""
    env = os.environ.get("CODEVEIL_CONFIG_DIR")
    return Path(env) if env else Path(platformdirs.user_config_dir("codeveil"))

"""Shared fixtures. No test touches the real home: config and cache dirs are redirected."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from indexer.embedder import HashingEmbedder, SentenceTransformerEmbedder

pytest_plugins = ["tests.server_fixtures", "tests.pg_fixtures"]


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Keys go to a fresh config dir per test; the embedding cache is shared per run
    (it is keyed by content, so sharing it across tests changes no result, only speed)."""
    monkeypatch.setenv("CODEVEIL_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("CODEVEIL_CACHE_DIR", str(_shared_cache(tmp_path_factory)))
    monkeypatch.delenv("CODEVEIL_KEY", raising=False)
    monkeypatch.delenv("CODEVEIL_TOKEN", raising=False)


_CACHE: list[Path] = []


def _shared_cache(factory: pytest.TempPathFactory) -> Path:
    if not _CACHE:
        _CACHE.append(factory.mktemp("cache"))
    return _CACHE[0]


@pytest.fixture(scope="session")
def real_embedder() -> SentenceTransformerEmbedder:
    """The real all-MiniLM-L6-v2, loaded once per test run."""
    model = SentenceTransformerEmbedder()
    model.embed(["warm up"])
    return model


@pytest.fixture
def hashing_embedder() -> HashingEmbedder:
    return HashingEmbedder()


SAMPLE_FILES = {
    "net/upload.py": '''
        """Uploading files to the storage service."""
        import time


        class Uploader:
            """Sends files and retries failed uploads with exponential backoff."""

            def __init__(self, client, retries=5):
                self.client = client
                self.retries = retries

            def upload(self, path):
                delay = 0.5
                for attempt in range(self.retries):
                    try:
                        return self.client.put(path)
                    except ConnectionError:
                        time.sleep(delay)
                        delay *= 2
                raise RuntimeError("upload failed after retries")
        ''',
    "auth/password.py": '''
        import hashlib
        import hmac
        import os


        def hash_password(password: str) -> bytes:
            """Derive a salted password hash with PBKDF2."""
            salt = os.urandom(16)
            return salt + hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 200_000)


        def verify_password(password: str, stored: bytes) -> bool:
            salt, digest = stored[:16], stored[16:]
            candidate = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 200_000)
            return hmac.compare_digest(candidate, digest)
        ''',
    "web/routes.js": '''
        const express = require("express");
        const router = express.Router();

        // Render the shopping cart with the total price including tax.
        function cartTotal(items, taxRate) {
          let total = 0;
          for (const item of items) {
            total += item.price * item.quantity;
          }
          return total * (1 + taxRate);
        }

        router.get("/cart", (req, res) => {
          res.json({ total: cartTotal(req.session.items, 0.2) });
        });

        module.exports = router;
        ''',
    "geo/distance.go": '''
        package geo

        import "math"

        // Haversine returns the great-circle distance in kilometres between two points.
        func Haversine(lat1, lon1, lat2, lon2 float64) float64 {
            const r = 6371.0
            dLat := (lat2 - lat1) * math.Pi / 180
            dLon := (lon2 - lon1) * math.Pi / 180
            a := math.Sin(dLat/2)*math.Sin(dLat/2) +
                math.Cos(lat1*math.Pi/180)*math.Cos(lat2*math.Pi/180)*math.Sin(dLon/2)*math.Sin(dLon/2)
            return 2 * r * math.Asin(math.Sqrt(a))
        }
        ''',
    "docs/README.md": '''
        # Sample project

        ## Install

        Run the installer script and add the binary to your PATH.

        ## Configuration

        Settings live in a TOML file in the user's config directory.
        ''',
}


def write_repo(root: Path, files: dict[str, str] | None = None) -> Path:
    """Write a small multi-language repo under `root`."""
    for rel, body in (files or SAMPLE_FILES).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip("\n"))
    return root


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    return write_repo(tmp_path / "repo")


def codeveil_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for running the `codeveil` command in a subprocess of a test."""
    env = dict(os.environ)
    env.update(extra or {})
    return env

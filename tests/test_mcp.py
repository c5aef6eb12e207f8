"""The MCP server, driven by the SDK's own client over stdio against a real subprocess."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import codeveil_env, write_repo

ROOT = Path(__file__).resolve().parent.parent


def _params(repo: Path, tmp: Path) -> StdioServerParameters:
    env = codeveil_env({
        "CODEVEIL_EMBEDDER": "hashing",  # the system around the model is under test here
        "CODEVEIL_CONFIG_DIR": str(tmp / "config"),
        "CODEVEIL_CACHE_DIR": str(tmp / "cache"),
        "PYTHONPATH": str(ROOT),
    })
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "retrieval.cli", "mcp", "-C", str(repo)], env=env)


async def _session_run(repo: Path, tmp: Path, steps) -> None:
    with anyio.fail_after(120):
        async with stdio_client(_params(repo, tmp)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await steps(session)


def test_tools_through_a_client_session(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo")

    async def steps(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"search", "index_status", "sync_index"}
        assert "group" in tools["search"].input_schema["properties"]

        # Before any sync there is no index: a clear tool error, not a crash.
        early = await session.call_tool("search", {"query": "password hash"})
        assert early.is_error
        assert "codeveil index" in early.content[0].text or "no codeveil" in \
            early.content[0].text

        synced = await session.call_tool("sync_index", {})
        assert not synced.is_error
        assert synced.structured_content["files_changed"] == 5

        status = await session.call_tool("index_status", {})
        assert status.structured_content["files"] == 5
        assert status.structured_content["chunks"] > 0

        found = await session.call_tool(
            "search", {"query": "verify_password compare digest", "k": 3})
        hits = found.structured_content["hits"]
        assert hits[0]["path"] == "auth/password.py"
        assert "verify_password" in hits[0]["text"]
        chunks = status.structured_content["chunks"]
        assert found.structured_content["index"] == {
            "partial": False, "chunks": chunks, "chunks_with_vectors": chunks}

        files = await session.call_tool(
            "search", {"query": "retry failed uploads with backoff", "k": 5, "group": "file"})
        paths = [h["path"] for h in files.structured_content["hits"]]
        assert paths[0] == "net/upload.py"
        assert len(paths) == len(set(paths))  # one hit per file

        only_js = await session.call_tool(
            "search", {"query": "cart total", "k": 5, "path": "web/*"})
        assert {h["path"] for h in only_js.structured_content["hits"]} == {"web/routes.js"}

        assert "kind" in tools["search"].input_schema["properties"]
        docs = await session.call_tool(
            "search", {"query": "install configuration settings", "k": 5, "kind": "docs"})
        assert [(h["path"], h["kind"]) for h in docs.structured_content["hits"]] == [
            ("docs/README.md", "docs")]
        code = await session.call_tool(
            "search", {"query": "install configuration settings", "k": 10, "kind": "code"})
        assert code.structured_content["hits"]
        assert {h["kind"] for h in code.structured_content["hits"]} == {"code"}

        # Bad arguments are tool errors with a message, and the server lives on.
        unknown = await session.call_tool("search", {"query": "x", "kind": "sources"})
        assert unknown.is_error and "unknown kind 'sources'" in unknown.content[0].text
        bad = await session.call_tool("search", {"query": "x", "group": "module"})
        assert bad.is_error
        empty = await session.call_tool("search", {"query": "  "})
        assert empty.is_error and "empty" in empty.content[0].text

        # An edit, a sync through the tool, and the search sees the new code.
        (repo / "net" / "upload.py").write_text(
            "def resumable_chunked_transfer(stream):\n    return stream.read()\n")
        again = await session.call_tool("sync_index", {})
        assert again.structured_content["files_changed"] == 1
        fresh = await session.call_tool(
            "search", {"query": "resumable_chunked_transfer", "k": 1, "group": "symbol"})
        top = fresh.structured_content["hits"][0]
        assert top["path"] == "net/upload.py" and not top["stale"]
        assert "resumable_chunked_transfer" in top["symbol"]

    anyio.run(_session_run, repo, tmp_path, steps)


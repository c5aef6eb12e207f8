"""The MCP server, driven by the SDK's own client over stdio against a real subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
                                 args=["-m", "retrieval", "mcp", "-C", str(repo)], env=env)


async def _session_run(repo: Path, tmp: Path, steps) -> None:
    with anyio.fail_after(120):
        async with stdio_client(_params(repo, tmp)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await steps(session)


async def _built(session: ClientSession) -> Any:
    """index_status once the background builder has finished (polled)."""
    for _ in range(600):
        status = await session.call_tool("index_status", {})
        builder = status.structured_content["builder"]
        if not builder["running"] and builder.get("state") == "done":
            return status
        await anyio.sleep(0.1)
    raise AssertionError(f"the vector builder did not finish: {builder}")


def test_tools_through_a_client_session(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo")

    async def steps(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"search", "index_status", "sync_index", "definition",
                              "outline", "references", "grep"}
        assert "group" in tools["search"].input_schema["properties"]

        # Before any sync there is no index: a clear tool error, not a crash.
        early = await session.call_tool("search", {"query": "password hash"})
        assert early.is_error
        assert "codeveil index" in early.content[0].text or "no codeveil" in \
            early.content[0].text

        synced = await session.call_tool("sync_index", {})
        assert not synced.is_error
        assert synced.structured_content["files_changed"] == 5
        # It returned with the words indexed and the vectors left to the builder.
        assert synced.structured_content["chunks_embedded"] == 0
        assert synced.structured_content["builder"]["pid"] > 0
        assert synced.structured_content["index"]["chunks_with_vectors"] == 0
        early_words = await session.call_tool(
            "search", {"query": "verify_password", "k": 1, "group": "symbol"})
        assert early_words.structured_content["hits"][0]["path"] == "auth/password.py"
        assert early_words.structured_content["index"]["partial"]

        status = await _built(session)
        assert status.structured_content["builder"]["state"] == "done"
        assert status.structured_content["files"] == 5
        assert status.structured_content["chunks"] > 0

        found = await session.call_tool(
            "search", {"query": "verify_password compare digest", "k": 3})
        hits = found.structured_content["hits"]
        assert hits[0]["path"] == "auth/password.py"
        assert "verify_password" in hits[0]["text"]
        tokens = found.structured_content["tokens"]  # what the answer costs to read
        assert tokens > 0 and abs(tokens - len(found.content[0].text) / 4) < 0.2 * tokens
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
        await _built(session)
        fresh = await session.call_tool(
            "search", {"query": "resumable_chunked_transfer", "k": 1, "group": "symbol"})
        top = fresh.structured_content["hits"][0]
        assert top["path"] == "net/upload.py" and not top["stale"]
        assert "resumable_chunked_transfer" in top["symbol"]

    anyio.run(_session_run, repo, tmp_path, steps)


def test_lookup_tools_through_a_client_session(tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo")

    async def steps(session: ClientSession) -> None:
        # Before any index: a clear tool error, as for search.
        early = await session.call_tool("definition", {"name": "cartTotal"})
        assert early.is_error
        await session.call_tool("sync_index", {})

        found = await session.call_tool("definition", {"name": "Uploader.upload"})
        best = found.structured_content["definitions"][0]
        lines = (repo / "net/upload.py").read_text().split("\n")
        assert (best["path"], best["kind"]) == ("net/upload.py", "method")
        assert lines[best["start_line"] - 1].strip() == "def upload(self, path):"
        assert best["text"].startswith(lines[best["start_line"] - 1])
        assert best["truncated"] and best["end_line"] > best["start_line"] + 5
        tokens = found.structured_content["tokens"]
        assert tokens > 0 and abs(tokens - len(found.content[0].text) / 4) < 0.2 * tokens

        outline = await session.call_tool("outline", {"path": "auth/password.py"})
        symbols = outline.structured_content["symbols"]
        assert [s["name"] for s in symbols] == ["hash_password", "verify_password"]
        assert symbols[0]["signature"] == "def hash_password(password: str) -> bytes:"
        assert outline.structured_content["reparsed"] is False
        assert outline.structured_content["tokens"] > 0

        uses = await session.call_tool("references", {"name": "cartTotal"})
        refs = uses.structured_content["references"]
        assert [(r["path"], r["lines"], r["approximate"]) for r in refs] == [
            ("web/routes.js", [14], False)]
        assert "cartTotal(req.session.items" in refs[0]["text"]

        grep = await session.call_tool("grep", {"pattern": r"pbkdf2_\w+", "limit": 1})
        result = grep.structured_content
        first = next(i for i, line in enumerate(
            (repo / "auth/password.py").read_text().split("\n"), 1) if "pbkdf2_" in line)
        assert [(m["path"], m["line"]) for m in result["matches"]] == [
            ("auth/password.py", first)]
        assert result["truncated"] and result["tokens"] > 0
        bad = await session.call_tool("grep", {"pattern": "def ("})
        assert bad.is_error and "not a valid regular expression" in bad.content[0].text
        missing = await session.call_tool("outline", {"path": "nope.py"})
        assert missing.is_error and "no file nope.py" in missing.content[0].text

    anyio.run(_session_run, repo, tmp_path, steps)



def test_search_over_several_repositories_through_a_client_session(tmp_path: Path) -> None:
    import os
    import subprocess

    repo = write_repo(tmp_path / "repo")
    other = write_repo(tmp_path / "other", {
        "billing/invoice.py": "def issue_invoice_for_customer(customer):\n"
                              "    return render_invoice(customer)\n"})
    env = dict(os.environ, CODEVEIL_EMBEDDER="hashing",
               CODEVEIL_CONFIG_DIR=str(tmp_path / "config"),
               CODEVEIL_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    for r in (repo, other):
        subprocess.run([sys.executable, "-m", "retrieval", "index", "--wait", "-q"], cwd=r,
                       env=env, check=True, timeout=120)

    async def steps(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert "repos" in tools["search"].input_schema["properties"]
        both = await session.call_tool("search", {"query": "issue_invoice_for_customer",
                                                  "k": 3, "repos": [str(other)]})
        assert not both.is_error, both.content
        hits = both.structured_content["hits"]
        assert hits[0]["path"] == "billing/invoice.py"
        assert hits[0]["repo"] == str(other.resolve())
        assert set(both.structured_content["index"]) == {str(repo.resolve()),
                                                         str(other.resolve())}
        alone = await session.call_tool("search", {"query": "issue_invoice_for_customer",
                                                   "k": 3})
        assert all("repo" not in h and h["path"] != "billing/invoice.py"
                   for h in alone.structured_content["hits"])
        missing = await session.call_tool("search", {"query": "x",
                                                     "repos": [str(tmp_path / "nowhere")]})
        assert missing.is_error and "no codeveil index" in missing.content[0].text

    anyio.run(_session_run, repo, tmp_path, steps)


def test_the_server_says_its_version_which_tools_only_read_and_how_to_build_an_index(
        tmp_path: Path) -> None:
    # serverInfo.version was empty and no tool carried annotations, so clients asked
    # permission before every lookup; without an index the agent was told to run a
    # shell command, not the tool it has.
    repo = write_repo(tmp_path / "repo")

    async def run(errlog: Any) -> None:
        with anyio.fail_after(120):
            async with stdio_client(_params(repo, tmp_path), errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                started = await session.initialize()
                assert started.server_info.name == "codeveil"
                assert started.server_info.version
                tools = {t.name: t for t in (await session.list_tools()).tools}
                for name in ("search", "definition", "outline", "references", "grep",
                             "index_status"):
                    hints = tools[name].annotations
                    assert hints is not None and hints.read_only_hint, name
                sync = tools["sync_index"].annotations
                assert sync is not None and sync.read_only_hint is False
                assert sync.destructive_hint is False
                early = await session.call_tool("search", {"query": "password hash"})
                assert early.is_error
                assert "call the sync_index tool" in early.content[0].text

    with (tmp_path / "stderr").open("w+") as errlog:
        anyio.run(run, errlog)
        errlog.seek(0)
        assert "failed" not in errlog.read()  # the error is the agent's, not a log block


def test_bad_arguments_are_one_plain_line_naming_the_argument(tmp_path: Path) -> None:
    # k: 0 became 1 and an unknown argument was dropped, both silently; a missing one
    # was answered in pydantic's words with a link.
    repo = write_repo(tmp_path / "repo")

    async def steps(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert tools["search"].input_schema["properties"]["k"]["minimum"] == 1
        expected = {
            ("search", '{"query": "x", "k": 0}'): "search: argument 'k' must be at least 1",
            ("grep", '{"pattern": "x", "limit": 0}'):
                "grep: argument 'limit' must be at least 1",
            ("search", '{"query": "x", "top_k": 5}'):
                "search: unknown argument 'top_k'; it takes query, k, path,",
            ("search", "{}"): "search: missing argument 'query' (A question",
            ("definition", '{"name": 3}'): "definition: argument 'name' should be a valid"
                                           " string",
        }
        for (tool, args), start in expected.items():
            got = await session.call_tool(tool, json.loads(args))
            text = got.content[0].text
            assert got.is_error and text.startswith(start), text
            assert "\n" not in text and "pydantic" not in text and "http" not in text

    async def run() -> None:
        with anyio.fail_after(120):
            async with stdio_client(_params(repo, tmp_path)) as (read, write), \
                    ClientSession(read, write) as session:
                started = await session.initialize()
                # No prompts and no resources: none is advertised.
                assert started.capabilities.prompts is None
                assert started.capabilities.resources is None
                await steps(session)

    anyio.run(run)


def test_status_is_one_json_shape_in_the_command_and_the_tool(tmp_path: Path) -> None:
    import subprocess

    repo = write_repo(tmp_path / "repo")
    env = _params(repo, tmp_path).env
    subprocess.run([sys.executable, "-m", "retrieval", "index", "--wait", "-q"], cwd=repo,
                   env=env, check=True, timeout=120)
    shown = subprocess.run([sys.executable, "-m", "retrieval", "status", "--json"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    command = json.loads(shown.stdout)
    answers: list[dict[str, Any]] = []

    async def steps(session: ClientSession) -> None:
        status = await session.call_tool("index_status", {})
        answers.append(status.structured_content or {})

    anyio.run(_session_run, repo, tmp_path, steps)
    (tool,) = answers
    assert set(tool) == set(command)
    assert {"index", "builder", "files", "chunks"} <= set(command)
    assert tool["index"] == command["index"] and tool["files"] == command["files"]

"""The codeveil server: the store (sync.store, or sync.store.postgres on PostgreSQL) behind an
HTTP API under /v1. On PostgreSQL the server keeps no state of its own: any number of
replicas may serve one database behind a load balancer.

    GET  /v1/health                                  readiness; no token
    POST /v1/workspaces                              create: {dim, model_id, key_check,
                                                     workspace_id?, mode?} -> {workspace_id,
                                                     token}; mode "sealed" or
                                                     "server-search" (the default)
    GET  /v1/workspaces/{id}                         WorkspaceInfo
    GET  /v1/workspaces/{id}/tree/root               {node: Node | null}
    POST /v1/workspaces/{id}/tree/children           {keys: [key]} -> {children: {key: [Node]}}
    POST /v1/workspaces/{id}/tree/dirs               {values: [[key, value, children]]}
                                                     -> {values: n, root: Node | null}
                                                     (the root once they are set)
    POST /v1/workspaces/{id}/apply                   {updates: [{file_key, ancestors, value,
                                                     chunks: [{chunk_id, vector, meta}]}],
                                                     deletes: [key]}; no vector when sealed
    POST /v1/workspaces/{id}/search                  {vector, k} -> {hits: [{chunk_id,
                                                     distance, meta}]}; 409 when sealed
    POST /v1/workspaces/{id}/rows                    {files: [key]} -> {files: {key:
                                                     [[chunk_id, meta]]}}; keys past the
                                                     answer's size bound are left out
    POST|GET /v1/workspaces/{id}/invitees[/revoke]   invitee tokens (sync.server.invitees)

Node = {key, value (null while pending), is_dir}. Bytes are base64url without padding and
vectors base64url of little-endian float32 (sync.wire). Every route under a workspace
needs `Authorization: Bearer <token>`, the workspace's own or an invitee token that has
not expired (sync.store.core.invitees): none or an unknown token gives 401, the token of
another workspace 403, an unknown workspace 404 (only to a caller with a valid token).

Every refusal is a 4xx with a JSON body {"error": "<what is wrong>"}: 400 for a body that
is not JSON, 413 for one over the size limit (refused from its Content-Length before it is
read, or as soon as a streamed body passes the limit), 422 for JSON that is not a valid
request (wrong types, bad base64, wrong vector size, non-finite values, too many items).
Requests are logged without their bodies or headers.

Bodies are parsed and validated in the worker thread pool, not on the event loop, so a
large upload does not stall other clients' searches.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from indexer.errors import CodeveilError
from indexer.sqlite_files import CorruptFileError
from sync.records import DEFAULT_REF, MODE_SERVER_SEARCH, ChunkRecord, FileUpdate
from sync.server.body_fields import Bytes, Key, Vector
from sync.server.exposure import ServeRefused, open_server_refusal
from sync.server.invitees import InviteeBody, RevokeBody, invitee_handlers
from sync.server.middleware import BodyLimit, RequestLog
from sync.server.refs import (
    REF_PARAMETER,
    BlobsBody,
    GcBody,
    blobs_handler,
    drop_ref_handler,
    gc_handler,
    ref_from_path,
    refs_handler,
)
from sync.store.core.backend import StoreBackend, WorkspaceBackend
from sync.store.open import describe_store, open_store
from sync.wire import (
    API_PREFIX,
    LIMITS,
    AuthError,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    b64encode,
    hit_to_json,
    info_to_json,
    node_to_json,
    rows_to_json,
)

log = logging.getLogger("sync.server.app")  # not __name__: "__main__" under -m

DEFAULT_PORT = 7400
# Where `codeveil serve` and `codeveil init` read the token that creating workspaces
# needs, when the server was started with one (never a command-line argument: `ps`).
ADMIN_TOKEN_ENV = "CODEVEIL_ADMIN_TOKEN"
# The store to serve when no --store or --data is given: a data dir or a database URL
# (an environment variable keeps a database password out of `ps`).
STORE_ENV = "CODEVEIL_STORE"


def admin_token_from_env() -> str | None:
    """The server's admin token, or None when the variable is unset or blank."""
    return os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None


# -- request bodies ---------------------------------------------------------------------


class _Body(BaseModel):
    # strict: "384" is not a number and 1.0 not an integer; unknown fields are typos.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CreateWorkspaceBody(_Body):
    dim: int
    model_id: str
    key_check: Bytes
    workspace_id: str | None = None
    mode: str = MODE_SERVER_SEARCH  # the store refuses an unknown one by name (400)


class ChunkBody(_Body):
    chunk_id: Key
    vector: Vector | None = None  # absent (or null) in a sealed workspace
    meta: Bytes


class UpdateBody(_Body):
    file_key: Key
    ancestors: list[Key] = Field(max_length=LIMITS.max_depth)  # the store wants >= 1
    value: Key
    chunks: list[ChunkBody] = Field(default_factory=list, max_length=LIMITS.max_chunks)
    link: bool = False  # sealed: the pool's blob of (file_key, value); no chunks


class ApplyBody(_Body):
    updates: list[UpdateBody] = Field(default_factory=list, max_length=LIMITS.max_updates)
    deletes: list[Key] = Field(default_factory=list, max_length=LIMITS.max_deletes)


class ChildrenBody(_Body):
    keys: list[Key] = Field(max_length=LIMITS.max_keys)


class DirValuesBody(_Body):
    values: list[tuple[Key, Key, Key]] = Field(max_length=LIMITS.max_dir_values)


class SearchBody(_Body):
    vector: Vector
    k: int


class RowsBody(_Body):
    files: list[Key] = Field(max_length=LIMITS.max_row_files)


def _describe(exc: ValidationError) -> tuple[int, str]:
    """A readable one-line message (and its status) for a pydantic validation error."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if any(e["type"] == "json_invalid" for e in errors):
        return 400, f"malformed JSON: {errors[0]['msg'].removeprefix('Invalid JSON: ')}"
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    if len(errors) > 5:
        parts.append(f"and {len(errors) - 5} more")
    return 422, "invalid request: " + "; ".join(parts)


# -- handlers (run in the worker thread pool) ---------------------------------------------

# Routes under /refs/{ref} get the ref (checked, 16 bytes) as a fifth argument.
Handler = Callable[..., tuple[int, dict[str, Any]]]


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("malformed Authorization header: expected 'Bearer <token>'")
    return token.strip()


def _authorized(
    store: StoreBackend, workspace_id: str, authorization: str | None
) -> WorkspaceBackend:
    store.authenticate(workspace_id, _bearer(authorization))
    return store.workspace(workspace_id)


def _creator(admin_token: str | None, max_workspaces: int | None) -> Handler:
    """The create handler: open to anyone, or only to the holder of `admin_token`; at
    most `max_workspaces` in the store, if given."""

    def _create(store: StoreBackend, _ws: str, auth: str | None,
                body: bytes) -> tuple[int, dict[str, Any]]:
        if admin_token is not None:
            given = _bearer(auth)
            if given is None or not hmac.compare_digest(given.encode(), admin_token.encode()):
                raise AuthError("creating a workspace on this server needs its admin token"
                                f" (set {ADMIN_TOKEN_ENV} for `codeveil init`)")
        req = CreateWorkspaceBody.model_validate_json(body)
        workspace_id, token = store.create_workspace(
            req.dim, req.model_id, req.key_check, workspace_id=req.workspace_id,
            mode=req.mode, max_workspaces=max_workspaces,
        )
        return 201, {"workspace_id": workspace_id, "token": token}

    return _create


def _info(
    store: StoreBackend, ws: str, auth: str | None, _body: bytes
) -> tuple[int, dict[str, Any]]:
    return 200, info_to_json(_authorized(store, ws, auth).info())


def _root(
    store: StoreBackend, ws: str, auth: str | None, _body: bytes, ref: bytes = DEFAULT_REF
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    # The first request of every sync: a table that plainly lost its files is a 503
    # here, so a client never reports an index as up to date over it.
    workspace.verify(deep=False)
    node = workspace.root(ref)
    return 200, {"node": None if node is None else node_to_json(node)}


def _children(
    store: StoreBackend, ws: str, auth: str | None, body: bytes, ref: bytes = DEFAULT_REF
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    req = ChildrenBody.model_validate_json(body)
    found = workspace.children(req.keys, ref)
    return 200, {
        "children": {b64encode(k): [node_to_json(n) for n in nodes] for k, nodes in found.items()}
    }


def _apply(
    store: StoreBackend, ws: str, auth: str | None, body: bytes, ref: bytes = DEFAULT_REF
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    req = ApplyBody.model_validate_json(body)
    updates = [
        FileUpdate(
            file_key=u.file_key,
            ancestors=tuple(u.ancestors),
            value=u.value,
            chunks=tuple(ChunkRecord(c.chunk_id, c.vector, c.meta) for c in u.chunks),
            link=u.link,
        )
        for u in req.updates
    ]
    missing = workspace.apply(updates, req.deletes, ref)
    answer: dict[str, Any] = {"updates": len(updates), "deletes": len(req.deletes)}
    if missing:  # links whose blob the pool lacks: their leaves stay pending
        answer["missing"] = [b64encode(k) for k in missing]
    return 200, answer


def _dirs(
    store: StoreBackend, ws: str, auth: str | None, body: bytes, ref: bytes = DEFAULT_REF
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    req = DirValuesBody.model_validate_json(body)
    workspace.set_dir_values(req.values, ref)
    # The root as it stands after: a client that finds another than its own learns in
    # this request that a value was refused or another writer of the ref came after.
    node = workspace.root(ref)
    return 200, {"values": len(req.values),
                 "root": None if node is None else node_to_json(node)}


def _search(
    store: StoreBackend, ws: str, auth: str | None, body: bytes
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    req = SearchBody.model_validate_json(body)
    return 200, {"hits": [hit_to_json(h) for h in workspace.search(req.vector, req.k)]}


def _rows(
    store: StoreBackend, ws: str, auth: str | None, body: bytes, ref: bytes = DEFAULT_REF
) -> tuple[int, dict[str, Any]]:
    workspace = _authorized(store, ws, auth)
    req = RowsBody.model_validate_json(body)
    return 200, rows_to_json(workspace.file_rows(req.files, ref))


# -- the app ------------------------------------------------------------------------------


def create_app(
    store: StoreBackend | str | os.PathLike[str],
    *,
    max_body_bytes: int = LIMITS.max_body_bytes,
    close_store: bool | None = None,
    admin_token: str | None = None,
    max_workspaces: int | None = None,
) -> FastAPI:
    """The ASGI app over `store` (a store, or a data dir or database URL the app opens).
    The app closes the store at shutdown if it opened it, or if `close_store` says so."""
    owned = isinstance(store, str | os.PathLike)
    the_store = open_store(store) if isinstance(store, str | os.PathLike) else store
    closes = owned if close_store is None else close_store

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if closes:
            # Closing snapshots changed search indexes (sync.store.embedded.search_index), which
            # can take seconds for a large workspace: off the event loop.
            await run_in_threadpool(the_store.close)

    app = FastAPI(
        title="codeveil",
        summary="Stores encrypted vectors, sealed metadata and a keyed Merkle tree.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.store = the_store

    damaged: set[str] = set()  # messages about damaged files, logged once each

    schemas: dict[str, Any] = {}  # request bodies, for /openapi.json

    def describe(path: str, body: type[BaseModel] | None) -> dict[str, Any]:
        """The OpenAPI parameters and request body of a route. Endpoints read the raw body
        (parsed off the event loop), so FastAPI cannot infer them."""
        extra: dict[str, Any] = {}
        if "{workspace_id}" in path:
            extra["parameters"] = [{
                "name": "workspace_id", "in": "path", "required": True,
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"},
            }]
            extra["security"] = [{"bearer": []}]
        if "{ref}" in path:
            extra["parameters"].append(REF_PARAMETER)
        if body is not None:
            schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[body.__name__] = schema
            extra["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}
        return extra

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, summary=app.summary,
                               routes=app.routes)
            components = spec.setdefault("components", {})
            components.setdefault("schemas", {}).update(schemas)
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def route(method: str, path: str, handler: Handler,
              body: type[BaseModel] | None = None) -> None:
        async def endpoint(request: Request) -> Response:
            body = await request.body()
            # A ref in the path is checked before anything is read (400 if malformed).
            ref = request.path_params.get("ref")
            extra = () if ref is None else (ref_from_path(ref),)
            try:
                status, payload = await run_in_threadpool(
                    handler,
                    the_store,
                    request.path_params.get("workspace_id", ""),
                    request.headers.get("authorization"),
                    body,
                    *extra,
                )
            except (StoreCorrupt, StoreUnavailable, CorruptFileError) as exc:
                # Every request to the workspace fails the same way until it is repaired
                # (or the database is back): the operator hears of it once, each client
                # every time.
                message = str(exc)
                if message not in damaged:
                    damaged.add(message)
                    log.error("%s %s: %s", request.method, request.url.path, message)
                return JSONResponse({"error": message}, status_code=503)
            except (StoreError, ValidationError):
                raise
            except Exception as exc:
                # Here, not in an app-wide handler, so the request log sees the 500.
                log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
                return JSONResponse(
                    {"error": f"internal server error ({type(exc).__name__}); see the"
                              " server's log"}, status_code=500)
            return JSONResponse(payload, status_code=status)

        endpoint.__name__ = handler.__name__.lstrip("_")
        app.add_api_route(API_PREFIX + path, endpoint, methods=[method],
                          openapi_extra=describe(path, body))

    @app.get(API_PREFIX + "/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "api": API_PREFIX.strip("/"), "limits": LIMITS.as_dict()}

    ws = "/workspaces/{workspace_id}"
    route("POST", "/workspaces", _creator(admin_token, max_workspaces), CreateWorkspaceBody)
    route("GET", ws, _info)
    route("GET", ws + "/tree/root", _root)
    route("POST", ws + "/tree/children", _children, ChildrenBody)
    route("POST", ws + "/tree/dirs", _dirs, DirValuesBody)
    route("POST", ws + "/apply", _apply, ApplyBody)
    route("POST", ws + "/search", _search, SearchBody)
    route("POST", ws + "/rows", _rows, RowsBody)
    # One tree per ref (sync.store.embedded.pool): the same tree routes under the ref's id, and
    # the refs and blob pool of the workspace.
    tree = ws + "/refs/{ref}"
    route("GET", tree + "/tree/root", _root)
    route("POST", tree + "/tree/children", _children, ChildrenBody)
    route("POST", tree + "/tree/dirs", _dirs, DirValuesBody)
    route("POST", tree + "/apply", _apply, ApplyBody)
    route("POST", tree + "/rows", _rows, RowsBody)
    route("DELETE", tree, drop_ref_handler(_authorized))
    route("GET", ws + "/refs", refs_handler(_authorized))
    route("POST", ws + "/blobs", blobs_handler(_authorized), BlobsBody)
    route("POST", ws + "/gc", gc_handler(_authorized), GcBody)
    create_invitee, list_invitees, revoke_invitee = invitee_handlers(_bearer)
    route("POST", ws + "/invitees", create_invitee, InviteeBody)
    route("GET", ws + "/invitees", list_invitees)
    route("POST", ws + "/invitees/revoke", revoke_invitee, RevokeBody)

    @app.exception_handler(StoreError)
    async def store_error(_request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.http_status)

    @app.exception_handler(ValidationError)
    async def invalid_body(_request: Request, exc: ValidationError) -> JSONResponse:
        status, message = _describe(exc)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # No route declares typed parameters, so this is only a safety net.
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        message = f"invalid request: {where}: {first.get('msg', 'invalid')}"
        return JSONResponse({"error": message}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal server error"}, status_code=500)

    # Added last = outermost: the size limit applies before anything reads the body.
    app.add_middleware(RequestLog)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def serve(
    data_dir: str | os.PathLike[str],  # or a PostgreSQL URL (open_store)
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    log_level: str = "info",
    max_body_bytes: int = LIMITS.max_body_bytes,
    max_workspaces: int | None = None,
    allow_open: bool = False,
) -> None:
    """Run the server on `data_dir` (a data dir or a PostgreSQL URL) until interrupted
    (SIGINT/SIGTERM). Creating workspaces needs the token in CODEVEIL_ADMIN_TOKEN when
    that is set. A `host` beyond loopback without that token is refused
    (`ServeRefused`) unless `allow_open`: every way of starting a server passes here."""
    refusal = open_server_refusal(host, admin_token_from_env(), allow_open)
    if refusal:
        raise ServeRefused(refusal)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    store = open_store(data_dir)
    try:
        # The app closes the store at shutdown: uvicorn re-raises SIGTERM once it has
        # stopped, so code after run() does not run then; `finally` covers failed starts.
        admin_token = admin_token_from_env()
        app = create_app(store, max_body_bytes=max_body_bytes, close_store=True,
                         admin_token=admin_token, max_workspaces=max_workspaces)
        log.info("serving %s on http://%s:%d%s", describe_store(data_dir), host, port,
                 API_PREFIX)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            log_config=None,  # our logging setup; uvicorn's loggers propagate to it
            access_log=False,  # RequestLog logs each request once
            timeout_graceful_shutdown=10,
        )
        uvicorn.Server(config).run()
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sync.server.app", description="Run the codeveil store server."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data", type=Path, help="folder of the server's data")
    where.add_argument("--store", metavar="URL|DIR",
                       help="a PostgreSQL database (postgresql://...) shared by any number"
                            f" of replicas, or a data dir (default: ${STORE_ENV})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--max-body-bytes", type=int, default=LIMITS.max_body_bytes)
    parser.add_argument("--max-workspaces", type=int, default=None,
                        help="refuse to create workspaces beyond this many")
    parser.add_argument("--open", dest="allow_open", action="store_true",
                        help="let anyone who reaches a non-loopback --host create"
                             " workspaces (without it such a server needs"
                             " CODEVEIL_ADMIN_TOKEN)")
    args = parser.parse_args(argv)
    spec = args.data or args.store or os.environ.get(STORE_ENV, "").strip()
    if not spec:
        parser.error(f"give --data DIR or --store URL (or set {STORE_ENV})")
    try:
        serve(spec, args.host, args.port, log_level=args.log_level,
              max_body_bytes=args.max_body_bytes, max_workspaces=args.max_workspaces,
              allow_open=args.allow_open)
    except ServeRefused as exc:
        print(f"python -m sync.server.app: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except CodeveilError as exc:  # a damaged registry, say: one line, not a traceback
        log.error("cannot serve %s: %s", describe_store(spec), exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

"""`harnessrl ui`: a JSON API over the run directories' trace stores and the static page
that renders it (plain HTML/JS/CSS shipped in the package: nothing to build).

The page polls the API, so it follows a run that is still going. Every endpoint reads one
bounded page (see queries.py); the store is only read, never written, apart from the
viewer's indexes being added once to a store made before they existed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from harnessrl.ui import steps as step_curves
from harnessrl.ui import tokens as token_page
from harnessrl.ui import views
from harnessrl.ui.queries import Filters, RunReader, discover

STATIC = Path(__file__).parent / "static"


class Runs:
    """The run directories under one root, found again on every listing so that a run
    started after the viewer shows up."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._readers: dict[str, RunReader] = {}
        self._lock = threading.Lock()

    def ids(self) -> list[str]:
        found = discover(self.root)
        return [self._id(p) for p in found]

    def _id(self, path: Path) -> str:
        rel = path.relative_to(self.root) if path != self.root else Path(".")
        name = str(rel)
        with self._lock:
            if name not in self._readers:
                self._readers[name] = RunReader(path)
        return name

    def get(self, name: str) -> RunReader:
        with self._lock:
            reader = self._readers.get(name)
        if reader is None and name in self.ids():
            reader = self._readers[name]
        if reader is None:
            raise HTTPException(404, f"no run {name!r}")
        return reader


def _int(request: Request, name: str, default: int) -> int:
    try:
        return int(request.query_params.get(name, default))
    except ValueError as exc:
        raise HTTPException(400, f"{name} must be an integer") from exc


def _reader(request: Request) -> RunReader:
    return request.app.state.runs.get(request.query_params.get("run", "."))


def _key(request: Request) -> str:
    key = request.query_params.get("key")
    if not key:
        raise HTTPException(400, "key is required")
    return key


def runs(request: Request) -> JSONResponse:
    all_runs: Runs = request.app.state.runs
    out = []
    for name in all_runs.ids():
        reader = all_runs.get(name)
        out.append({"id": name, "path": str(reader.run_dir), **reader.summary()})
    return JSONResponse({"root": str(all_runs.root), "runs": out})


def rollouts(request: Request) -> JSONResponse:
    reader = _reader(request)
    q = request.query_params
    filters = Filters(harness=q.get("harness") or None, task=q.get("task") or None,
                      state=q.get("state") or None)
    page = reader.rollouts(filters, _int(request, "offset", 0), _int(request, "limit", 50))
    return JSONResponse({**page, "facets": reader.facets()})


def rollout(request: Request) -> JSONResponse:
    reader = _reader(request)
    row = reader.rollout(_key(request))
    if row is None:
        raise HTTPException(404, "no such rollout")
    row["siblings"] = reader.siblings(row["key"], row["task"])
    return JSONResponse(row)


def turns(request: Request) -> JSONResponse:
    reader, key = _reader(request), _key(request)
    offset = max(0, _int(request, "offset", 0))
    # One turn more at the front: each turn is shown as what it added to the one before.
    page = reader.turns(key, max(0, offset - 1), _int(request, "limit", 20) + (offset > 0))
    before = page.pop(0) if offset > 0 and page and page[0].index == offset - 1 else None
    return JSONResponse({"total": reader.turn_count(key), "offset": offset,
                         "rows": views.summaries(page, before)})


def turn(request: Request) -> JSONResponse:
    found = _reader(request).turn(_key(request), _int(request, "index", 0))
    if found is None:
        raise HTTPException(404, "no such turn")
    return JSONResponse(views.detail(found))


def tokens(request: Request) -> JSONResponse:
    reader, key = _reader(request), _key(request)
    index = _int(request, "index", 0)
    found, model = reader.turn_model(key, index)
    if not found:
        raise HTTPException(404, "no such turn")
    ctx = request.query_params.get("ctx")
    view = token_page.token_view(reader.token_turns(key), index, request.app.state.decoder,
                                 model, int(ctx) if ctx and ctx.isdigit() else None,
                                 messages=lambda: reader.message_turns(key),
                                 harness=(reader.rollout(key) or {}).get("harness"))
    return JSONResponse(view)


def steps(request: Request) -> JSONResponse:
    """The run's per-step curves (metrics.jsonl; none for a run that trained nothing)."""
    return JSONResponse(step_curves.series(_reader(request).run_dir))


def atlas(request: Request) -> JSONResponse:
    return JSONResponse({"rows": _reader(request).atlas()})


def index(_request: Request) -> FileResponse:
    return FileResponse(STATIC / "index.html")


def build_app(root: Path, tokenizer: str | None = None) -> Starlette:
    app = Starlette(routes=[
        Route("/", index),
        Route("/api/runs", runs),
        Route("/api/rollouts", rollouts),
        Route("/api/rollout", rollout),
        Route("/api/turns", turns),
        Route("/api/turn", turn),
        Route("/api/tokens", tokens),
        Route("/api/steps", steps),
        Route("/api/atlas", atlas),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])
    app.state.runs = Runs(root.resolve())
    app.state.decoder = token_page.Decoder(tokenizer)
    return app


def serve(root: Path, host: str = "127.0.0.1", port: int = 8200,
          tokenizer: str | None = None) -> None:
    import uvicorn

    app = build_app(root, tokenizer)
    print(f"harnessrl ui on http://{host}:{port} (runs under {root})", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


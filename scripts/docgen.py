"""The docs site's reference pages, generated from the code so they cannot drift. Docs
tooling, kept out of the runtime package: it imports harnessrl, nothing there imports it.

`scripts/mkdocs_hooks.py` puts each page into the site at build time (nothing generated
is committed); `tests/test_docs.py` checks that the built pages name every command, flag
and config field. Each function returns one page's Markdown.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import tokenize
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.settings import file_fields

GENERATED = "<!-- generated from the code by scripts/docgen.py at build time: edit the code -->"


# ------------------------------------------------------------------ shared helpers
def cell(text: object) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def first_paragraph(doc: str | None) -> str:
    return " ".join((inspect.cleandoc(doc or "").split("\n\n") or [""])[0].split())


def first_sentence(doc: str | None) -> str:
    text = first_paragraph(doc)
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


# ------------------------------------------------------------------ the CLI
def cli_parser() -> argparse.ArgumentParser:
    """The `harnessrl` parser, as `main` builds it."""
    from harnessrl.cli import build_parser

    return build_parser()


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("harnessrl",)
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Every (sub)command: its words, its parser and its one-line help, depth first."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            yield (*path, name), sub, helps.get(name, "")
            yield from commands(sub, (*path, name))


def _argument_row(action: argparse.Action) -> list[str]:
    name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    if action.option_strings and action.nargs != 0:
        name += f" `{action.metavar or action.dest.upper()}`"
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        name += " (" + " | ".join(f"`{c}`" for c in action.choices) + ")"
    default = action.default
    if action.required:
        shown = "required"
    elif default in (None, argparse.SUPPRESS) or action.nargs == 0:
        shown = ""
    else:
        shown = f"`{default}`"
    try:  # argparse's own expansion of %(default)s and the like
        text = (action.help or "") % {**vars(action), "prog": "harnessrl"}
    except (KeyError, TypeError, ValueError):
        text = action.help or ""
    return [name, shown, text]


def cli_page() -> str:
    parser = cli_parser()
    out = [GENERATED, "# Command line", "",
           first_paragraph(parser.description) or "`harnessrl COMMAND [OPTIONS]`", "",
           "Every command, generated from the argument parsers `harnessrl` runs. "
           "`harnessrl COMMAND --help` prints the same.", ""]
    found = list(commands(parser))
    out += [table(["command", "what it does"],
                  [[f"[`{' '.join(p)}`](#{'-'.join(p[1:])})", h] for p, _, h in found]), ""]
    for path, sub, help_text in found:
        out += [f"{'#' * min(len(path), 4)} `{' '.join(path)}` {{ #{'-'.join(path[1:])} }}",
                "", help_text, "", "```", sub.format_usage().strip(), "```", ""]
        rows = [_argument_row(a) for a in sub._actions
                if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
        if rows:
            out += [table(["argument", "default", "what it does"], rows), ""]
    return "\n".join(out)


# ------------------------------------------------------------------ the train config
def field_comments(cls: type) -> dict[str, str]:
    """Each field's comments in `cls`'s source and its bases': the comment lines just
    above its line and the one at its end (`field: T = x  # why`)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "msgspec") or not hasattr(klass, "__struct_fields__"):
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        source = "".join(lines)
        source = inspect.cleandoc("\n" + source) if source[:1].isspace() else source
        found.update(_comments_of(source))
    return found


def _comments_of(source: str) -> dict[str, str]:
    lines = source.splitlines()
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT}
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    result = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        inline = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                  if n in comments and not lines[n - 1].strip().startswith("#")]
        result[node.target.id] = " ".join(above + inline)
    return result


def type_name(kind: Any) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:  # msgspec.Meta limits; a settings Flag is shown apart
        limits = [f"{k.replace('ge', '≥').replace('le', '≤')} {v}" for meta in args[1:]
                  if isinstance(meta, msgspec.Meta) for k, v in _meta_limits(meta).items()]
        return type_name(args[0]) + (f" ({', '.join(limits)})" if limits else "")
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("unset" if a is type(None) else type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if kind is Ellipsis:
        return "..."
    return "Any" if kind is Any else getattr(kind, "__name__", str(kind))


def _meta_limits(meta: Any) -> dict[str, Any]:
    return {k: getattr(meta, k) for k in ("ge", "gt", "le", "lt")
            if getattr(meta, k, None) is not None}


def flag_of(kind: Any) -> Any:
    """The settings `Flag` in a field's `Annotated` (harnessrl.settings), if it has one."""
    for candidate in (kind, *typing.get_args(kind)):
        if typing.get_origin(candidate) is typing.Annotated:
            for meta in typing.get_args(candidate)[1:]:
                if type(meta).__name__ == "Flag" and hasattr(meta, "names"):
                    return meta
    return None


def meaning(field: msgspec.structs.FieldInfo, comments: dict[str, str]) -> str:
    """The comments beside the field, else its flag's help; and the flag that sets it."""
    flag = flag_of(field.type)
    helped = (flag.help or "") if flag is not None else ""
    helped = helped.replace("%(default)s", toml_value(default_of(field)))  # argparse's form
    text = comments.get(field.name, "") or helped
    if flag is not None:
        names = flag.names or ("--" + field.name.replace("_", "-"),)
        text += f" (flag: {', '.join(f'`{n}`' for n in names)})"
    return text.strip()


def default_of(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def toml_value(value: Any) -> str:
    if value is msgspec.NODEFAULT:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list | tuple | dict):  # a tuple is a TOML array too
        return json.dumps(value)
    return str(value)


def _struct_of(kind: Any) -> type | None:
    """The config section type a field holds (`cluster: ClusterSettings | None` too)."""
    for candidate in (kind, *typing.get_args(kind)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def config_sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(dotted name, section type) for `cls` and every section under it."""
    yield prefix, cls
    for field in file_fields(cls):
        if (section := _struct_of(field.type)) is not None:
            yield from config_sections(section, f"{prefix}{field.encode_name}.")


def config_fields(cls: type) -> list[str]:
    """Every dotted field name of the config, sections excluded."""
    return [f"{prefix}{f.encode_name}" for prefix, section in config_sections(cls)
            for f in file_fields(section) if _struct_of(f.type) is None]


def config_page() -> str:
    from harnessrl.train.config import TrainSettings

    out = [GENERATED, "# Train config", "",
           "`harnessrl train --config FILE` reads one TOML or YAML file with these tables. "
           "Every field is optional; unknown keys are errors, so a typo cannot fall back to a "
           "default silently. Generated from the config types in `harnessrl.train.config` "
           "(types, defaults and the comments beside each field); `examples/train.toml` is "
           "a commented example.", ""]
    for prefix, section in config_sections(TrainSettings):
        title = f"`[{prefix.rstrip('.')}]`" if prefix else "Top level"
        doc = first_paragraph(section.__doc__) if section.__doc__ != msgspec.Struct.__doc__ \
            else ""
        comments = field_comments(section)
        rows = [[f"`{prefix}{f.encode_name}`", type_name(f.type),
                 f"`{toml_value(default_of(f))}`", meaning(f, comments)]
                for f in file_fields(section) if _struct_of(f.type) is None]
        out += [f"## {title}", "", doc, "", table(["field", "type", "default", "meaning"], rows),
                ""]
    out += ["## Every default, as one file", "", "What an empty config file means "
            "(unset fields are commented out):", "", "```toml", defaults_toml(TrainSettings),
            "```", ""]
    return "\n".join(out)


def defaults_toml(cls: type) -> str:
    """A TOML file that sets every field of `cls` to its default."""
    lines: list[str] = []
    for prefix, section in config_sections(cls):
        if prefix:
            lines += ["", f"[{prefix.rstrip('.')}]"]
        for field in file_fields(section):
            if _struct_of(field.type) is not None:
                continue
            value = default_of(field)
            unset = value is None or value is msgspec.NODEFAULT
            lines.append(f"{'# ' if unset else ''}{field.encode_name} = "
                         f"{'...' if unset else toml_value(value)}")
    return "\n".join(lines).strip()


# ------------------------------------------------------------------ the proxy's HTTP API
# What each of harnessrl's own routes does. A route the app serves that is missing here
# fails the docs build (http_routes), so a new route cannot go undocumented.
OWN_ROUTES = {
    ("POST", "/rollouts"): "Open a rollout: its key and the base URL of every dialect "
                           "(201). Body: the rollout options below.",
    ("GET", "/rollouts/{key}"): "The rollout and its recorded turns, paginated "
                                "(`?offset=&limit=`, limit 0 to 1,000, default 100).",
    ("DELETE", "/rollouts/{key}"): "Close the rollout; its record.",
    ("POST", "/weights/hold"): "Hold new model calls and answer once none is in flight "
                               "(`{\"timeout\": 600}`; on timeout a 504 naming the calls).",
    ("POST", "/weights/release"): "Let held calls go on; `{\"version\": \"v3\"}` stamps the "
                                  "calls admitted from now on with that weight version.",
    ("POST", "/weights/close"): "The colocated schedule's optimizer step: new model calls "
                                "wait from now on; the running ones are not waited for.",
    ("POST", "/weights/open"): "The step is over: the calls held by `/weights/close` go on.",
    ("GET", "/health"): "The proxy is up and the engine's models.",
    ("GET", "/"): "A probe (Claude Code checks its base URL before calling).",
    ("GET", "/r/{key}"): "The same probe under a rollout's prefix.",
    ("GET", "/r/{key}/"): "The same probe under a rollout's prefix.",
}


class _NoEngine:
    """Enough of an engine and a session table to build the app's routes (never served)."""

    store = None
    weight_version = None


def proxy_routes() -> list[tuple[str, str, Any]]:
    """(method, path, endpoint) of every route the proxy's app serves, in its order."""
    from starlette.routing import Route

    from harnessrl.proxy.app import Proxy

    app = Proxy(_NoEngine(), _NoEngine()).app()  # type: ignore[arg-type]
    routes = [r for r in app.routes if isinstance(r, Route)]
    # HEAD is listed only where there is no GET beside it (Starlette adds it to every GET)
    return [(method, route.path, route.endpoint) for route in routes
            for method in sorted(route.methods or ())
            if method != "HEAD" or "GET" not in (route.methods or ())]


# What a model-call route asks for, by the operation it resolves to. An operation missing
# here fails the docs build.
OPERATIONS = {
    "Generate": "A model call: sampled by the engine, streamed when the request asks, "
                "recorded as a turn.",
    "CountTokens": "Count a prompt's tokens (not a model call, not a turn).",
    "ListModels": "The served models, in the dialect's shape.",
}


def _operation(route: Any) -> str:
    try:
        operation = route.resolve({}, {})
    except Exception:  # the path names the operation (Gemini's `models/<m>:<method>`)
        return (first_paragraph(route.resolve.__doc__) + " `:generateContent`, "
                "`:streamGenerateContent` (`alt=sse` or a JSON array), `:countTokens`.")
    return OPERATIONS[type(operation).__name__]


def dialect_rows() -> list[list[str]]:
    from harnessrl.proxy.dialects import endpoints

    rows = []
    for endpoint in endpoints():
        for dialect, route in endpoint.routes:
            when = f" (with header `{route.header}`)" if route.header else ""
            rows.append([f"`{endpoint.method} {endpoint.path}`", f"{dialect.name}{when}",
                         _operation(route)])
    return rows


def error_kinds() -> list[type]:
    from harnessrl import errors

    kinds = [c for c in vars(errors).values() if isinstance(c, type)
             and issubclass(c, errors.HarnessRLError) and c is not errors.HarnessRLError]
    return sorted(kinds, key=lambda c: (c.status, c.__name__))


def error_sections() -> list[str]:
    """A table of the error kinds, then each one as every dialect renders it."""
    from harnessrl.proxy.dialects import DIALECTS

    out = [table(["error", "kind", "status", "when"],
                 [[f"`{k.__name__}`", f"`{k.kind}`", str(k.status), first_paragraph(k.__doc__)]
                  for k in error_kinds()]), ""]
    for dialect in DIALECTS:
        rows = []
        for kind in error_kinds():
            status, body = dialect.render_error(kind("what to fix"))
            rows.append([f"`{kind.__name__}`", str(status), f"`{body.decode()}`"])
        out += [f"### In the {dialect.name} dialect", "",
                table(["error", "status", "body"], rows), ""]
    return out


def struct_rows(cls: type) -> list[list[str]]:
    comments = field_comments(cls)
    return [[f"`{f.name}`", type_name(f.type), f"`{toml_value(default_of(f))}`",
             comments.get(f.name, "")] for f in msgspec.structs.fields(cls)]


def http_routes() -> list[list[str]]:
    """harnessrl's own routes; a ValueError for one without a description in OWN_ROUTES."""
    from harnessrl.proxy.dialects import endpoints

    model_paths = {(e.method, f"{p}{e.path}") for e in endpoints() for p in ("", "/r/{key}")}
    own = [(m, p) for m, p, _ in proxy_routes() if (m, p) not in model_paths]
    if missing := [f"{m} {p}" for m, p in own if (m, p) not in OWN_ROUTES]:
        raise ValueError(f"routes without a description in docgen.OWN_ROUTES: {missing}")
    return [[f"`{m} {p}`", OWN_ROUTES[(m, p)]] for m, p in own]


def http_page() -> str:
    from harnessrl.proxy.rollout_routes import RolloutRequest
    from harnessrl.proxy.weight_routes import Hold, Release

    return "\n".join([
        GENERATED, "# Proxy HTTP API", "",
        "Generated from the proxy's app (`harnessrl.proxy.app`), its dialects and its error "
        "tree. Every model-call route is served at the root and under `/r/<key>/` (the "
        "rollout's own prefix); a call at the root names its rollout by its key as the API "
        "key (`Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or `?key=`).", "",
        "## Model calls", "", "A path several dialects share goes to the one whose header "
        "the request carries, else to its owner (the row without a header).", "",
        table(["route", "dialect", "what it asks for"], dialect_rows()), "",
        "## harnessrl's own routes", "",
        "They answer errors in the OpenAI shape. With `serve --admin-token`, the rollout and "
        "weight routes need it as the bearer token (a rollout's own key also reads and "
        "closes that rollout).", "",
        table(["route", "what it does"], http_routes()), "",
        "### `POST /rollouts` body", "", first_paragraph(RolloutRequest.__doc__), "",
        table(["field", "type", "default", "meaning"], struct_rows(RolloutRequest)), "",
        "### `POST /weights/hold` and `/weights/release` bodies", "",
        table(["field", "type", "default", "meaning"], struct_rows(Hold) + struct_rows(Release)),
        "", "## Errors", "",
        "Every error is rendered in the caller's own dialect, with a message that says what "
        "to fix; the call is recorded with its error and the proxy keeps serving. Below: "
        "each error as each dialect renders it (the message is an example). A stream that "
        "has already begun carries the error as the dialect's own error event instead.", "",
        *error_sections()])


# ------------------------------------------------------------------ the harness table
def harness_rows() -> list[list[str]]:
    import importlib

    from harnessrl.harnesses import MODULES, variants_of

    rows = []
    for name in sorted(MODULES):
        found = variants_of(name)
        base = found[0]
        module = importlib.import_module(f"harnessrl.harnesses.agents.{MODULES[name]}")
        runtime = f"Python {base.python}" if base.registry == "pypi" else (
            f"Node from `{base.runtime}`" if base.runtime else "Node")
        rows.append([f"`{name}`", f"{base.registry} `{base.package}`", f"`{base.version}`",
                     ", ".join(f"`{h.name}` ({h.dialect})" for h in found), runtime,
                     "yes" if base.streams else "no", first_sentence(module.__doc__)])
    return rows


def harness_page() -> str:
    rows = harness_rows()
    variants = sum(r[3].count("`") // 2 for r in rows)
    return "\n".join([
        GENERATED, "# Harnesses", "",
        f"{len(rows)} harnesses, {variants} harness-dialect variants, generated from the "
        "registry (`harnessrl.harnesses.MODULES`). Each is pinned and installed on first use "
        "into its own prefix under `~/.cache/harnessrl/tools`, run headless and unattended, "
        "its end state read from its own record where the exit code lies. A variant is "
        "selected as `--harness name@variant`. `harnessrl harness list` shows which are "
        "installed; the [conformance matrix](conformance.md) what each one passes.", "",
        table(["harness", "package", "version", "variants (dialect)", "runtime", "streams",
               "notes"], rows), ""])


# ------------------------------------------------------------------ inside written pages
def chain_reasons(which: str) -> str:
    from harnessrl.rollout.analysis.chains import BREAK_REASONS, EXCLUDE_REASONS

    reasons = BREAK_REASONS if which == "breaks" else EXCLUDE_REASONS
    return table(["reason", "what happened"], [[f"`{k}`", v] for k, v in reasons.items()])


def drift_causes() -> str:
    from harnessrl.rollout.analysis.drift import CAUSES

    return table(["cause", "where", "what the harness did", "for training, and how to avoid it"],
                 [[f"`{k}`", where, what, training]
                  for k, (where, what, training) in CAUSES.items()])


def call_kinds() -> str:
    from harnessrl.rollout.analysis.kinds import CALL_KINDS

    return table(["kind", "what the call was for"], [[f"`{k}`", v] for k, v in CALL_KINDS.items()])


# ------------------------------------------------------------------ the source layout
def module_rows(package: Path) -> list[tuple[str, list[list[str]]]]:
    """Per folder of the package: each module and the first sentence of its docstring
    (read with ast: nothing is imported)."""
    sections: dict[str, list[list[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        if "bundled_tasks" in path.parts:
            continue
        folder = str(path.parent.relative_to(package.parent)).replace("\\", "/")
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if path.name == "__init__.py" and not doc:
            continue
        sections.setdefault(folder, []).append([f"`{path.name}`", first_sentence(doc)])
    return sorted(sections.items())


def layout_page() -> str:
    import harnessrl

    out = [GENERATED, "# Source layout", "",
           "Every module under `src/harnessrl/`, with the first sentence of its docstring "
           "(generated: a new module shows up here by itself). Layers import only downward: "
           "store / http <- proxy <- harnesses <- rollout <- train <- ui / cli "
           "(`tests/test_layers.py` walks every import and fails on one running back up). "
           "The [design](../design.md) says why the parts are cut this way.", ""]
    for folder, rows in module_rows(Path(harnessrl.__file__).parent):
        out += [f"## `{folder}/`", "", table(["module", "what it is"], rows), ""]
    out += ["Beside it: `tests/` (the suite; `helpers.py`, `dialects.py`, recorded requests "
            "and outcomes of each harness), `bench/` (every benchmark, by what it measures: "
            "`proxy/`, `store/`, `rollouts/`, `train/`; `bench/run.py` writes "
            "`bench/results.md`), `docs/` (this site), `scripts/` (setup, the demo, the docs "
            "tooling: `docgen.py`, `mkdocs_hooks.py`), `examples/` (a train config).", ""]
    return "\n".join(out)


PAGES = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/http-api.md": http_page,
    "reference/harnesses.md": harness_page,
    "reference/layout.md": layout_page,
}
# `<!-- generated: NAME -->` in a written page is replaced by SNIPPETS[NAME]().
SNIPPETS = {
    "chain-breaks": lambda: chain_reasons("breaks"),
    "chain-excludes": lambda: chain_reasons("excludes"),
    "drift-causes": drift_causes,
    "call-kinds": call_kinds,
}

"""The docs site: the strict build, llms.txt, a reference that names every command, flag,
config field, route and harness (checked against the code, walked here on its own), and
the built site in a browser (Debian's chromium driven by Playwright)."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docgen  # scripts/docgen.py (pytest's pythonpath, pyproject.toml)
import mkdocs_hooks  # scripts/mkdocs_hooks.py
import msgspec
import pytest

from harnessrl.harnesses import MODULES
from harnessrl.train.config import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HARNESSRL_ARTIFACTS", ROOT / "tests" / "artifacts"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _page(site: Path, uri: str) -> str:
    return html.unescape((site / uri / "index.html").read_text())


# ------------------------------------------------------------------ walked apart from docgen
def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                  ) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [((*path, name), sub), *command_paths(sub, (*path, name))]
    return found


def missing_from_cli_page(parser: argparse.ArgumentParser, page: str) -> list[str]:
    """Commands without their own section, and flags not named in it."""
    missing = []
    for path, sub in command_paths(parser):
        anchor = f'id="{"-".join(path)}"'
        if anchor not in page:
            missing.append(f"harnessrl {' '.join(path)}")
            continue
        section = page[page.index(anchor):]
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and f"<code>{flag}</code>" not in section:
                    missing.append(f"harnessrl {' '.join(path)} {flag}")
    return missing


def config_paths(cls: Any, prefix: str = "") -> list[str]:
    """Every key a config file may set (a section's `file_fields`, else all its fields), as
    the file spells it."""
    paths = []
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    for name in getattr(cls, "file_fields", fields):
        field = fields[name]
        nested = [t for t in (field.type, *getattr(field.type, "__args__", ()))
                  if isinstance(t, type) and issubclass(t, msgspec.Struct)]
        paths += config_paths(nested[0], f"{prefix}{field.encode_name}.") if nested \
            else [f"{prefix}{field.encode_name}"]
    return paths


# ------------------------------------------------------------------ the build
def test_strict_build_writes_every_page_and_llms_txt(site: Path):
    llms = (site / "llms.txt").read_text()
    for title in ("# The demo", "# Chains and rows", "# Command line", "# Train config",
                  "# Proxy HTTP API", "# Harnesses", "# Benchmarks", "# harnessrl design"):
        assert f"\n{title}\n" in llms, title
    # bench/results.md is included, not pasted: its own first line is in the page and in llms
    first = (ROOT / "bench" / "results.md").read_text().strip().splitlines()[0]
    assert first in llms and "--8<--" not in llms
    assert first.lstrip("# ").split("`")[0].strip() in _page(site, "benchmarks")
    assert "<!-- generated:" not in llms  # every marker in a written page was filled


def test_cli_reference_names_every_command_and_flag(site: Path):
    page = _page(site, "reference/cli")
    assert missing_from_cli_page(docgen.cli_parser(), page) == []
    assert len(command_paths(docgen.cli_parser())) >= 12


def test_the_cli_check_fails_on_a_command_the_page_lacks(site: Path):
    parser = docgen.cli_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("bogus").add_argument("--flag")
    serve = sub.choices["serve"]
    serve.add_argument("--not-documented")
    missing = missing_from_cli_page(parser, _page(site, "reference/cli"))
    assert missing == ["harnessrl serve --not-documented", "harnessrl bogus"]


def test_config_reference_names_every_field(site: Path):
    page = _page(site, "reference/config")
    fields = config_paths(TrainSettings)
    assert {"engine.max_tokens", "grpo.max_staleness", "rollout.agent_timeout",
            "cluster.address", "run_dir"} <= set(fields)
    assert [f for f in fields if f"<code>{f}</code>" not in page] == []
    assert docgen.config_fields(TrainSettings) == fields


def test_config_reference_carries_defaults_and_comments():
    """Each row shows the field's default as the config types have it, and the comments
    beside the fields reach the page: every field says what it is for."""
    rows = {line.split("`")[1]: line for line in docgen.config_page().splitlines()
            if line.startswith("| `")}
    defaults = {f"{prefix}{f.encode_name}": docgen.default_of(f)
                for prefix, section in docgen.config_sections(TrainSettings)
                for f in msgspec.structs.fields(section)}
    for name in config_paths(TrainSettings):
        assert f"`{docgen.toml_value(defaults[name])}`" in rows[name], rows[name]
    assert [name for name in rows if rows[name].rstrip().endswith("|  |")] == []
    assert "staleness" in rows["grpo.max_staleness"]


def test_the_config_reference_defaults_file_loads_as_the_defaults():
    import tomllib

    example = docgen.defaults_toml(TrainSettings)
    loaded = msgspec.convert(tomllib.loads(example), type=TrainSettings)
    # [cluster] and [lora] given: their defaults
    assert loaded == TrainSettings(cluster=loaded.cluster, lora=loaded.lora)


def test_http_reference_names_every_route_and_error(site: Path):
    page = _page(site, "reference/http-api")
    for method, path, _endpoint in docgen.proxy_routes():
        # model calls are listed once, served at the root and under /r/{key}
        shown = path if path.startswith("/r/{key}") and (method, path) in docgen.OWN_ROUTES \
            else path.removeprefix("/r/{key}")
        assert f"{method} {shown}" in page, (method, path)
    for kind in docgen.error_kinds():
        assert kind.__name__ in page
    assert "max_model_calls_exceeded" in page  # the step cap's code, as rendered


def test_a_route_without_a_description_fails_the_build(monkeypatch: pytest.MonkeyPatch):
    routes = dict(docgen.OWN_ROUTES)
    del routes[("POST", "/rollouts")]
    monkeypatch.setattr(docgen, "OWN_ROUTES", routes)
    with pytest.raises(ValueError, match="POST /rollouts"):
        docgen.http_page()


def test_harness_reference_names_every_registered_harness(site: Path):
    page = _page(site, "reference/harnesses")
    assert [name for name in MODULES if f"<code>{name}</code>" not in page] == []
    assert "copilot@anthropic" in page


def test_layout_reference_names_every_module(site: Path):
    import harnessrl

    page = _page(site, "reference/layout")
    package = Path(harnessrl.__file__).parent
    modules = [p for p in package.rglob("*.py") if "bundled_tasks" not in p.parts
               and (p.name != "__init__.py" or p.read_text().lstrip().startswith('"""'))]
    assert len(modules) > 100
    for module in modules:
        folder = str(module.parent.relative_to(package.parent))
        assert f"<code>{folder}/</code>" in page and f"<code>{module.name}</code>" in page


def test_a_page_left_out_of_the_nav_is_added(tmp_path: Path):
    (tmp_path / "a.md").write_text("# A\n")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "store.md").write_text("text\n\n# The store\n")
    config = mkdocs_hooks.on_config({"docs_dir": str(tmp_path), "nav": [{"A": "a.md"}]})
    assert config["nav"][-1] == {"More": [{"The store": "new/store.md"}]}


# ------------------------------------------------------------------ in a browser
def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    return path


@pytest.mark.slow
def test_the_built_site_opens_in_a_browser(site: Path):
    from playwright.sync_api import expect, sync_playwright
    from starlette.applications import Starlette
    from starlette.staticfiles import StaticFiles

    from harnessrl.proxy.serve import in_thread

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app = Starlette()
    app.mount("/", StaticFiles(directory=site, html=True))
    with in_thread(app) as (url, _server), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium())
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/")
        expect(page.locator("article h1")).to_contain_text("harnessrl")
        expect(page.locator("article")).to_contain_text("bash scripts/demo.sh")
        page.screenshot(path=ARTIFACTS / "docs-home.png")
        # Into the generated reference through the site's own navigation.
        page.locator("nav a", has_text="Train config").first.click()
        expect(page.locator("article h1")).to_contain_text("Train config")
        row = page.locator("article tr", has_text="grpo.max_staleness")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("4")
        page.goto(f"{url}/reference/cli/#serve")
        expect(page.locator("#serve")).to_be_visible()
        expect(page.locator("article")).to_contain_text("--engine-url")
        page.screenshot(path=ARTIFACTS / "docs-cli.png")
        browser.close()
        assert errors == []


def test_readme_is_short_has_the_two_commands_and_links_only_inside_the_repo():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    links = re.findall(r"\]\(([^)#]+)", readme)
    assert links, "the README links into the docs"
    for link in links:
        assert not link.startswith(("../", "/")) and (ROOT / link).exists(), link


def test_every_harnessrl_command_in_the_docs_parses(capsys: pytest.CaptureFixture[str]):
    """A command shown in the README or a page uses flags the CLI has (parsed, not run).
    A line with `...` in it is an abbreviation, and is not parsed."""
    import shlex

    shown = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", path.read_text(), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                if line.strip().startswith("harnessrl ") and "..." not in line:
                    shown.append((path.relative_to(ROOT), line.strip()))
    assert len(shown) >= 20
    bad = []
    for where, line in shown:
        try:
            docgen.cli_parser().parse_args(shlex.split(line, comments=True)[1:])
        except SystemExit:
            bad.append(f"{where}: {line}: {capsys.readouterr().err.strip().splitlines()[-1]}")
    assert bad == []


def test_every_train_config_in_the_docs_is_valid():
    """Each TOML block in the README and the pages is a valid (partial) train config."""
    import tomllib

    from harnessrl.train.config import TrainSettings

    blocks = [(path.relative_to(ROOT), block)
              for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
              for block in re.findall(r"```toml\n(.*?)```", path.read_text(), re.S)]
    assert len(blocks) >= 3
    for where, block in blocks:
        try:
            msgspec.convert(tomllib.loads(block), type=TrainSettings)
        except (tomllib.TOMLDecodeError, msgspec.ValidationError, ValueError) as exc:
            pytest.fail(f"{where}: {exc}\n{block}")

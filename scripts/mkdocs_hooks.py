"""mkdocs hooks (mkdocs.yml `hooks:`): the generated reference pages, every page reachable,
and `llms.txt`.

- The reference pages (`docgen.PAGES`, scripts/docgen.py beside this file: docs tooling,
  not part of the runtime package) are made from the code at build time; nothing
  generated is committed, so they cannot drift from it.
- `<!-- generated: NAME -->` in a written page is replaced by `docgen.SNIPPETS[NAME]`.
- A page under docs/ that the nav does not list is added under "More", so a page someone
  adds is always reachable.
- `site/llms.txt` is every page's Markdown in nav order, as one file, for agents.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import docgen  # scripts/docgen.py: mkdocs puts a hook's own folder on sys.path
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

_MARKER = re.compile(r"<!-- generated: ([\w-]+) -->")
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
_markdown: dict[str, str] = {}
_order: list[str] = []


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_listed(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_listed(value) for value in nav.values()))
    return set()


def _title(path: Path) -> str:
    heading = next((line[2:].strip() for line in path.read_text().splitlines()
                    if line.startswith("# ")), None)
    return heading or path.stem.replace("-", " ").capitalize()


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    listed = _listed(config["nav"])
    extra = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md")
                   if str(p.relative_to(docs)) not in listed)
    if extra:
        config["nav"].append({"More": [{_title(docs / uri): uri} for uri in extra]})
    return config


def on_files(files: Files, config: Any) -> Files:
    for uri, page in docgen.PAGES.items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} is generated at build time: remove the file")
        files.append(File.generated(config, uri, content=page()))
    # a placeholder, so pages may link to it; on_post_build writes the content
    files.append(File.generated(config, "llms.txt", content=""))
    return files


def on_nav(nav: Any, config: Any, files: Files) -> Any:
    _order[:] = [page.file.src_uri for page in nav.pages]
    return nav


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def generated(match: re.Match[str]) -> str:
        if match.group(1) not in docgen.SNIPPETS:
            raise PluginError(f"{page.file.src_uri}: no generated part {match.group(1)!r} "
                              f"(known: {', '.join(docgen.SNIPPETS)})")
        return docgen.SNIPPETS[match.group(1)]()

    markdown = _MARKER.sub(generated, markdown)
    _markdown[page.file.src_uri] = _SNIPPET.sub(
        lambda m: Path(m.group(1)).read_text().strip(), markdown)
    return markdown


def on_post_build(config: Any) -> None:
    parts = [f"# {config['site_name']}\n\n> {config['site_description']}\n"]
    parts += [_markdown[uri].strip() + "\n" for uri in _order if uri in _markdown]
    Path(config["site_dir"], "llms.txt").write_text("\n\n---\n\n".join(parts))

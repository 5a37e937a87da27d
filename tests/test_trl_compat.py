"""The one door to TRL's and transformers' private names (train/trl_compat.py, issue 48
item 5): every private name it relies on exists in the installed TRL and transformers, a
missing one is named with what it is used for, the async trainer is found where the
installed version keeps it (1.16: `trl.experimental.async_grpo`; 1.18: `trl`), and no
other module of src/ reaches for a private name of theirs."""

from __future__ import annotations

import io
import re
import sys
import tokenize
import types
from pathlib import Path

import pytest

import harnessrl
from harnessrl.train import trl_compat
from harnessrl.train.trl_compat import EXPERIMENTAL, PRIVATE, STABLE, Private, missing


def _fail_naming(absent: list[str]) -> None:
    if absent:
        pytest.fail("the installed TRL/transformers lack private names harnessrl relies on "
                    "(train/trl_compat.py):\n" + "\n".join(absent))


def test_every_private_name_exists_in_the_installed_transformers() -> None:
    _fail_naming(missing(tuple(p for p in PRIVATE if p.owner == "transformers.Trainer")))


@pytest.mark.slow  # TRL's trainers import vLLM (~20-50 s)
def test_every_private_name_exists_in_the_installed_trl() -> None:
    _fail_naming(missing(tuple(p for p in PRIVATE if p.owner != "transformers.Trainer")))


def test_a_missing_private_name_is_named_with_its_use() -> None:
    """The check can fail: stand-ins (named as such) that lack a method, an attribute set
    in `__init__` and a keyword are each reported."""

    class StandInTrainer:
        def __init__(self) -> None:
            self._metrics = {}

        def save_model(self, output_dir: str) -> None: ...

    items = (Private("stand-in", "_save_scaler", "attribute", "the scaler"),
             Private("stand-in", "_metrics", "instance attribute", "the sink"),
             Private("stand-in", "_trained_groups", "instance attribute", "the groups"),
             Private("stand-in", "save_model(_internal_call)", "parameter", "no hub push"),
             Private("stand-in", "save_model(output_dir)", "parameter", "the path"))
    absent = missing(items, {"stand-in": lambda: StandInTrainer})
    assert absent == ["stand-in._save_scaler (attribute): the scaler",
                      "stand-in._trained_groups (instance attribute): the groups",
                      "stand-in.save_model(_internal_call) (parameter): no hub push"]


def test_the_installed_version_chooses_where_the_async_trainer_is_looked_for() -> None:
    assert trl_compat.places((1, 16, 0)) == (EXPERIMENTAL, STABLE)
    assert trl_compat.places((1, 18, 0)) == (STABLE, EXPERIMENTAL)
    assert trl_compat.trl_version() >= trl_compat.OLDEST


def test_trls_async_trainer_is_found_where_a_newer_trl_keeps_it(monkeypatch) -> None:
    """TRL 1.18 exports the async trainer from `trl` itself, its modules elsewhere: a
    stand-in `trl` of that layout (named as such) is found without the experimental one."""
    package = types.ModuleType("newtrl")
    trainer_module = types.ModuleType("newtrl.async_grpo_trainer")
    packing = types.ModuleType("newtrl.packing")

    class AsyncGRPOTrainer:
        __module__ = "newtrl.async_grpo_trainer"

    trainer_module.RolloutSample = object  # type: ignore[attr-defined]
    stand_in = types.ModuleType("trl")
    stand_in.AsyncGRPOTrainer = AsyncGRPOTrainer  # type: ignore[attr-defined]
    stand_in.AsyncGRPOConfig = dict  # type: ignore[attr-defined]
    for name, module in [("newtrl", package), ("newtrl.async_grpo_trainer", trainer_module),
                         ("newtrl.packing", packing), ("trl", stand_in)]:
        monkeypatch.setitem(sys.modules, name, module)
    found = trl_compat.find_async_trl(trl_compat.places((1, 18, 0)))
    assert found.trainer is AsyncGRPOTrainer and found.config is dict
    assert found.trainer_module is trainer_module and found.packing is packing
    assert found.rollout_sample is object


def test_no_trl_at_all_is_an_error_naming_every_place_tried(monkeypatch) -> None:
    for name in (STABLE, EXPERIMENTAL):  # stand-ins without the trainer, named as such
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    with pytest.raises(ImportError, match=r"tried trl: .*; trl\.experimental\.async_grpo: "
                                          r".*TRL >= 1\.16"):
        trl_compat.find_async_trl((STABLE, EXPERIMENTAL))


# Private names of TRL's and transformers' trainers, kernels and modules we use: only
# train/trl_compat.py may spell them (matched in code with a space between tokens).
_PRIVATE_USE = re.compile(
    r"(\. |def )_(save_optimizer_and_scheduler|save_scaler|save_rng_state|save_checkpoint"
    r"|sync_weight|metrics|rollout_dataset|trained_groups|flash_attn)\b"
    r"|\b_internal_call\b|\btrl \. experimental\b|setattr \( \w+ \. (packing|trainer_module)\b")


def _code_lines(source: str) -> dict[int, str]:
    """Each line's code tokens, spaced, without strings and comments (a docstring may
    name what it likes)."""
    lines: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
            lines.setdefault(token.start[0], []).append(token.string)
    return {n: " ".join(words) for n, words in lines.items()}


def test_the_private_name_scan_sees_a_use() -> None:
    """The scan below can fail: a call, an override, a keyword and a module patch are each
    seen; a docstring and a name of ours that merely ends alike are not."""
    seen = ("trainer._save_rng_state(out)\n", "def _sync_weight(self): ...\n",
            "m.save_model(p, _internal_call=True)\n", "setattr(trl.packing, 'x', f)\n",
            "from trl.experimental.async_grpo import x\n", "self._metrics['train']\n")
    unseen = ('"""calls trainer._save_scaler"""\n', "group_metrics(report)\n",
              "x.attach_metrics(t)\n")
    assert all(_PRIVATE_USE.search(_code_lines(line)[1]) for line in seen)
    assert not any(_PRIVATE_USE.search(_code_lines(line).get(1, "")) for line in unseen)


def test_no_other_module_touches_trls_private_names() -> None:
    src = Path(harnessrl.__file__).resolve().parent
    door = src / "train" / "trl_compat.py"
    found = [f"{path.relative_to(src)}:{n}: {code}"
             for path in sorted(src.rglob("*.py")) if path != door
             for n, code in sorted(_code_lines(path.read_text()).items())
             if _PRIVATE_USE.search(code)]
    assert not found, "private TRL/transformers names outside train/trl_compat.py:\n" + \
        "\n".join(found)

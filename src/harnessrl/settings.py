"""The settings layer: a settings type's fields are also its command-line flags.

Settings types (msgspec Structs and dataclasses: `RolloutSettings`, `Shaping`,
`EngineSettings`, `ProxySettings`, `ClusterSettings`, ...) are what config files decode into
and what components take. A field that is also a flag says so in its annotation
(the wire's `Sampling` knows nothing of flags: its are declared in cli/common.py),
`concurrency: Annotated[int, flag("rollouts at once")] = 2`. `add_flags` declares such
fields on an argparse parser with the field's own default (never restated) and help, and
`from_flags` builds the settings back from the parsed flags: one place per component.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import msgspec

T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    """How a settings field appears on the command line (in the field's `Annotated`)."""

    help: str | None = None
    names: tuple[str, ...] = ()  # option strings; default: --the-field-name
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # argparse `type`; default: the field's type
    choices: tuple[str, ...] | None = None  # default: a Literal field's values
    scale: float = 1.0  # the flag's value is the field's times this (ms for s, MiB for B)
    negate: bool = False  # a bool on by default that the flag turns off (--no-hide)


def flag(help: str | None = None, *names: str, metavar: str | None = None,
         parse: Callable[[str], Any] | None = None, choices: tuple[str, ...] | None = None,
         scale: float = 1.0, negate: bool = False) -> Flag:
    return Flag(help=help, names=names, metavar=metavar, parse=parse, choices=choices,
                scale=scale, negate=negate)


@dataclass(frozen=True)
class Field:
    """One flagged field of a settings type."""

    owner: type
    name: str
    kind: Any  # the annotation without Annotated and None
    default: Any
    flag: Flag

    @property
    def option_strings(self) -> tuple[str, ...]:
        return self.flag.names or ("--" + self.name.replace("_", "-"),)

    @property
    def dest(self) -> str:
        """The namespace attribute it is parsed into: its first long option's name (a negated
        flag's is the field's own)."""
        if self.flag.negate:
            return self.name
        long = next((o for o in self.option_strings if o.startswith("--")),
                    self.option_strings[0])
        return long.lstrip("-").replace("-", "_")

    @property
    def repeated(self) -> bool:
        return get_origin(self.kind) in (tuple, list, Sequence, typing.Sequence)

    def cli_default(self) -> Any:
        """The field's default as the flag's."""
        if self.repeated:
            return list(self.default)
        if self.flag.scale != 1.0 and self.default is not None:
            return self.default * self.flag.scale
        return self.default

    def to_setting(self, value: Any) -> Any:
        """A parsed flag's value as the field's."""
        if value is None:
            return None
        if self.repeated:
            return tuple(value) if get_origin(self.kind) is not list else list(value)
        if self.flag.scale != 1.0:
            value = value / self.flag.scale
        if self.kind is int:
            return int(value)
        return str(value) if self.kind is str else value


def flagged(cls: type, flags: Mapping[str, Flag] | None = None) -> dict[str, Field]:
    """`cls`'s fields that are flags, by name, in declaration order: those whose annotation
    says so, or those `flags` names (the flags of a type that knows nothing of the command
    line, such as the wire's `Sampling`, are declared beside the commands)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = {}
    for name, default in _defaults(cls).items():
        kind, annotated = _unwrap(hints[name])
        chosen = annotated[:1] if flags is None else [flags[name]] if name in flags else []
        if chosen:
            found[name] = Field(cls, name, kind, default, chosen[0])
    return found


def add_flags(parser: Any, cls: type, *names: str, helps: dict[str, str] | None = None,
              flags: Mapping[str, Flag] | None = None) -> None:
    """Declare `cls`'s flagged fields (all, or those named, in that order) on `parser`
    (a parser or an argument group); `helps`: a command's own help for some of them;
    `flags`: the fields' flags, for a type whose annotations declare none."""
    fields = flagged(cls, flags)
    for name in names or tuple(fields):
        field = fields[name]
        options = _argparse_options(field)
        if helps and name in helps:
            options["help"] = helps[name]
        action = parser.add_argument(*field.option_strings, **options)
        action.setting = field  # read by the test that flag and field defaults agree


def from_flags(cls: type[T], args: argparse.Namespace, *,
               flags: Mapping[str, Flag] | None = None, **given: Any) -> T:
    """`cls` from the parsed flags of its fields (those the parser declared), and `given`;
    `flags` as for `add_flags`."""
    values = {name: field.to_setting(getattr(args, field.dest))
              for name, field in flagged(cls, flags).items() if hasattr(args, field.dest)}
    return cls(**{**values, **given})


def file_keys(cls: type, raw: Any, where: str = "$") -> None:
    """Refuse a key `cls` (a settings struct) decodes but a config file may not set: a
    struct's `file_fields` (all its fields if it names none), in msgspec's own words."""
    if not isinstance(raw, dict):
        return
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    allowed = getattr(cls, "file_fields", None)
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            continue  # msgspec refuses it
        if allowed is not None and field.name not in allowed:
            raise msgspec.ValidationError(f"Object contains unknown field `{key}` - at "
                                          f"`{where}`")
        if (section := section_of(field.type)) is not None:
            file_keys(section, value, f"{where}.{key}")


def section_of(kind: Any) -> type | None:
    """The config section type a field holds (`cluster: ClusterSettings | None` too)."""
    for candidate in (kind, *typing.get_args(kind)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def file_fields(cls: type) -> list[msgspec.structs.FieldInfo]:
    """The fields of a config section a file may set (`file_fields`, else all)."""
    allowed = getattr(cls, "file_fields", None)
    fields = msgspec.structs.fields(cls)
    if allowed is None:
        return list(fields)
    by_name = {f.name: f for f in fields}
    return [by_name[name] for name in allowed]


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return value


def interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"milliseconds from 0 to 1000, got {text!r}")
    return value


def json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object is needed, e.g. '{\"a\": 1}'")
    return value


def readable_file(path: str) -> str:
    """A flag that names a text file (a chat template): refused at once if it cannot be
    read; the setting keeps the path."""
    try:
        Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    return path


def _argparse_options(field: Field) -> dict[str, Any]:
    f = field.flag
    options: dict[str, Any] = {"help": f.help, "default": field.cli_default(),
                               "dest": field.dest}
    if field.kind is bool:
        options["action"] = "store_false" if f.negate else "store_true"
        return options
    if f.metavar:
        options["metavar"] = f.metavar
    kind = get_args(field.kind)[0] if field.repeated else field.kind
    if field.repeated:
        options["action"] = "append"
    if get_origin(kind) is Literal or f.choices:
        options["choices"] = list(f.choices or get_args(kind))
    elif f.parse or kind in (int, float, str, Path):
        options["type"] = f.parse or kind
    return options


def _unwrap(hint: Any) -> tuple[Any, list[Flag]]:
    """`Annotated[X | None, Flag(...)]` -> (X, [Flag(...)]), through nested Annotated."""
    flags: list[Flag] = []
    while True:
        if get_origin(hint) is Annotated:
            flags += [m for m in hint.__metadata__ if isinstance(m, Flag)]
            hint = hint.__origin__
        elif get_origin(hint) in (typing.Union, types.UnionType):
            rest = [a for a in get_args(hint) if a is not type(None)]
            if len(rest) != 1:
                return hint, flags
            hint = rest[0]
        else:
            return hint, flags


def _defaults(cls: type) -> dict[str, Any]:
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default if f.default is not dataclasses.MISSING
                else f.default_factory() if f.default_factory is not dataclasses.MISSING
                else None for f in dataclasses.fields(cls)}
    return {f.name: f.default if f.default is not msgspec.NODEFAULT
            else f.default_factory() if f.default_factory is not msgspec.NODEFAULT
            else None for f in msgspec.structs.fields(cls)}

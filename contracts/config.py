"""Typed configuration dataclasses shared by the entry points (the trainer's ``Config``, eval's ``EvalConfig``).

A config is a dataclass whose annotations are the contract: YAML presets and ``key=value`` overrides are coerced to
each field's declared type, and a choice field is typed once as a ``Literal`` and validated from that type, so its
choices are never written twice (``choices(Config, "engine")`` gives them to argparse and to messages). Unknown keys
get a "did you mean" from the field names. Every error is a ``ConfigError`` whose message names the field (and the
file) and says what to do; entry points print it as one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import re
import types
import typing
from pathlib import Path
from typing import Collection, Literal, TypeVar

import yaml

from contracts.files import atomic_write_text

__all__ = ["ConfigError", "choices", "field_types", "field_help", "coerce", "split_override", "parse_overrides", "read_preset",
           "build", "load", "to_dict", "dump_yaml", "Literal"]

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


def field_types(cls) -> dict[str, object]:
    """Field name -> resolved annotation of a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _literal_args(tp) -> tuple | None:
    """The choices of ``Literal[...]`` (also inside ``Optional``), else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            if typing.get_origin(a) is Literal:
                return typing.get_args(a)
    return None


def choices(cls, name: str) -> tuple:
    """The allowed values of a ``Literal``-typed field of ``cls`` (ValueError for a field that is not a choice)."""
    tp = field_types(cls)[name]
    args = _literal_args(tp)
    if args is None:
        raise ValueError(f"{cls.__name__}.{name} is not a choice field (annotate it with Literal[...])")
    return args


_FIELD_LINE = re.compile(r"^    (\w+):[^#]*?(?:#\s?(.*))?$")
_COMMENT_LINE = re.compile(r"^\s+#\s?(.*)$")
_SECTION = re.compile(r"^    # -+ (.+?) -+$")


def field_help(cls) -> str:
    """Every field of a config dataclass with its default and the comment beside it in the source (a comment on
    the lines below continues it), grouped under the source's ``# --- section ---`` headers: ``--help``'s list."""
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else
                         f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                for f in dataclasses.fields(cls)}
    out: list[str] = []
    last: list[str] | None = None
    for line in inspect.getsource(cls).splitlines()[1:]:
        if (m := _SECTION.match(line)):
            out.append(f"\n{m.group(1)}:")
            last = None
        elif (m := _FIELD_LINE.match(line)) and m.group(1) in defaults:
            entry = [f"  {m.group(1)}={defaults[m.group(1)]!r}"] + ([m.group(2).strip()] if m.group(2) else [])
            out.append(entry)
            last = entry
        elif last is not None and (m := _COMMENT_LINE.match(line)):
            last.append(m.group(1).strip())
        else:
            last = None
    lines = []
    for item in out:
        if isinstance(item, str):
            lines.append(item)
        else:
            head, *words = item
            lines.append(head + (f"  {' '.join(words)}" if words else ""))
    return "\n".join(lines).strip("\n")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def coerce(name: str, value, tp):
    """``value`` (from YAML or the command line) as the declared type ``tp``, or ConfigError naming the field."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        for a in allowed:   # "1" on the command line for Literal[1, 2], True for Literal[True]
            if value == a or (isinstance(value, (str, int, float)) and not isinstance(a, bool)
                              and str(value) == str(a)):
                return a
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        raise ConfigError(f"config field '{name}' must be one of {', '.join(map(str, allowed))}; got {value!r}"
                          + (f" (did you mean '{close[0]}'?)" if close else ""))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            return None
        return coerce(name, value, args[0])
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif tp in (int, float):   # an int field takes ints only; a float field ints and floats (never a bool)
        if isinstance(value, (int,) if tp is int else (int, float)) and not isinstance(value, bool):
            return tp(value)
        if isinstance(value, str):
            try:
                return tp(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif tp in (dict, tuple, list) or origin in (dict, tuple, list):
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        want = {dict: dict, tuple: tuple, list: list}[origin or tp]
        if want is dict and isinstance(value, dict):
            return value
        if want is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if want is list:
            if isinstance(value, (list, tuple)):
                return list(value)
            if isinstance(value, str):   # a comma-separated list on the command line
                return [v.strip() for v in value.split(",") if v.strip()]
    raise ConfigError(f"config field '{name}' expects {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def split_override(text: str) -> tuple[str, object]:
    """``key=value`` -> (key, YAML-parsed value); an empty value is the empty string."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value (e.g. total_steps=10)")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value   # e.g. "a: b" text: kept as the string the user typed
    return key.strip(), parsed


def parse_overrides(overrides) -> dict:
    """A list of ``key=value`` strings (or a dict) as a dict, later keys winning."""
    if isinstance(overrides, dict):
        return dict(overrides)
    return dict(split_override(o) for o in overrides)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key '{key}' is given twice (first on line "
                                  f"{seen[key]}); keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_preset(path: str | os.PathLike, *, where: str = "") -> dict:
    """A YAML preset: a flat mapping of config fields (ConfigError for a missing file, bad YAML, a key given twice,
    or a non-mapping)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist" + (f" (presets live in {where})" if where else ""))
    try:
        loaded = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a preset is a flat mapping of config fields, got {type(loaded).__name__}")
    return loaded


def build(cls: type[C], values: dict, *, source: str = "config", fields_doc: str = "",
          command_line: Collection[str] = ()) -> C:
    """An instance of the config dataclass ``cls`` from ``values``: unknown keys refused with a close match, each
    value coerced to its field's type (``Literal`` choices checked). Cross-field checks are the caller's.
    ``source`` names where the values come from in errors, except the keys in ``command_line`` (overrides given as
    ``key=value``), which are blamed on the command line, not the file."""
    types_ = field_types(cls)
    unknown = sorted(set(values) - set(types_))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, types_, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        where = "command line" if set(unknown) <= set(command_line) else source
        raise ConfigError(f"{where}: unknown config key(s) {', '.join(hints)}"
                          + (f"; see {fields_doc} for the fields" if fields_doc else ""))
    kwargs = {}
    for k, v in values.items():
        try:
            kwargs[k] = coerce(k, v, types_[k])
        except ConfigError as exc:
            where = "command line" if k in command_line else source
            raise ConfigError(f"{where}: {exc}" if where not in ("config", "command line") else str(exc)) from None
    return cls(**kwargs)


def load(cls: type[C], path: str | os.PathLike | None, overrides=(), *, where: str = "", fields_doc: str = "") -> C:
    """A preset file (optional) with ``key=value`` overrides applied on top, built into ``cls``."""
    values, source = {}, "command line"
    if path:
        values, source = read_preset(path, where=where), str(path)
    given = parse_overrides(overrides)
    values.update(given)
    return build(cls, values, source=source, fields_doc=fields_doc, command_line=set(given))


def to_dict(cfg) -> dict:
    """The config as plain YAML/JSON data (tuples as lists)."""
    out = dataclasses.asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def dump_yaml(cfg, path: str | os.PathLike) -> None:
    """Write the config as YAML atomically (a reader never sees half a file)."""
    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))

""""This folder was written with other settings": the one check every resumable writer makes.

A resumable output (an ``eval.run`` results file, a relay folder, a demo or premise folder, a training run) records
the settings that decide its content; a rerun into it compares them and refuses a difference, naming each field
with both values and what to do, instead of mixing two experiments in one file. ``settings_diff`` is the
comparison, ``check_settings`` raises it, ``claim_folder`` is the marker-file form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping

from contracts.files import atomic_write_json

__all__ = ["SettingsMismatch", "settings_diff", "describe_diff", "check_settings", "claim_folder"]

_ABSENT = object()


class SettingsMismatch(ValueError):
    """An output written with other settings than this run's; the message names the fields and the fix."""


def settings_diff(have: Mapping, want: Mapping, keys: Iterable[str] | None = None, *,
                  defaults: Mapping | None = None) -> list[tuple[str, object, object]]:
    """(key, recorded value, this run's value) for each key whose values differ. ``keys``: the keys compared
    (default: every key of ``want``); ``defaults``: the value a key missing from ``have`` stands for (a field added
    after the output was written had its default then). JSON round-trips both sides, so tuples equal lists."""
    have = json.loads(json.dumps(dict(have), default=str))
    want = json.loads(json.dumps(dict(want), default=str))
    defaults = json.loads(json.dumps(dict(defaults or {}), default=str))
    out = []
    for k in (list(keys) if keys is not None else list(want)):
        old = have.get(k, defaults.get(k, None))
        new = want.get(k)
        if old != new:
            out.append((k, old, new))
    return out


def describe_diff(diff: list[tuple[str, object, object]]) -> str:
    return "; ".join(f"{k}: recorded {a!r}, now {b!r}" for k, a, b in diff)


def check_settings(have: Mapping, want: Mapping, keys: Iterable[str] | None = None, *, where: str,
                   fix: str, defaults: Mapping | None = None) -> None:
    """SettingsMismatch ``<where> was written with other settings (<diff>); <fix>`` when they differ."""
    diff = settings_diff(have, want, keys, defaults=defaults)
    if diff:
        raise SettingsMismatch(f"{where} was written with other settings ({describe_diff(diff)}); {fix}")


def claim_folder(folder: str | os.PathLike, marker: str, settings: Mapping, *, owner: str, fix: str,
                 keys: Iterable[str] | None = None, defaults: Mapping | None = None) -> bool:
    """Make ``folder`` this writer's: create it with ``marker`` (JSON of ``settings``) or check the marker it has.

    Returns True when the folder was claimed now, False when it was already this writer's with the same settings.
    SettingsMismatch when the marker records other settings, or when the folder holds files but no marker (it was
    not written by ``owner``, and nothing in it is touched). ``defaults``: what a key missing from an existing
    marker stands for (``settings_diff``; a field the writer began recording after the folder was written)."""
    folder = Path(folder)
    path = folder / marker
    if path.is_file():
        try:
            have = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SettingsMismatch(f"{path}: not valid JSON ({exc.msg}); delete the folder or choose another") from None
        check_settings(have, settings, keys, where=f"'{folder}'", fix=fix, defaults=defaults)
        return False
    if folder.is_dir() and any(folder.iterdir()):
        raise SettingsMismatch(f"'{folder}' is not empty and was not written by {owner} (no {marker}); "
                               f"choose another folder")
    atomic_write_json(path, dict(settings), sort_keys=True, default=str)
    return True

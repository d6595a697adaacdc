"""Provides the live UI's settings: a flat TOML file under the config dir, overridden by command-line flags.

The file (``settings.toml`` under `decodetop.paths.config_dir()`, or the path given by ``--config``) holds a few
scalar keys::

    model = "glm-5-nvfp4"          # a built-in preset (decodetop budget --list-models), or instead:
    # config = "/models/glm-5/config.json"    a local checkpoint's config.json (or its directory)
    tp = 8
    observed_ms = 95.0
    target_tps = 309.0
    theme = "decodetop-dark"
    tick_s = 1.0

A missing file means the defaults. A malformed file, an unknown key or a value of the wrong type (a theme that
does not exist included, when the caller names the themes) raises `decodetop.errors.UserInputError` naming the file,
the key and the problem; the file itself is never rewritten on a read.

Flags override the file for one run only. When the user changes what the UI remembers (`t` cycles the theme: the
one choice kept; `m` and `p` change the model and TP for the session only), `save_changes` re-reads the file and
rewrites just those keys, so one-off flags such as ``--tp 2 --observed-ms 12.5`` never replace the stored values
and the rest of the file (comments included) stays as it was. `save_settings` writes a whole table. Both write
atomically, keep the file's mode and write through a symlinked file (`decodetop.atomic`).

Stdlib only (tomllib on 3.11+, tomli before).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodetop import paths
from decodetop.atomic import write_text_atomic
from decodetop.defaults import DEFAULT_MODEL, DEFAULT_OBSERVED_MS, DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError
from decodetop.jsonio import problem_of, read_bounded
from decodetop.quantity import OBSERVED_MS, TARGET_TPS, TICK_S, Quantity, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

SETTINGS_FILE_NAME = "settings.toml"
MAX_SETTINGS_BYTES = 1024 * 1024
"""A settings file is a handful of lines; anything larger than this is not one."""

DEFAULT_THEME = "decodetop-dark"
DEFAULT_TICK_S = 1.0
"""docs/reference/peers.md §2: nvitop's shortest refresh is 0.25 s because NVML calls are slow; 1 s is the usual monitor
tick."""


@dataclass(frozen=True)
class Settings:
    """What the live UI shows and how often; every field has a flag of the same name."""

    model: str = DEFAULT_MODEL
    """A built-in model preset's name (`decodetop budget --list-models`); not used while `config` names one."""
    config: str | None = None
    """A local checkpoint's config.json (or its directory): the model instead of a preset. The model is stored as
    what it is (the key says it: `model` a preset, `config` a path), never guessed back from a string."""
    tp: int | None = None
    """Tensor-parallel degree; None means the number of GPUs (or CPU ranks) found."""
    observed_ms: float = DEFAULT_OBSERVED_MS
    """The decode step time the serving engine shows, in milliseconds."""
    target_tps: float = DEFAULT_TARGET_TPS
    """The single-stream throughput the deployment should reach, in tokens per second."""
    theme: str = DEFAULT_THEME
    """Name of a registered theme (see `decodetop.themes.THEME_NAMES`)."""
    tick_s: float = DEFAULT_TICK_S
    """Telemetry period in seconds."""

    @property
    def model_ref(self) -> tuple[str, str]:
        """The model as (kind, value): ("config", path) where `config` is set, else ("preset", name)."""
        return ("config", self.config) if self.config else ("preset", self.model)

    @property
    def model_label(self) -> str:
        """The model in a few words: the preset's name, or the checkpoint's path."""
        return self.config or self.model

    @property
    def target_ms(self) -> float:
        """The target step time in milliseconds (1000 / target_tps)."""
        return 1000.0 / self.target_tps

    def __post_init__(self) -> None:
        _check_values(self, "settings")


_QUANTITIES: dict[str, Quantity] = {"observed_ms": OBSERVED_MS, "target_tps": TARGET_TPS, "tick_s": TICK_S}
"""The numeric settings and the range each must fall in (`decodetop.quantity`)."""


def _check_values(settings: Settings, where: str) -> None:
    if not settings.model.strip():
        raise UserInputError(f"{where}: model must not be empty")
    if "/" in settings.model or settings.model.endswith(".json"):
        raise UserInputError(
            f"{where}: model {settings.model!r} is not a preset name; a checkpoint's config.json goes under "
            f"config = {settings.model!r}"
        )
    if settings.config is not None and not settings.config.strip():
        raise UserInputError(f"{where}: config must not be empty")
    if settings.tp is not None and not 1 <= settings.tp <= 1024:
        raise UserInputError(f"{where}: tp must be between 1 and 1024, got {shown(settings.tp)}")
    for name, quantity in _QUANTITIES.items():
        quantity.check(getattr(settings, name), f"{where}: {name}")


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "config": (str,),
    "tp": (int,),
    "observed_ms": (int, float),
    "target_tps": (int, float),
    "theme": (str,),
    "tick_s": (int, float),
}


def default_settings_path() -> Path:
    """`settings.toml` under the user's config dir (DECODETOP_CONFIG_DIR overrides)."""
    return paths.config_dir() / SETTINGS_FILE_NAME


def settings_from_mapping(data: Mapping[str, Any], where: str) -> Settings:
    """Build `Settings` from a parsed TOML table; unknown keys and wrong types raise `UserInputError`."""
    unknown = sorted(set(data) - set(_FIELD_TYPES))
    if unknown:
        known = ", ".join(_FIELD_TYPES)
        raise UserInputError(f"{where}: unknown setting {unknown[0]!r} (known: {known})")
    values: dict[str, Any] = {}
    for key, value in data.items():
        value_any: Any = value
        allowed = _FIELD_TYPES[key]
        if isinstance(value, bool) or not isinstance(value, allowed):
            wanted = " or ".join(t.__name__ for t in allowed)
            raise UserInputError(f"{where}: {key} must be {wanted}, got {type(value).__name__} {shown(value)}")
        values[key] = _QUANTITIES[key].check(value_any, f"{where}: {key}") if key in _QUANTITIES else value_any
    if "model" in values and "config" in values:
        raise UserInputError(f"{where}: model and config name the model twice: keep one of them")
    try:
        return Settings(**values)
    except UserInputError as exc:
        raise UserInputError(f"{where}: {str(exc).removeprefix('settings: ')}") from None


def _read_table(target: Path) -> dict[str, Any]:
    """Parse the TOML file at `target` (which exists); every failure is one `UserInputError` line naming it."""
    raw = read_bounded(target, max_bytes=MAX_SETTINGS_BYTES)
    try:
        table: dict[str, Any] = tomllib.loads(raw.decode("utf-8").removeprefix("\ufeff"))  # editors may add a BOM
    except UnicodeDecodeError:
        raise UserInputError(f"{target}: settings file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserInputError(f"{target}: not valid TOML ({exc})") from None
    except RecursionError:
        raise UserInputError(f"{target}: not valid TOML (nested too deeply)") from None
    except ValueError as exc:  # an integer beyond the int/str conversion limit
        raise UserInputError(f"{target}: not valid TOML ({problem_of(exc)})") from None
    return table


def _check_theme(settings: Settings, themes: Collection[str] | None, where: str) -> None:
    if themes is not None and settings.theme not in themes:
        raise UserInputError(f"{where}: theme {settings.theme!r} is not one of {', '.join(themes)}")


def load_settings(path: Path | None = None, themes: Collection[str] | None = None) -> Settings:
    """Read the settings file; a missing file gives the defaults, a bad one a `UserInputError` naming it.

    Given `themes` (the registered theme names), a theme outside them is an error naming the file and the key."""
    target = path if path is not None else default_settings_path()
    if not target.exists() and not target.is_symlink():
        if path is not None:
            raise UserInputError(f"{target}: settings file not found")
        return Settings()
    settings = settings_from_mapping(_read_table(target), str(target))
    _check_theme(settings, themes, str(target))
    return settings


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, float):
        return repr(value)
    return str(value)


def dumps_settings(settings: Settings) -> str:
    """The TOML text of `settings`, one key per line; `tp` is left out while it is None (automatic), `model` while
    `config` names the model."""
    lines = ["# decodetop settings; flags of the same name override these."]
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if value is None or (field.name == "model" and settings.config):
            continue
        lines.append(f"{field.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write `settings` atomically (temp file + rename) and return the path written."""
    target = path if path is not None else default_settings_path()
    write_text_atomic(target, dumps_settings(settings))
    return target


def _key_line(key: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*=")


def save_changes(path: Path | None, changed: Mapping[str, Any]) -> Path:
    """Store just the `changed` settings (what the user changed in the UI), leaving every other line of the file
    as it is; a None value removes the key (back to automatic). Returns the path written.

    The file is re-read first, so values given as flags for this run, and edits made by hand or by another
    process since the start, are kept. A file that no longer parses is not touched: `UserInputError`."""
    target = path if path is not None else default_settings_path()
    unknown = sorted(set(changed) - set(_FIELD_TYPES))
    if unknown:
        raise UserInputError(f"settings: unknown setting {unknown[0]!r}")
    exists = target.exists()
    if exists:
        current = _read_table(target)
        text = read_bounded(target, max_bytes=MAX_SETTINGS_BYTES).decode("utf-8").removeprefix("\ufeff")
    else:
        current, text = {}, "# decodetop settings; flags of the same name override these.\n"
    merged = dict(current)
    lines = text.splitlines()
    for key, value in changed.items():
        pattern = _key_line(key)
        lines = [line for line in lines if not pattern.match(line)] if value is None else lines
        if value is None:
            merged.pop(key, None)
            continue
        merged[key] = value
        new_line = f"{key} = {_toml_value(value)}"
        for index, line in enumerate(lines):
            if pattern.match(line):
                lines[index] = new_line
                break
        else:
            lines.append(new_line)
    settings_from_mapping(merged, str(target))  # refuse to store a value the next start would refuse
    new_text = "\n".join(lines) + "\n"
    try:
        if tomllib.loads(new_text) != merged:
            raise ValueError("edit did not give the intended table")
    except ValueError:  # a key spread over several lines: write the file's keys, one a line, instead
        body = "".join(f"{key} = {_toml_value(value)}\n" for key, value in merged.items())
        write_text_atomic(target, "# decodetop settings; flags of the same name override these.\n" + body)
        return target
    write_text_atomic(target, new_text)
    return target


def with_overrides(settings: Settings, **overrides: Any) -> Settings:
    """`settings` with every override that is not None applied (flags left unset leave the file's value). A model
    given (`model` or `config`) replaces the file's model, whichever key it was under."""
    changes: dict[str, Any] = {key: value for key, value in overrides.items() if value is not None}
    unknown = sorted(set(changes) - set(_FIELD_TYPES))
    if unknown:
        raise UserInputError(f"settings: unknown setting {unknown[0]!r}")
    if "model" in changes and "config" in changes:
        raise UserInputError("--model and --config name the model twice: give one of them")
    if "model" in changes:
        changes["config"] = None  # a preset named now replaces the file's checkpoint
    return dataclasses.replace(settings, **changes)

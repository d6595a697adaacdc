"""Settings: TOML file under the config dir, flags override, bad files give one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodetop.errors import UserInputError
from decodetop.settings import (
    Settings,
    default_settings_path,
    dumps_settings,
    load_settings,
    save_settings,
    with_overrides,
)


@pytest.fixture(autouse=True)
def _config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECODETOP_CONFIG_DIR", str(tmp_path / "cfg"))


def test_missing_default_file_gives_defaults() -> None:
    settings = load_settings()
    assert settings == Settings()
    assert settings.observed_ms == 95.0
    assert settings.target_ms == pytest.approx(1000 / 309)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="settings file not found"):
        load_settings(tmp_path / "nope.toml")


def test_round_trip_through_the_default_path() -> None:
    wanted = Settings(model="llama-3.1-70b", tp=4, observed_ms=12.5, target_tps=100.0, theme="decodetop-light")
    written = save_settings(wanted)
    assert written == default_settings_path()
    assert load_settings() == wanted
    assert "tp = 4" in written.read_text()


def test_tp_none_is_left_out_of_the_file() -> None:
    assert "tp =" not in dumps_settings(Settings())


def test_integers_are_accepted_for_floats(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("observed_ms = 40\ntarget_tps = 50\n")
    settings = load_settings(path)
    assert settings.observed_ms == 40.0
    assert isinstance(settings.observed_ms, float)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("model = ", "not valid TOML"),
        ("colour = 'red'\n", "unknown setting 'colour'"),
        ("tp = 'eight'\n", "tp must be int"),
        ("tp = true\n", "tp must be int"),
        ("observed_ms = -1\n", "observed_ms must be a positive number"),
        ("tick_s = 0.01\n", "tick_s must be at least"),
        ("tp = 0\n", "tp must be between"),
        ('model = "  "\n', "model must not be empty"),
    ],
)
def test_bad_files_name_the_file_and_the_problem(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(UserInputError) as info:
        load_settings(path)
    message = str(info.value)
    assert str(path) in message
    assert needle in message
    assert "\n" not in message
    assert path.read_text() == body  # a read never rewrites the file


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserInputError, match="not UTF-8"):
        load_settings(path)


def test_overrides_skip_none_and_validate() -> None:
    base = Settings(model="glm-5", tp=8)
    assert with_overrides(base, model=None, tp=None) == base
    assert with_overrides(base, tp=2).tp == 2
    with pytest.raises(UserInputError, match="target_tps"):
        with_overrides(base, target_tps=0.0)


def test_strings_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    odd = Settings(model='/models/a "b"\\c/config.json')
    save_settings(odd, path)
    assert load_settings(path) == odd

"""Settings: TOML file under the config dir, flags override, bad files give one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from decodetop.errors import UserInputError
from decodetop.settings import (
    Settings,
    default_settings_path,
    dumps_settings,
    load_settings,
    save_changes,
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
        ("observed_ms = -1\n", "observed_ms must be a number from 0.001 to"),
        ("tick_s = 0.01\n", "tick_s must be a number from 0.25 to"),
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
    odd = Settings(config='/models/a "b"\\c/config.json')
    save_settings(odd, path)
    assert load_settings(path) == odd


# -- saving only what the UI changed ---------------------------------------------------------------------------------


def test_save_changes_keeps_flag_values_out_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    original = '# mine\nmodel = "llama-3.1-70b"\ntp = 8  # the whole box\nobserved_ms = 40.0\n'
    path.write_text(original)
    flags = with_overrides(load_settings(path), tp=2, observed_ms=12.5)  # one-off flags for this run
    assert (flags.tp, flags.observed_ms) == (2, 12.5)
    save_changes(path, {"theme": "decodetop-light"})  # `t` in the UI
    text = path.read_text()
    assert text == original + 'theme = "decodetop-light"\n'  # every other line as it was, comments included
    stored = load_settings(path)
    assert (stored.tp, stored.observed_ms, stored.theme) == (8, 40.0, "decodetop-light")
    save_changes(path, {"model": "glm-5-nvfp4"})  # `m` in the UI
    assert load_settings(path).model == "glm-5-nvfp4"
    assert "tp = 8  # the whole box" in path.read_text()


def test_save_changes_creates_the_file_and_removes_keys(tmp_path: Path) -> None:
    path = tmp_path / "new" / "s.toml"
    save_changes(path, {"theme": "decodetop-contrast", "tp": 4})
    assert load_settings(path) == Settings(theme="decodetop-contrast", tp=4)
    save_changes(path, {"tp": None})
    assert "tp" not in path.read_text() and load_settings(path).tp is None


def test_save_changes_refuses_to_touch_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("model = \n")
    with pytest.raises(UserInputError, match="not valid TOML"):
        save_changes(path, {"theme": "decodetop-light"})
    assert path.read_text() == "model = \n"
    with pytest.raises(UserInputError, match="unknown setting"):
        save_changes(tmp_path / "t.toml", {"colour": "red"})


def test_saving_keeps_the_mode_and_the_symlink(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "decodetop.toml"
    real.parent.mkdir()
    real.write_text('model = "llama-3.1-8b"\n')
    real.chmod(0o600)
    link = tmp_path / "cfg" / "settings.toml"
    link.parent.mkdir()
    link.symlink_to(real)
    save_changes(link, {"theme": "decodetop-light"})
    assert link.is_symlink() and link.resolve() == real
    assert real.stat().st_mode & 0o777 == 0o600
    assert load_settings(real).theme == "decodetop-light"
    save_settings(Settings(model="glm-5"), link)
    assert link.is_symlink() and load_settings(real).model == "glm-5"
    assert real.stat().st_mode & 0o777 == 0o600


def test_bad_theme_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('theme = "solarized"\n')
    with pytest.raises(UserInputError) as info:
        load_settings(path, themes=("decodetop-dark", "decodetop-light"))
    assert str(info.value) == f"{path}: theme 'solarized' is not one of decodetop-dark, decodetop-light"
    assert load_settings(path).theme == "solarized"  # without the theme list it is not checked here


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("tp = " + "9" * 5000 + "\n", "not valid TOML"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "not valid TOML"),
        ("observed_ms = nan\n", "observed_ms must be a number from 0.001 to"),
        ("target_tps = inf\n", "target_tps must be a number from 0.001 to"),
    ],
)
def test_hostile_values(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(body)
    with pytest.raises(UserInputError, match=needle) as info:
        load_settings(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_settings_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "s.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    with pytest.raises(UserInputError, match=r"cannot read: (Is a directory|a FIFO|a character device)"):
        load_settings(path)


def test_atomic_write_never_replaces_a_device_or_fifo(tmp_path: Path) -> None:
    from decodetop.atomic import write_text_atomic

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        write_text_atomic(fifo, "{}")
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    with pytest.raises(OSError, match="not a regular file"):
        write_text_atomic(link, "{}")
    assert Path("/dev/null").is_char_device() and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null.json", "out.json"]  # no temp file left behind


def test_a_settings_file_with_a_utf8_bom_is_read(tmp_path: Path) -> None:
    """Editors on Windows (Notepad) start UTF-8 files with a byte-order mark; TOML allows none, people write one."""
    path = tmp_path / "settings.toml"
    path.write_bytes(b'\xef\xbb\xbfmodel = "llama-3.1-70b"\ntp = 2\n')
    settings = load_settings(path)
    assert settings.model == "llama-3.1-70b" and settings.tp == 2
    save_changes(path, {"tp": 4})
    assert load_settings(path).tp == 4 and load_settings(path).model == "llama-3.1-70b"

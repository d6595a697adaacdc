"""Keys that change a setting in the live UI store that setting alone: one-off flags never reach the file."""

from __future__ import annotations

from pathlib import Path

from decodetop.settings import Settings, load_settings, with_overrides

from .conftest import make_app, wait_until
from .fakes import make_sources


async def test_t_saves_the_theme_and_not_the_flags(tmp_path: Path) -> None:
    settings_path = tmp_path / "settings.toml"
    original = '# hand-written\nmodel = "glm-5"\ntp = 8\nobserved_ms = 40.0\n'
    settings_path.write_text(original)
    flags = with_overrides(load_settings(settings_path), tp=2, observed_ms=12.5)  # `--tp 2 --observed-ms 12.5`
    app = make_app(make_sources(), flags, settings_path=settings_path, save_theme=True)
    async with app.run_test(size=(80, 24)) as pilot:
        assert (app.settings.tp, app.settings.observed_ms) == (2, 12.5)
        await pilot.press("t")
        await wait_until(pilot, lambda: "decodetop-light" in settings_path.read_text(), "saved")
    assert settings_path.read_text() == original + 'theme = "decodetop-light"\n'
    assert load_settings(settings_path) == Settings(model="glm-5", tp=8, observed_ms=40.0, theme="decodetop-light")


async def test_m_and_p_change_the_session_and_say_they_are_not_saved(tmp_path: Path) -> None:
    """Only what the UI says it remembers is remembered: the theme. A model or TP picked with m or p is this
    session's (the notification and `?` say so); the next start is the file's and the flags' again."""
    from decodetop.tui.screens.model_picker import ModelPickerScreen
    from decodetop.tui.screens.tp_picker import TpPickerScreen

    settings_path = tmp_path / "settings.toml"
    original = '# hand-written\nmodel = "glm-5"\ntp = 8\n'
    settings_path.write_text(original)
    app = make_app(make_sources(), load_settings(settings_path), settings_path=settings_path, save_theme=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), "model picker")
        app.screen.dismiss("llama-3.1-70b")
        await wait_until(pilot, lambda: app.settings.model == "llama-3.1-70b", "model picked")
        await pilot.press("p")
        await wait_until(pilot, lambda: isinstance(app.screen, TpPickerScreen), "TP picker")
        from decodetop.tui.screens.tp_picker import TpChoice

        app.screen.dismiss(TpChoice(2))
        await wait_until(pilot, lambda: app.settings.tp == 2, "TP picked")
        said = [n.message for n in app._notifications]
        assert "llama-3.1-70b for this session, not saved: --model or settings.toml keeps it" in said
        assert "TP 2 for this session, not saved: --tp or settings.toml keeps it" in said
        await pilot.press("t")
        await wait_until(pilot, lambda: "theme" in settings_path.read_text(), "the theme saved")
    assert settings_path.read_text() == original + 'theme = "decodetop-light"\n'

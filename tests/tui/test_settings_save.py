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

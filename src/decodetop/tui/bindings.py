"""Provides the live UI's keys: the binding table, what `?` says of each key, and `KeyActions`, what each key does
(each action hands its work to a controller or a screen; nothing here blocks the event loop)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import partial
from typing import ClassVar

from textual import events, work
from textual.app import SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Input, TabbedContent

from decodetop.budget.scenario import ModelSource
from decodetop.errors import UserInputError
from decodetop.settings import Settings, save_changes
from decodetop.themes import THEME_NAMES, next_theme
from decodetop.tui import layout
from decodetop.tui.app_base import AppBase
from decodetop.tui.baseline import baseline_payload
from decodetop.tui.screens.budget_details import BudgetDetails, BudgetDetailsScreen
from decodetop.tui.screens.help import HelpScreen
from decodetop.tui.screens.model_picker import ModelPickerScreen
from decodetop.tui.screens.tp_picker import TpChoice, TpPickerScreen, tp_options
from decodetop.tui.screens.whatif import open_whatif
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable
from decodetop.tui.widgets.traced_bar import TracedBar

BINDINGS: list[BindingType] = [
    Binding("q", "quit", "quit"),
    Binding("question_mark", "help", "keys", key_display="?"),
    Binding("r", "rerun", "re-run"),
    Binding("R", "rerun_all", "all", key_display="R"),
    Binding("x", "cancel_probe", "cancel"),
    Binding("s", "save_baseline", "baseline"),
    Binding("w", "whatif", "what-if", show=False),
    Binding("m", "pick_model", "model"),
    Binding("p", "pick_tp", "TP"),
    Binding("t", "cycle_theme", "theme"),
    Binding("c", "capture_trace", "trace", show=False),
    Binding("b", "budget_details", "budget", show=False),
    Binding("f", "fold_budget", "fold", show=False),
    Binding("z", "maximise", "zoom table", show=False),
    *(Binding(str(n), f"show_panel({n})", f"tab {n}", show=False) for n in range(1, layout.MAX_PANELS + 1)),
    Binding("o", "cycle_sort", "sort", show=False),
    Binding("O", "reverse_sort", "reverse sort", key_display="O", show=False),
    Binding("slash", "filter", "filter", key_display="/", show=False),
]
"""Every key of the main screen (number keys switch to the panel in that place)."""

HELP_TEXT = {
    "quit": "quit: cancels the running probe, ends every probe rank and the telemetry thread",
    "help": "this list",
    "rerun": "re-run the selected probe (asks first where other processes hold the GPUs: a serving engine)",
    "rerun_all": "re-run every probe of the plan (asks first where other processes hold the GPUs)",
    "budget_details": "budget details: where each figure came from, other scenarios stored (never mixed in)",
    "whatif": "what-if: TP, EP, batch, context, KV dtype, weights, accept length, draft tokens, launch, all-reduce, "
    "GPU model turned by keys, predicted from this host's curves (no probing); escape returns",
    "cancel_probe": "cancel the running probe and empty the queue",
    "save_baseline": "save the checks, probe values and budget as the baseline (changes are marked Δ)",
    "pick_model": "choose the model for this session: the plan and the budget follow (not saved: --model or "
    "settings.toml keeps one)",
    "cycle_theme": "next theme: dark, light, high-contrast (remembered in settings.toml)",
    "capture_trace": "capture a profiler trace of a few decode steps from --server: the traced bar (enter: kernels)",
    "pick_tp": "choose the tensor-parallel degree for this session: the plan and the budget follow (not saved: --tp "
    "or settings.toml keeps one)",
    "cycle_sort": "sort the GPU table (GPU, utilisation, memory, power, temperature) or, focused, the process list "
    "(GPU memory, GPU, pid, user, SM %, CPU %, RSS, time); a header click sorts too, ▼/▲ shows how",
    "reverse_sort": "the same sort the other way round (a second click on the header does it too)",
    "filter": "filter the probe, GPU, process and health tables (enter keeps it, escape clears it)",
    "fold_budget": "fold the budget box to its one-line verdict (again: unfold)",
    "maximise": "maximise the tab on screen to the whole terminal, its table first (again or escape: back)",
}
"""What `?` says for each binding (the footer keeps the short descriptions)."""

EXTRA_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "details of the selected probe, GPU or check"),
    ("↑ ↓ / pgup pgdn", "move in a table"),
    ("tab", "move focus"),
    ("ctrl+p", "command palette"),
)
"""Keys that belong to the widgets (tables, focus, palette), listed by `?` after the app's own."""

MARKS: tuple[tuple[str, str], ...] = (
    ("↺", "a figure or row from an earlier session (read back from the history)"),
    ("~", "interpolated between measured points"),
    ("≈", "a roofline estimate, not measured"),
    ("Δ", "moved beyond its noise since the baseline (s)"),
    ("%", "share of the observed step (of the assumed one when no step was observed)"),
    ("…", "cut to the width: enter or b shows it whole"),
)
"""What the marks beside figures mean, listed by `?` after the keys."""


PALETTE_TITLES = {
    "rerun": "Re-run the selected probe",
    "rerun_all": "Re-run every probe",
    "cancel_probe": "Cancel probes",
    "save_baseline": "Save the baseline",
    "pick_model": "Choose the model",
    "pick_tp": "Choose the TP degree",
    "budget_details": "Budget details",
    "fold_budget": "Fold the budget box",
    "maximise": "Maximise the tab",
    "filter": "Filter the tables",
    "cycle_sort": "Sort the GPU table or the process list",
    "reverse_sort": "Reverse the sort",
    "capture_trace": "Capture a trace",
    "help": "Keys",
    "quit": "Quit",
}
"""The command palette's (ctrl+p) entries: decodetop's own actions, by the names `?` explains."""


def help_keys() -> list[tuple[str, str]]:
    """(key, what it does) for `?`: every binding, one number key per panel, then the widgets' keys."""
    shown = layout.panels()
    keys = []
    for binding in BINDINGS:
        if not isinstance(binding, Binding):
            continue
        if binding.action.startswith("show_panel("):
            number = int(binding.key)
            if number <= len(shown):
                keys.append((binding.key, shown[number - 1].help))
            continue
        what = HELP_TEXT.get(binding.action, binding.description or binding.action)
        keys.append((binding.key_display or binding.key, what))
    keys.extend(EXTRA_KEYS)
    keys.extend(MARKS)
    return keys


class KeyActions(AppBase):
    """What each key does."""

    BINDINGS: ClassVar[list[BindingType]] = BINDINGS

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): decodetop's actions with their keys, its tabs and its three themes; none of
        Textual's stock entries (their theme picker, their keys panel)."""
        keys = {b.action: b.key_display or b.key for b in BINDINGS if isinstance(b, Binding)}
        for action, title in PALETTE_TITLES.items():
            yield SystemCommand(f"{title} ({keys[action]})", HELP_TEXT[action], partial(self.run_action, action))
        for number, panel in enumerate(layout.panels(), 1):
            yield SystemCommand(f"{panel.title} tab ({number})", panel.help, partial(self.show_tab, panel.id))
        for name in THEME_NAMES:
            yield SystemCommand(f"Theme {name}", "decodetop's colours (t cycles them)", partial(self.use_theme, name))

    def use_theme(self, name: str) -> None:
        """Switch to decodetop's theme `name`, remembered as `t` does."""
        self.theme = name
        self.settings = dataclasses.replace(self.settings, theme=name)
        self.query_one(BudgetBar).refresh()
        self._save_settings({"theme": name})

    def action_help(self) -> None:
        """`?`: list every key."""
        self.push_screen(HelpScreen(help_keys()))

    def action_show_panel(self, number: int) -> None:
        """1-9: switch to the panel in that place (and focus its table)."""
        shown = layout.panels()
        if 1 <= number <= len(shown):
            self.show_tab(shown[number - 1].id)

    def show_tab(self, tab: str) -> None:
        """Switch to tab `tab` and focus the widget its panel names."""
        tabs = self.query_one(TabbedContent)
        panel = next((p for p in layout.panels() if p.id == tab), None)
        if panel is not None and not panel.focus:
            # nothing there takes focus (the charts): a table left focused in the tab before would take its tab back
            self.set_focus(None)
        tabs.active = tab
        if panel is not None and panel.focus:
            self.query_one(f"#{tab}").query_one(panel.focus).focus()

    def _selected_probe(self) -> str | None:
        return self.query_one(ProbeTable).selected_id

    def action_rerun(self) -> None:
        """`r`: re-run the selected probe (asking first where other processes hold the GPUs)."""
        probe_id = self._selected_probe()
        if probe_id is None:
            self.notify("no probe selected", severity="warning", timeout=3)
            return
        self.run_with_consent((probe_id,))

    def action_rerun_all(self) -> None:
        """`R`: re-run every probe (asking first where other processes hold the GPUs)."""
        self.run_with_consent(tuple(self.runner.views))

    def run_with_consent(self, probe_ids: tuple[str, ...]) -> None:
        """Queue `probe_ids` at once where nothing else holds the GPUs (or the user consented already); otherwise
        look at the GPUs in a worker, and where they are held ask first."""
        self.consent.request(probe_ids, self.enqueue, self.consented)

    def enqueue(self, probe_ids: tuple[str, ...]) -> None:
        """Queue probes and say so."""
        self.runner.enqueue(probe_ids)
        self.set_status()

    def consented(self) -> None:
        """The user said yes to probing beside other processes."""
        self.status_notes.append("probing beside other processes on the GPUs (confirmed)")
        self.show_held()

    def action_budget_details(self) -> None:
        """`b`: where each figure came from, and the other scenarios stored (never mixed in)."""
        self.stored.split(self.settings)
        details = BudgetDetails(
            view=self.composer.view,
            held_line=self.consent.held.line() if self.consent.held is not None else "",
            stored_line=self.stored.stored_line(self.settings, self.runner.views, self.now()),
            others=self.stored.others,
        )
        self.push_screen(BudgetDetailsScreen(details, self.now()))

    def action_whatif(self) -> None:
        """`w`: the what-if screen over the budget's scenario and results as they are now."""
        self.push_screen(open_whatif(self.sources.budget, self.settings, dict(self.runner.results), self.now()))

    def action_cancel_probe(self) -> None:
        """`x`: cancel the running probe and everything queued."""
        self.runner.cancel_all()
        self.set_status()

    def action_save_baseline(self) -> None:
        """`s`: save the current checks, probe values and budget as the baseline."""
        self._save_baseline(baseline_payload(self.checks, self.runner.views, self.composer.view))

    @work(thread=True, exit_on_error=False, group="files")
    def _save_baseline(self, payload: dict[str, object]) -> None:
        self.post_message(self.stored.save_baseline(payload, self.now()))

    def action_pick_tp(self) -> None:
        """`p`: choose the tensor-parallel degree; the probe plan and the budget follow."""
        gpus = len(self.last_frame.gpus) if self.last_frame is not None else 0
        self.push_screen(TpPickerScreen(tp_options(gpus, self.settings.tp), self.settings.tp), self._tp_picked)

    def _tp_picked(self, choice: TpChoice | None) -> None:
        if choice is None or choice.tp == self.settings.tp:
            return
        self.change_scenario(dataclasses.replace(self.settings, tp=choice.tp), f"TP {choice.tp}", "--tp")

    def action_pick_model(self) -> None:
        """`m`: choose a model preset; the probe plan and the budget follow."""
        try:
            models = list(self.sources.budget.models())
        except Exception as exc:  # the budget package may be missing presets
            self.notify(f"no model list: {exc}", severity="error")
            return
        self.push_screen(ModelPickerScreen(models, self.settings.model), self._model_picked)

    def _model_picked(self, model: str | None) -> None:
        if model is None or (model == self.settings.model and self.settings.config is None):
            return
        self.change_scenario(dataclasses.replace(self.settings, model=model, config=None), model, "--model")

    def change_scenario(self, settings: Settings, what: str, flag: str) -> None:
        """A new model or TP for this session (not remembered: only the theme is, README's key table and `?` say
        so): forget the old scenario's results, recompose, re-plan, and say how to keep the choice."""
        self.settings = settings
        self.runner.forget_results()
        self.recompose_budget()
        self.plan_probes()
        self.query_one(TracedBar).recheck(ModelSource(*settings.model_ref), settings.tp)
        self.notify(f"{what} for this session, not saved: {flag} or settings.toml keeps it", timeout=4)
        self.set_status()

    def action_cycle_sort(self) -> None:
        """`o`: the next sort order of the process list where it has focus, else of the GPU tables."""
        if isinstance(self.focused, ProcessTable):
            self.notify(f"processes sorted by {self.focused.cycle_sort()}", timeout=2)
            return
        order = ""
        for table in self.query(GpuTable):
            order = table.cycle_sort()
        self.notify(f"GPUs sorted by {order}", timeout=2)

    def action_reverse_sort(self) -> None:
        """`O`: the same sort order the other way round (the process list where it has focus, else the GPUs)."""
        if isinstance(self.focused, ProcessTable):
            self.notify(f"processes sorted by {self.focused.reverse_sort()}", timeout=2)
            return
        order = ""
        for table in self.query(GpuTable):
            order = table.reverse_sort()
        self.notify(f"GPUs sorted by {order}", timeout=2)

    def action_fold_budget(self) -> None:
        """`f`: fold the budget box to its one-line verdict, or unfold it."""
        self.folded = not self.folded
        self.fit_box()

    def action_maximise(self) -> None:
        """`z`: the tab on screen fills the terminal (its table, and the GPUs' processes with them), or back."""
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        active = self.query_one(TabbedContent).active
        if active:
            screen.maximized = self.query_one(f"#{active}")
            self.show_tab(active)

    def action_filter(self) -> None:
        """`/`: type a filter for the probe, GPU, process and health tables."""
        box = self.query_one("#filter", Input)
        box.add_class("-shown")
        box.focus()

    def apply_filter(self, text: str) -> None:
        """Filter every table by `text` ("" shows every row)."""
        for table in self.query(GpuTable):
            table.set_filter(text)
        self.query_one(ProcessTable).set_filter(text)
        self.query_one(ProbeTable).set_filter(text)
        for panel in self.query(HealthPanel):
            panel.set_filter(text)

    def on_key(self, event: events.Key) -> None:
        """escape in the filter box clears the filter and hides the box."""
        box = self.query_one("#filter", Input)
        if event.key == "escape" and box.has_focus:
            event.stop()
            box.value = ""
            self.apply_filter("")
            box.remove_class("-shown")
            self.show_tab(self.query_one(TabbedContent).active)

    def action_capture_trace(self) -> None:
        """`c`: capture a few decode steps from --server in the background; the traced bar shows them."""
        kind, value = self.settings.model_ref
        self.query_one(TracedBar).capture({"model": {"kind": kind, "value": value}, "tp": self.settings.tp})

    def action_cycle_theme(self) -> None:
        """`t`: next theme, remembered in the settings file."""
        self.use_theme(next_theme(self.theme))
        self.notify(f"theme {self.theme}", timeout=2)

    @work(thread=True, exit_on_error=False, group="files")
    def _save_settings(self, changed: dict[str, object]) -> None:
        """Store what the user changed in the UI, and only that: one-off flags never reach the file."""
        if not self.save_theme:
            return
        try:
            save_changes(self.settings_path, changed)
        except (OSError, UserInputError) as exc:
            self.call_from_thread(self.notify, f"settings not saved: {exc}", severity="warning")

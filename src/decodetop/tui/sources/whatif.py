"""Provides `WhatIfPredictor`, the what-if screen's source: the current deployment and its variants predicted from
the curves of the results the budget composes from (`decodetop.pipeline.whatif.predict`, the one composition; no
probe runs), each kept by its knobs so a knob turned back, a chart point or a neighbour predicted ahead answers at
once. Predictions are made on the screen's worker threads (a new deployment's inventory and plan take 10–300 ms);
a kept one is read on the event loop too (`kept`)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Mapping

from decodetop.budget.calibration import Calibration, calibration_of
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.whatif import Variant, predict

KEPT_VARIANTS = 64
"""Predictions kept per base (a knob's neighbours, a chart's points and the way back: a few dozen)."""


class WhatIfPredictor:
    """Variants of one base context (the budget's scenario and results when the screen opened), kept by knobs."""

    def __init__(self, base: BudgetContext) -> None:
        self.base = base
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[tuple[str, str], ...], Variant] = OrderedDict()
        self._pending: dict[tuple[tuple[str, str], ...], threading.Event] = {}
        """Variants being predicted now, by their knobs: a second thread asking for one waits for it."""
        now = predict(base, {})
        assert now.budget is not None  # the current deployment is the scenario the budget composed
        self.calibration: Calibration | None
        self.calibration, self.calibration_note = calibration_of(now.budget)
        self.now = dataclasses.replace(now, calibration=self.calibration)
        self._kept[()] = self.now

    def variant(self, knobs: Mapping[str, str]) -> Variant:
        """The prediction of the current deployment with `knobs` turned (a refusal carries its reason). Where another
        thread is predicting the same knobs (the look-ahead reached the key just pressed), this one waits for its
        result rather than composing it a second time beside it on the same cores."""
        key = tuple(knobs.items())
        while True:
            with self._lock:
                hit = self._kept.get(key)
                if hit is not None:
                    self._kept.move_to_end(key)
                    return hit
                pending = self._pending.get(key)
                if pending is None:
                    done = self._pending[key] = threading.Event()
                    break
            pending.wait()  # then kept (or, where that prediction failed, made here)
        try:
            found = predict(self.base, knobs, calibration=self.calibration)
            with self._lock:
                self._kept[key] = found
                while len(self._kept) > KEPT_VARIANTS:
                    self._kept.popitem(last=False)
        finally:
            with self._lock:
                del self._pending[key]
            done.set()
        return found

    def kept(self, knobs: Mapping[str, str]) -> Variant | None:
        """The prediction of `knobs` where it was made already, else None (never composes: the event loop asks)."""
        key = tuple(knobs.items())
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None:
                self._kept.move_to_end(key)
            return hit

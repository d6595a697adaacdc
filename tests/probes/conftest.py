"""The fake probe modules here (`fake_probes`, `slow_rank`) are imported by bare name, as a user's
`DECODETOP_PROBE_MODULES` module is: this folder goes on sys.path, for this process and for the ranks it spawns
(multiprocessing's spawn passes sys.path on)."""

from __future__ import annotations

import sys
from pathlib import Path

PROBE_MODULES_DIR = Path(__file__).resolve().parent
if str(PROBE_MODULES_DIR) not in sys.path:
    sys.path.insert(0, str(PROBE_MODULES_DIR))

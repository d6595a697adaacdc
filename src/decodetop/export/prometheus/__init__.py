"""Provides decodetop's Prometheus exposition, split by subject: what a scrape renders (`state`), the metric families
rendered from it (`rendering`), the /metrics HTTP server (`server`) and the node_exporter textfile of
`decodetop check` (`textfile`).

The names below are the package's public API; import them from here."""

from __future__ import annotations

from decodetop.export.prometheus.rendering import (
    PARTS,
    PERCENTILES,
    PREFIX,
    DecodetopCollector,
    exported_points,
    make_registry,
    metric_for_key,
    render_exposition,
)
from decodetop.export.prometheus.server import (
    DEFAULT_LISTEN,
    MetricsServer,
    listen_warning,
    parse_listen,
    start_metrics_server,
)
from decodetop.export.prometheus.state import ExportState, Observation, StateBox, StateProvider
from decodetop.export.prometheus.textfile import textfile_path, write_check_textfile

__all__ = [
    "DEFAULT_LISTEN",
    "PARTS",
    "PERCENTILES",
    "PREFIX",
    "DecodetopCollector",
    "ExportState",
    "MetricsServer",
    "Observation",
    "StateBox",
    "StateProvider",
    "exported_points",
    "listen_warning",
    "make_registry",
    "metric_for_key",
    "parse_listen",
    "render_exposition",
    "start_metrics_server",
    "textfile_path",
    "write_check_textfile",
]

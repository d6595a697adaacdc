"""Provides the one choke point for NVML: `Nvml.query(fn, *args)` turns every failure into a value, never an exception.

Every NVML read in decodetop goes through `Nvml` (AGENTS.md: one choke point per outside resource), the way
nvitop's `libnvml.nvmlQuery(func, *args, default=NA)` does (aesthetics.md §2):

- NVML is initialised lazily, under a lock, on the first query.
- "not supported", "no permission", a function this driver lacks, or a bad argument becomes an `NA` value that
  carries the NVML error code and a reason; a missing function is logged once per function.
- No library, no driver loaded, or a library/kernel-module version mismatch puts the whole source in the
  "unavailable" state with the reason string (`Nvml.status()`): decodetop still runs, with no GPU panels.

The choke point talks to a *backend* (`NvmlBackend`): the real `pynvml` binding (`PynvmlBackend`), a fake that
replays data recorded on a real machine (`decodetop.collectors.fake_nvml`), or none (`NoNvmlBackend`). Backends
take GPU indices (`GpuRef`) instead of opaque handles and return plain values (int, float, str, list, dict), so a
recording is a JSON map from call key (`call_key`) to the value or the NVML error code.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union

log = logging.getLogger(__name__)

# NVML return codes, as numbered in nvml.h and in nvidia-ml-py 13.615.71 `pynvml.py` (docs/reference/healthchecks.md
# [PYNVML]).
# Kept here so that the fake and the no-NVML backend need no pynvml import.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999
NOT_AN_NVML_ERROR = -1
"""Code for a failure that did not come from NVML itself (a Python exception inside the binding)."""

ERROR_REASONS: dict[int, str] = {
    NVML_ERROR_UNINITIALIZED: "NVML is not initialised",
    NVML_ERROR_INVALID_ARGUMENT: "invalid argument",
    NVML_ERROR_NOT_SUPPORTED: "not supported on this GPU or driver",
    NVML_ERROR_NO_PERMISSION: "no permission (needs root)",
    NVML_ERROR_NOT_FOUND: "not found",
    NVML_ERROR_INSUFFICIENT_SIZE: "buffer too small",
    NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    NVML_ERROR_TIMEOUT: "timed out",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library (libnvidia-ml.so.1) not found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "function not found in this NVML library (older driver)",
    NVML_ERROR_CORRUPTED_INFOROM: "corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost (fell off the bus?)",
    NVML_ERROR_RESET_REQUIRED: "GPU needs a reset",
    NVML_ERROR_OPERATING_SYSTEM: "blocked by the operating system",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "NVML library and kernel module versions differ (driver upgraded without a reboot or module reload)"
    ),
    NVML_ERROR_NO_DATA: "no data",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "argument version mismatch (binding newer than driver)",
    NVML_ERROR_DEPRECATED: "deprecated",
    NVML_ERROR_NOT_READY: "not ready",
    NVML_ERROR_GPU_NOT_FOUND: "GPU not found",
    NVML_ERROR_UNKNOWN: "unknown NVML error",
    NOT_AN_NVML_ERROR: "the NVML binding failed",
}

UNAVAILABLE_INIT_CODES = frozenset(
    {
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        NVML_ERROR_NO_PERMISSION,
        NVML_ERROR_UNKNOWN,
    }
)
"""Init failures that mean "no GPU telemetry here" (any init failure does; these are the common ones)."""


def error_reason(code: int, message: str = "") -> str:
    """Human reason for an NVML error code, with the binding's own message when it adds something."""
    base = ERROR_REASONS.get(code, f"NVML error {code}")
    if message and message.lower() not in base.lower():
        return f"{base}: {message}"
    return base


class NvmlError(Exception):
    """An NVML call failed with an NVML return code. Backends raise it; `Nvml` never lets it out."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(error_reason(code, message))
        self.code = code
        self.message = message


@dataclass(frozen=True)
class GpuRef:
    """Stands for a device handle in a backend call: the GPU with this NVML index."""

    index: int


FieldId = Union[int, tuple[int, int]]  # noqa: UP007 - a runtime alias must work on Python 3.10 too
"""A field of nvmlDeviceGetFieldValues: its id, or (id, scope id). The NVLink throughput fields take the link as the
scope (nvml.h: "Link ID needs to be specified in the scopeId field"); pynvml fills `scopeId` only from such a pair."""
Arg = Union[int, GpuRef, tuple[FieldId, ...]]  # noqa: UP007 - a runtime alias must work on Python 3.10 too
"""An argument of a backend call: an int (enum, link index...), a GPU, or a list of fields (ids or (id, scope))."""


def call_key(fn: str, args: Sequence[Arg]) -> str:
    """Stable text key of a call, used by recordings: `nvmlDeviceGetClockInfo(gpu0,1)`, `f(gpu0,[197,198])`, a
    scoped field as `id:scope` (`f(gpu0,[138:0,139:0])`)."""
    parts: list[str] = []
    for arg in args:
        if isinstance(arg, GpuRef):
            parts.append(f"gpu{arg.index}")
        elif isinstance(arg, tuple):
            parts.append("[" + ",".join(field_text(a) for a in arg) + "]")
        else:
            parts.append(str(int(arg)))
    return f"{fn}({','.join(parts)})"


def field_text(field: FieldId) -> str:
    """A field as a call key writes it: `197`, or `138:3` for field 138 at scope 3."""
    if isinstance(field, tuple):
        return f"{int(field[0])}:{int(field[1])}"
    return str(int(field))


@dataclass(frozen=True)
class NA:
    """A value NVML could not give, and why. Falsy, so `value or default` reads naturally."""

    fn: str
    code: int
    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"N/A ({self.reason})"


class NvmlBackend(Protocol):
    """What the choke point needs from an NVML implementation (real, fake or none)."""

    label: str
    """Where the data comes from, shown to the user: "nvml", "fake: h200x1-load (replicated 1→8 GPUs)", "none"."""

    def init(self) -> None:
        """Initialise; raise NvmlError when NVML cannot be used at all."""

    def shutdown(self) -> None:
        """Release the library (best effort)."""

    def call(self, fn: str, args: tuple[Arg, ...]) -> object:
        """Call NVML function `fn`; return plain values (see `plain`); raise NvmlError on an NVML failure."""


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML can be used here, and if not, why (the "no GPU" state is a value)."""

    available: bool
    reason: str
    """"" when available; else one line: "NVML library (libnvidia-ml.so.1) not found", ..."""
    code: int | None
    """The NVML error code of the init failure, or None."""
    source: str
    """The backend's label."""


@dataclass
class CallStats:
    """Count and total wall time of one NVML function's calls through the choke point."""

    calls: int = 0
    errors: int = 0
    total_s: float = 0.0


# --- plain values -------------------------------------------------------------------------------------------

# nvmlValueType_t → the member of the c_nvmlValue_t union that holds the value (pynvml.py NVML_VALUE_TYPE_*).
_FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def plain(value: object) -> object:
    """Turn what pynvml returns (ctypes structs, arrays, friendly objects, bytes) into JSON-able plain values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (list, tuple, ctypes.Array)):
        return [plain(v) for v in value]
    if isinstance(value, ctypes._SimpleCData):  # before the objects: a ctypes scalar has a __dict__ too
        return plain(value.value)
    if isinstance(value, (dict, ctypes.Structure)) or hasattr(value, "__dict__"):
        return _plain_object(value)
    return str(value)


def _plain_object(value: object) -> dict[str, object]:
    """A dict, a ctypes struct (an nvmlFieldValue_t with its union read by value type) or a pynvml friendly object
    as a dict of plain values."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, ctypes.Structure):
        names = [f[0] for f in value._fields_]
        if {"fieldId", "valueType", "nvmlReturn", "value"} <= set(names):
            value_type = int(value.valueType)
            member = _FIELD_VALUE_MEMBERS.get(value_type)
            return {
                "fieldId": int(value.fieldId),
                "scopeId": int(value.scopeId),
                "timestamp": int(value.timestamp),
                "valueType": value_type,
                "nvmlReturn": int(value.nvmlReturn),
                "value": plain(getattr(value.value, member)) if member else None,
            }
        return {name: plain(getattr(value, name)) for name in names}
    # pynvml.nvmlFriendlyObject (process lists)
    return {str(k): plain(v) for k, v in vars(value).items() if not str(k).startswith("_")}


# --- backends -----------------------------------------------------------------------------------------------


class NoNvmlBackend:
    """The backend of a host without NVML: init fails with the given code and reason."""

    def __init__(self, code: int = NVML_ERROR_LIBRARY_NOT_FOUND, message: str = "") -> None:
        self.code = code
        self.message = message
        self.label = "none"

    def init(self) -> None:
        """Always fails: there is no NVML here."""
        raise NvmlError(self.code, self.message)

    def shutdown(self) -> None:
        """Nothing to release."""

    def call(self, fn: str, args: tuple[Arg, ...]) -> object:
        """Never reached through `Nvml` (init failed); fails like an uninitialised NVML."""
        raise NvmlError(NVML_ERROR_UNINITIALIZED)


class PynvmlBackend:
    """The real NVML through nvidia-ml-py (`import pynvml`), imported only when first used."""

    def __init__(self) -> None:
        self.label = "nvml"
        self._pynvml: Any = None
        self._handles: dict[int, object] = {}

    def init(self) -> None:
        """Import pynvml and call nvmlInit; translate every failure into NvmlError."""
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, f"nvidia-ml-py (pynvml) is not installed: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(int(exc.value), str(exc)) from exc
        except OSError as exc:  # a broken libnvidia-ml.so (wrong architecture, truncated file)
            raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, str(exc)) from exc
        self._pynvml = pynvml
        self._handles = {}

    def shutdown(self) -> None:
        """nvmlShutdown, ignoring errors."""
        if self._pynvml is None:
            return
        try:
            self._pynvml.nvmlShutdown()
        except Exception as exc:  # best effort at exit
            log.debug("nvmlShutdown failed: %s", exc)
        self._pynvml = None
        self._handles = {}

    def _handle(self, index: int) -> object:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
        return handle

    def call(self, fn: str, args: tuple[Arg, ...]) -> object:
        """Call `pynvml.<fn>` with handles in place of GpuRefs; plain values out; NvmlError on failure."""
        pynvml = self._pynvml
        if pynvml is None:
            raise NvmlError(NVML_ERROR_UNINITIALIZED)
        func: Callable[..., object] | None = getattr(pynvml, fn, None)
        if func is None:
            raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"nvidia-ml-py has no {fn}")
        try:
            real_args = [
                self._handle(a.index) if isinstance(a, GpuRef) else (list(a) if isinstance(a, tuple) else a)
                for a in args
            ]
            return plain(func(*real_args))
        except pynvml.NVMLError as exc:
            raise NvmlError(int(exc.value), str(exc)) from exc


def default_backend() -> NvmlBackend:
    """The real NVML (through pynvml); it reports "not found" by itself where there is none."""
    return PynvmlBackend()


# --- the choke point ----------------------------------------------------------------------------------------


class Nvml:
    """The one way decodetop reads NVML: lazy init under a lock, failures as `NA` values, per-call cost counted."""

    def __init__(self, backend: NvmlBackend | None = None) -> None:
        self.backend: NvmlBackend = backend if backend is not None else default_backend()
        self._lock = threading.Lock()
        self._status: NvmlStatus | None = None
        self._logged_missing: set[str] = set()
        self._stats: dict[str, CallStats] = {}
        self._stats_lock = threading.Lock()

    @property
    def source(self) -> str:
        """The backend's label ("nvml", "fake: ...", "none")."""
        return self.backend.label

    def status(self) -> NvmlStatus:
        """Initialise on first use (thread-safe) and say whether NVML is usable."""
        status = self._status
        if status is not None:
            return status
        with self._lock:
            if self._status is None:
                self._status = self._init()
            return self._status

    def _init(self) -> NvmlStatus:
        try:
            self.backend.init()
        except NvmlError as exc:
            log.info("NVML unavailable (%s): %s", self.backend.label, exc)
            return NvmlStatus(False, str(exc), exc.code, self.backend.label)
        except Exception as exc:  # a broken binding must not take decodetop down
            log.warning("NVML init crashed (%s): %r", self.backend.label, exc)
            return NvmlStatus(False, f"NVML init failed: {exc!r}", NOT_AN_NVML_ERROR, self.backend.label)
        return NvmlStatus(True, "", None, self.backend.label)

    @property
    def available(self) -> bool:
        """Shorthand for `status().available`."""
        return self.status().available

    def query(self, fn: str, *args: Arg) -> Any:
        """Call NVML function `fn`; the plain result, or an `NA` carrying the error code and reason. Never raises.

        Typed as Any because each function returns its own shape; callers check `isinstance(result, NA)` (or use
        the typed helpers in telemetry) before using it.
        """
        status = self.status()
        if not status.available:
            return NA(fn, status.code if status.code is not None else NOT_AN_NVML_ERROR, status.reason)
        start = time.perf_counter()
        error = True
        try:
            result = self.backend.call(fn, tuple(args))
            error = False
            return result
        except NvmlError as exc:
            if exc.code == NVML_ERROR_FUNCTION_NOT_FOUND and fn not in self._logged_missing:
                self._logged_missing.add(fn)
                log.info("NVML function %s not found (%s)", fn, exc)
            return NA(fn, exc.code, str(exc))
        except Exception as exc:  # a binding bug (e.g. a tuple constant) becomes a value too
            if fn not in self._logged_missing:
                self._logged_missing.add(fn)
                log.warning("NVML call %s failed in the binding: %r", call_key(fn, args), exc)
            return NA(fn, NOT_AN_NVML_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            elapsed = time.perf_counter() - start
            with self._stats_lock:
                stats = self._stats.setdefault(fn, CallStats())
                stats.calls += 1
                stats.errors += int(error)
                stats.total_s += elapsed

    def device_count(self) -> int:
        """Number of GPUs NVML sees (0 when NVML is unavailable or the count cannot be read)."""
        count = self.query("nvmlDeviceGetCount")
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def call_stats(self) -> dict[str, CallStats]:
        """A copy of the per-function call counts and times so far (what each NVML function costs here)."""
        with self._stats_lock:
            return {fn: CallStats(s.calls, s.errors, s.total_s) for fn, s in self._stats.items()}

    def close(self) -> None:
        """Shut the library down; a later query initialises it again."""
        with self._lock:
            if self._status is not None and self._status.available:
                self.backend.shutdown()
            self._status = None


class RecordingBackend:
    """Wraps a backend and remembers each call's outcome as `{"ok": value}` or `{"error": code, "message": str}`.

    The recorder (`benchmarks/record_nvml.py`) runs the real telemetry code through this, so a recording holds
    exactly the calls decodetop makes, and the fake replays them.
    """

    def __init__(self, inner: NvmlBackend) -> None:
        self.inner = inner
        self.label = f"recording {inner.label}"
        self.outcomes: dict[str, dict[str, object]] = {}
        self.init_error: dict[str, object] | None = None

    def init(self) -> None:
        """Initialise the wrapped backend, remembering an init failure."""
        try:
            self.inner.init()
        except NvmlError as exc:
            self.init_error = {"error": exc.code, "message": exc.message}
            raise

    def shutdown(self) -> None:
        """Shut the wrapped backend down."""
        self.inner.shutdown()

    def call(self, fn: str, args: tuple[Arg, ...]) -> object:
        """Forward the call and remember its outcome."""
        key = call_key(fn, args)
        try:
            value = self.inner.call(fn, args)
        except NvmlError as exc:
            self.outcomes[key] = {"error": exc.code, "message": exc.message}
            raise
        self.outcomes[key] = {"ok": value}
        return value

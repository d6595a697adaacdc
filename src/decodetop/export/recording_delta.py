"""Provides the delta codec of a recording's telemetry: a tick written as what changed since the tick before.

A telemetry snapshot at 8 GPUs is about 40 KB of JSON, and most of it (names, bus ids, limits, topology) is the
same every tick. A recording writes a whole snapshot (a keyframe) every `KEYFRAME_EVERY_TICKS` ticks and, between,
only the operations that turn the previous tick's JSON into this one's (`diff`), which `apply` replays. An operation
is `[path, value]` (set the value at the path: dict keys and list indices, from the top) or `[path]` (remove that
dict key); a list whose length changed is set whole. Keyframes bound what one damaged line costs (the ticks up to
the next keyframe) and let a reader start at any of them.

`apply` treats a delta as hostile input: a path that does not lead through the previous tick, an index out of range,
a path longer than `MAX_PATH_ITEMS` or an operation of the wrong shape is a `DeltaError` (the line is then corrupt).
It copies only the containers along the changed paths, so ticks rebuilt from one keyframe share what did not change.
"""

from __future__ import annotations

from typing import Any

KEYFRAME_EVERY_TICKS = 60
"""A whole snapshot every minute at the default 1 s tick: a damaged line costs at most a minute of telemetry, and a
keyframe (~1.9 KB gzipped at the 8-GPU demo, against ~760 bytes for a delta) adds about 20 bytes a tick
(docs/benchmarks.md, "Recording size")."""
MAX_PATH_ITEMS = 32
"""Longest path an operation may give: a snapshot is 5 levels deep; a crafted deeper one is refused, so deltas
cannot build nesting beyond what the JSON loader allows in one line plus this."""


class DeltaError(ValueError):
    """A delta that does not apply to the tick before it (one line: what is wrong)."""


def diff(old: Any, new: Any) -> list[list[Any]]:
    """The operations that turn JSON value `old` into `new` (none where they are equal)."""
    ops: list[list[Any]] = []
    _diff(old, new, [], ops)
    return ops


def _diff(old: Any, new: Any, path: list[str | int], ops: list[list[Any]]) -> None:
    if type(old) is dict and type(new) is dict:
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, [*path, key], ops)
            else:
                ops.append([[*path, key], value])
        ops.extend([[*path, key]] for key in old if key not in new)
    elif type(old) is list and type(new) is list and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            _diff(a, b, [*path, index], ops)
    elif type(old) is not type(new) or old != new:  # 1 and 1.0 and True differ in JSON
        ops.append([path, new])


def apply(base: Any, ops: Any) -> Any:
    """`base` with the operations of a delta applied; `base` itself is never changed. DeltaError when they do not
    fit it."""
    if not isinstance(ops, list):
        raise DeltaError("the delta is not a list of operations")
    copied: set[int] = set()
    root = base
    for op in ops:
        if not isinstance(op, list) or len(op) not in (1, 2) or not isinstance(op[0], list):
            raise DeltaError("an operation is not [path] or [path, value]")
        path = op[0]
        if len(path) > MAX_PATH_ITEMS:
            raise DeltaError(f"a path of {len(path)} items (at most {MAX_PATH_ITEMS})")
        if not path:
            if len(op) == 1:
                raise DeltaError("an operation removes the whole tick")
            root = op[1]
            copied = set()
            continue
        if id(root) not in copied:
            root = _copy(root)
            copied.add(id(root))
        parent = _parent(root, path[:-1], copied)
        _set(parent, path[-1], op)
    return root


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    raise DeltaError("a path goes through a value that is not an object or a list")


def _parent(root: Any, path: list[Any], copied: set[int]) -> Any:
    """The container `path` leads to from `root`, each one on the way copied once (this delta's own copies)."""
    node = root
    for step in path:
        child = _child(node, step)
        if id(child) not in copied:
            child = _copy(child)
            copied.add(id(child))
            node[step] = child
        node = child
    return node


def _child(node: Any, step: Any) -> Any:
    if isinstance(node, dict) and isinstance(step, str):
        if step not in node:
            raise DeltaError(f"no key {step[:40]!r} in the tick before")
        return node[step]
    if isinstance(node, list) and isinstance(step, int) and not isinstance(step, bool):
        if not 0 <= step < len(node):
            raise DeltaError(f"index {step} outside a list of {len(node)}")
        return node[step]
    raise DeltaError("a path step does not fit the tick before (a key of a list, an index of an object)")


def _set(parent: Any, step: Any, op: list[Any]) -> None:
    if isinstance(parent, dict) and isinstance(step, str):
        if len(op) == 1:
            if step not in parent:
                raise DeltaError(f"no key {step[:40]!r} to remove")
            del parent[step]
        else:
            parent[step] = op[1]
        return
    if len(op) == 2 and isinstance(parent, list) and isinstance(step, int) and not isinstance(step, bool):
        if not 0 <= step < len(parent):
            raise DeltaError(f"index {step} outside a list of {len(parent)}")
        parent[step] = op[1]
        return
    raise DeltaError("an operation does not fit the tick before")

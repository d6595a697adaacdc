"""Property tests: whatever JSON reaches the config reader, it answers with a ModelSpec or its own error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.quant import ConfigError
from decodetop.budget.spec import PRESET_DIR, preset_names, spec_from_config
from decodetop.errors import UserInputError

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
PRESETS = {name: json.loads((PRESET_DIR / f"{name}.json").read_text()) for name in preset_names()}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read(config: object, hf_quant: object | None = None) -> None:
    try:
        spec = spec_from_config(
            config, file="fuzz/config.json", hf_quant_config=hf_quant, hf_quant_file="fuzz/hf_quant_config.json"
        )
    except ConfigError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("fuzz/")
        return
    # whatever the reader accepts, the rest of the pipeline handles or refuses with a user error
    try:
        inv = build_inventory(spec, Deployment(tp=1, context_len=16))
    except UserInputError:
        return
    assert inv.weight_bytes >= 0


@SETTINGS
@given(JSON)
def test_random_json_never_escapes(config: object) -> None:
    _read(config)


@SETTINGS
@given(st.sampled_from(sorted(PRESETS)), st.data())
def test_mutated_real_configs_never_escape(name: str, data: st.DataObject) -> None:
    """Take a real config, replace or delete a few keys (nested ones too), read it."""
    preset = PRESETS[name]
    config: dict[str, Any] = json.loads(json.dumps(preset["config"]))
    keys = sorted(config)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(keys))
        if data.draw(st.booleans()):
            config.pop(key, None)
        else:
            config[key] = data.draw(JSON)
    hf_quant = preset["hf_quant_config"]
    if hf_quant is not None and data.draw(st.booleans()):
        hf_quant = data.draw(JSON | st.fixed_dictionaries({"quantization": JSON}))
    _read(config, hf_quant)


@settings(max_examples=40, deadline=None)  # accepted sizes build up to 4096-layer inventories: fewer, costlier cases
@given(st.sampled_from(sorted(PRESETS)), st.integers(-(2**40), 2**40))
def test_sizes_of_any_magnitude(name: str, value: int) -> None:
    config = dict(PRESETS[name]["config"])
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        _read({**config, key: value})


@SETTINGS
@given(JSON)
def test_random_quantization_config(qc: object) -> None:
    _read({**PRESETS["glm-5"]["config"], "quantization_config": qc})
    _read(PRESETS["glm-5"]["config"], {"producer": {"name": "modelopt"}, "quantization": qc})

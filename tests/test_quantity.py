"""`decodetop.quantity`: numbers from outside converted without raising and checked against their quantity's range,
with one line naming where the number came from."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decodetop.quantity import OBSERVED_MS, TARGET_TPS, Quantity, QuantityError, as_float, shown


def test_as_float_never_raises() -> None:
    assert as_float(10**400) is None  # float() of it raises OverflowError, which is not a ValueError
    assert as_float(True) is None and as_float(None) is None and as_float({"a": 1}) is None
    assert as_float("1.5") == 1.5 and as_float(" 2 ") == 2.0 and as_float("x") is None
    assert as_float("9" * 5000) is None  # not even parsed
    assert math.isnan(as_float(math.nan) or 0.0) or as_float(math.nan) is not None


@given(st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=80), st.none()))
def test_check_is_a_number_in_range_or_one_line(value: object) -> None:
    try:
        number = OBSERVED_MS.check(value, "x.toml: observed_ms")
    except QuantityError as exc:
        message = str(exc)
        assert message.startswith("x.toml: observed_ms must be a number from 0.001 to 3,600,000 ms, got ")
        assert "\n" not in message and len(message) < 200
    else:
        assert 0.001 <= number <= 3_600_000


def test_the_extremes_are_refused_and_said() -> None:
    with pytest.raises(
        QuantityError, match=r"--target-tps must be a number from 0\.001 to 10,000,000 tok/s, got 1e-320"
    ):
        TARGET_TPS.check(1e-320, "--target-tps")
    with pytest.raises(QuantityError, match="got a number with 401 digits"):
        OBSERVED_MS.check(10**400, "f: observed_ms")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a number from 0\.001 to 3,600,000 ms, got '1e308'"):
        OBSERVED_MS.arg("1e308")
    with pytest.raises(argparse.ArgumentTypeError, match="not a number: 'nine'"):
        OBSERVED_MS.arg("nine")
    assert OBSERVED_MS.arg("12.5") == 12.5
    assert Quantity("n", 1, 4).check_int(3, "w") == 3
    with pytest.raises(QuantityError, match=r"must be a whole number from 1 to 4, got 2\.5"):
        Quantity("n", 1, 4).check_int(2.5, "w")


def test_shown_is_short_and_inert() -> None:
    assert "\x1b" not in shown("\x1b]0;x\x07" * 20) and len(shown("\x1b]0;x\x07" * 20)) <= 40
    assert len(shown("y" * 500)) <= 40
    assert shown(10**5000) == "a number with 5001 digits"

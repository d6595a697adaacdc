"""The GQA kernel's launch geometry as the budget layer computes it, and the facts a results file records of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from decodetop.budget.gqa_launch import (
    FIRST,
    LONG,
    LONG_BF16,
    SHORT,
    SHORT_BEFORE,
    GqaConfig,
    GqaLaunchFacts,
    config_from_label,
    default_config,
    default_config_before,
    facts_from_metrics,
    facts_from_note,
    gqa_launch,
    key_launch,
    launch_metrics,
    launch_rule,
)
from decodetop.budget.keys import AttentionKey


def _gqa(batch: int, context: int, kv_dtype: str = "bf16", q_len: int = 1, window: int = 0) -> AttentionKey:
    return AttentionKey("gqa", batch, q_len, context, 64, 8, 128, 128, 0, 128, 0, 0, 0, window, kv_dtype)


@pytest.mark.parametrize(
    "config",
    [FIRST, SHORT, LONG, GqaConfig(block_n=32, num_warps=1, num_stages=4, programs_per_sm=8, f16=True),
     GqaConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=2, f16=True, combine_block=16),
     GqaConfig(block_n=256, num_warps=4, num_stages=2, programs_per_sm=1, f16=True, fold_scale=True, tma=True),
     GqaConfig(f16=True, combine_block=64, unmasked=True, lazy_rescale=True, early_trigger=True)],
)  # fmt: skip
def test_a_launch_label_reads_back_as_its_shape(config: GqaConfig) -> None:
    assert config_from_label(config.label) == config


@pytest.mark.parametrize(
    "text",
    ["", "SDPA with enable_gqa", "128 tok/8w/3st", "128 tok/8w/3st/2 per SM, fp32", "x tok/8w/3st/2 per SM",
     "128 tok/8w/3st/2 per SM, TMA, scale in q"],  # the loop forms in another order than the label's
)  # fmt: skip
def test_other_text_is_no_launch_label(text: str) -> None:
    assert config_from_label(text) is None


def test_the_split_fills_the_sms_with_whole_tiles_in_one_wave() -> None:
    one = gqa_launch(1, 64, 8, 1, 4097, sms=132, kv_dtype="fp8")  # 8 pairs of 4097 tokens, SHORT: 1 per SM
    assert one.config == SHORT and one.split_grid == (8, 11) and one.tokens_per_split == 384
    assert one.programs_per_busiest_sm == 1 and one.combine_grid == (64, 1) and one.combine_steps == 1
    long = gqa_launch(1, 8, 1, 1, 131073, sms=132, kv_dtype="fp8")  # one pair: LONG, splits capped near 4 per SM
    assert long.config == LONG and long.splits == 513 and long.tiles_per_program == 2
    assert long.combine_block == 1024 and long.combine_steps == 1 and long.combine_grid == (8, 16)
    assert key_launch(_gqa(1, 4096, "fp8"), 132) == one
    assert gqa_launch(1, 64, 8, 1, 4097, sms=132).split_grid == (8, 11)  # BF16 below 16K: the same SHORT
    assert gqa_launch(1, 8, 1, 1, 131073, sms=132).config == LONG_BF16  # BF16 from 16K: three programs per SM


@pytest.mark.parametrize("pairs", [1, 3, 8, 32, 100, 528, 529, 4096])
@pytest.mark.parametrize("length", [1, 127, 4097, 16384, 131073, 1 << 20])
def test_one_wave_never_puts_a_program_more_on_the_busiest_sm(pairs: int, length: int) -> None:
    launch = gqa_launch(pairs, 8, 1, 1, length, sms=132)
    per_sm = launch.config.programs_per_sm
    assert launch.programs_per_busiest_sm <= max(per_sm, -(-pairs // 132))
    assert launch.splits * launch.tokens_per_split >= length > (launch.splits - 1) * launch.tokens_per_split
    assert launch.splits <= 1024 and launch.combine_steps == 1
    even = gqa_launch(pairs, 8, 1, 1, length, sms=132, rule="even")
    assert launch.splits <= even.splits  # never more splits than the even rule took


def test_an_unknown_split_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown GQA split rule"):
        gqa_launch(1, 8, 1, 1, 4096, sms=132, rule="fastest")
    assert key_launch(_gqa(1, 65536, window=4096), 132).length_tokens == 4096  # within its window


def test_recorded_launch_metrics_read_back_as_facts() -> None:
    key = _gqa(2, 16384, "fp8")
    launch = key_launch(key, 132)
    facts = facts_from_metrics({"time_us": 30.0, **launch_metrics(launch)}, key)
    assert facts == GqaLaunchFacts(default_config(16385, "fp8"), 132, "one wave")
    assert facts_from_metrics({"time_us": 30.0}, key) is None
    lazy = key_launch(key, 132, replace(LONG, unmasked=True, lazy_rescale=True))
    assert facts_from_metrics(launch_metrics(lazy), key) == GqaLaunchFacts(lazy.config, 132, "one wave")
    assert facts_from_metrics(launch_metrics(lazy) | {"launch_tma": 2.0}, key) is None


def test_points_recorded_before_the_loop_forms_read_as_the_loop_without_them() -> None:
    key = _gqa(2, 16384, "fp8")
    recorded = {k: v for k, v in launch_metrics(key_launch(key, 132)).items() if k.removeprefix("launch_") not in
                ("fold_scale", "unmasked", "lazy_rescale", "tma", "early_trigger")}  # fmt: skip
    assert len(recorded) == 10  # the metrics of every point recorded so far
    assert facts_from_metrics(recorded, key) == GqaLaunchFacts(default_config(16385, "fp8"), 132, "one wave")


def test_facts_recorded_before_the_split_rule_was_are_read_by_the_even_rule() -> None:
    key = _gqa(4, 65536, "fp8")  # 32 pairs: the even rule takes 17 splits, one wave 16
    even = key_launch(key, 132, rule="even")
    recorded = {k: v for k, v in launch_metrics(even).items() if k != "launch_split_rule"}
    facts = facts_from_metrics(recorded, key)
    assert facts is not None and facts.split_rule == "even" and facts.launch(key).splits == even.splits == 17
    assert key_launch(key, 132).splits == 16
    for bad in (9.0, -1.0, 0.5, float("nan"), float("inf"), 1e300):  # no rule of that index: no facts
        assert facts_from_metrics(recorded | {"launch_split_rule": bad}, key) is None


def test_facts_split_by_another_rule_than_todays_are_not_taken() -> None:
    key = _gqa(2, 16384)
    recorded = launch_metrics(key_launch(key, 132)) | {"launch_splits": 7.0}
    assert facts_from_metrics(recorded, key) is None


def test_results_written_before_the_launch_was_recorded_give_it_by_their_note() -> None:
    note = "split 128 tok/8w/3st/2 per SM, fp16; engine kernel: no engine kernel importable (flashinfer)"
    assert facts_from_note(note, 132) == GqaLaunchFacts(SHORT_BEFORE, 132)
    assert facts_from_note("engine kernel: no engine kernel adapted for gqa at batch 2, bf16 KV", 132) is None
    assert facts_from_note(note, 0) is None


def test_a_curves_shapes_are_read_by_the_rule_that_chose_them() -> None:
    """Points launched by today's shapes read by `default_config`; points of results written before the BF16
    shapes (`SHORT_BEFORE` below 16K over either cache) by `default_config_before`; a mix of neither by none."""
    keys = [_gqa(1, c) for c in (4096, 8192, 32768)]
    today = [(k, GqaLaunchFacts(default_config(k.context + 1, k.kv_dtype), 132, "one wave")) for k in keys]
    before = [(k, GqaLaunchFacts(default_config_before(k.context + 1), 132)) for k in keys]
    got_today, got_before = launch_rule(today), launch_rule(before)
    assert got_today is not None and got_today.config_of is default_config and got_today.split_rule == "one wave"
    assert got_before is not None and got_before.config_of is default_config_before
    assert got_before.launch(keys[0]).config == SHORT_BEFORE and got_before.split_rule == "even"
    mixed = [today[0], before[1], (keys[2], GqaLaunchFacts(FIRST, 132))]
    assert launch_rule(mixed) is None
    assert launch_rule([today[0], (keys[1], GqaLaunchFacts(SHORT, 170, "one wave"))]) is None  # two GPUs

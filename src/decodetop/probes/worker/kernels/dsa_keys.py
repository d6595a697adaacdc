"""Provides the DSA top-k's order-preserving keys and threshold searches (Triton), shared by the radix passes
(`kernels.dsa`) and the one-launch schemes (`kernels.dsa_ticket`): the fp32 score's 32-bit key, its FP16 form's
16-bit key and top byte, and the bin of a histogram that holds the k-th largest element."""

from __future__ import annotations

from decodetop.probes.worker.kernels.common import HAVE_TRITON, tl, triton

#: The radix passes' digits: 8 bits, 256 bins, four of them over a 32-bit key.
DIGIT_BITS = 8
DIGIT_BINS = 1 << DIGIT_BITS
DIGITS = 32 // DIGIT_BITS

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _key_of(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → uint32 whose unsigned order is the float order (negatives: all bits flipped; else the sign bit)."""
        bits = score.to(tl.uint32, bitcast=True)
        flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
        return bits ^ flip

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_key(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → its FP16 form's 16-bit order-preserving key (int32 in [0, 65536)), as `_key_of` flips 32 bits.
        The conversion rounds to nearest even (Triton's default downcast; numpy's under the interpreter) and
        saturates at ±inf, so the key never decreases as the score grows: every score of a higher key is larger
        than every score of a lower one."""
        bits = score.to(tl.float16).to(tl.uint16, bitcast=True)
        flip = tl.where((bits >> 15) == 1, 0xFFFF, 0x8000).to(tl.uint16)
        return (bits ^ flip).to(tl.int32)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_digit(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → the top 8 bits (sign, 5 exponent, 2 mantissa bits: 4 bins per octave) of `_half_key`."""
        return _half_key(score) >> 8

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _bin_of(h, k_rem, NB: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """`_threshold_bin` of a histogram in registers."""
        bins = tl.arange(0, NB)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        b = tl.max(tl.where(at_or_above >= k_rem, bins, -1), 0)
        above = tl.sum(tl.where(bins > b, h, 0), 0)
        return b, above

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _threshold_bin(hist_ptr, k_rem, NB: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(bin, count strictly above it) of the bin holding the `k_rem`-th largest element of a histogram."""
        bins = tl.arange(0, NB)
        h = tl.load(hist_ptr + bins)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        b = tl.max(tl.where(at_or_above >= k_rem, bins, -1), 0)
        above = tl.sum(tl.where(bins > b, h, 0), 0)
        return b, above

"""benchmarks/live_wer.py's paired comparison: a lever against the whole window, clip by clip."""

from __future__ import annotations

from benchmarks.live_wer import compare, paired_delta


def test_a_constant_difference_has_no_spread() -> None:
    assert paired_delta([3, 1, 2, 0], [3, 1, 2, 0], 50) == "+0.0 (+0.0, +0.0)"
    assert paired_delta([4, 2, 3, 1], [3, 1, 2, 0], 50) == "+8.0 (+8.0, +8.0)"


def test_the_interval_holds_the_difference_and_widens_with_spread() -> None:
    lever, full = [0, 5, 0, 0, 1, 0, 3, 0], [1, 0, 1, 1, 0, 2, 0, 1]
    delta, low, high = _parts(paired_delta(lever, full, 100))
    assert delta == 3.0 and low < 0.0 < delta < high
    assert paired_delta(lever, full, 100) == paired_delta(lever, full, 100)  # seeded


def test_compare_pairs_rows_of_the_same_model_and_set() -> None:
    rows = [
        {"model": "m", "set": "s", "lever": lv, "_clip_errors": e, "_words": 20}
        for lv, e in (("offline", [0, 1]), ("full", [1, 1]), ("short", [2, 1]))
    ]
    rows.append({"model": "m", "set": "t", "lever": "short", "_clip_errors": [0], "_words": 5})
    compare(rows)
    offline, full, short, alone = rows
    assert "vs full pp (95 % CI)" not in offline and "vs offline pp" not in offline
    assert full["vs offline pp"].startswith("+5.0") and "vs full pp (95 % CI)" not in full
    assert short["vs full pp (95 % CI)"].startswith("+5.0")
    assert short["vs offline pp"].startswith("+10.0")
    assert "vs full pp (95 % CI)" not in alone  # no whole-window row for its set


def _parts(cell: str) -> tuple[float, float, float]:
    delta, rest = cell.split(" (")
    low, high = rest.rstrip(")").split(", ")
    return float(delta), float(low), float(high)

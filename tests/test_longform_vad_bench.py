"""benchmarks/longform_vad.py's arithmetic: rounds of the time goal's pair, the goals."""

from __future__ import annotations

from benchmarks.longform_vad import figures, rounds


def row(file: str, system: str, seconds: float, d: int = 1) -> dict:
    return {"file": file, "system": system, "seconds": seconds, "words": 10, "S": 1, "D": d}


def test_rounds_keep_the_first_round_and_the_median_seconds() -> None:
    first = [row("a", "fw-b8", 9.1, d=3), row("b", "fw-b8", 2.0)]
    second = [row("a", "fw-b8", 5.5, d=3), row("b", "fw-b8", 2.2)]
    third = [row("a", "fw-b8", 6.0, d=3), row("b", "fw-b8", 1.0)]
    out = rounds([first, second, third])
    assert [r["seconds"] for r in out] == [6.0, 2.0]
    assert out[0]["seconds each"] == [9.1, 5.5, 6.0]
    assert out[0]["D"] == 3
    assert rounds([first]) == first  # one round: as it ran


def test_the_goals_compare_at_equal_work_where_fw_b8_cal_ran() -> None:
    rows = [
        row("phone", "ours-b8", 5.0),
        row("phone", "ours-seq", 11.0),
        row("phone", "fw-b8", 2.0, d=9),
        row("phone", "fw-b8-cal", 6.25),
        row("tones", "ours-b8", 3.0),
        row("tones", "ours-seq", 9.0),
        row("tones", "fw-b8", 5.0),
    ]
    for r in rows:
        r["I"], r["WER %"] = 0, 10.0 * (r["S"] + r["D"])
    out = figures(rows, ["phone", "tones"])
    goals = out["goals, ours batched 8 (greedy)"]
    assert goals["phone"]["b8 s / fw-b8 s"] == 2.5
    assert goals["phone"]["b8 s / fw-b8-cal s"] == 0.8
    assert "b8 s / fw-b8-cal s" not in goals["tones"]
    assert "fw-b8-cal" not in out["in total"]  # it ran on some files only
    assert goals["total"]["b8 s / fw-b8 s"] == round(8.0 / 7.0, 2)

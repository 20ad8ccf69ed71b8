"""What `tp` prints for people: figures a person reads at a glance, tables whole when piped; JSON exact."""

from __future__ import annotations

import json

import pytest

from training_platform.cli.common import emit
from training_platform.cli.terminal import readable, readable_duration, readable_usd


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.5168033730877046, "0.5168"),
        (0.00010178249313185613, "0.0001018"),
        (3.626e-05, "0.00003626"),
        (-2.5, "-2.5"),
        (1234.5, "1234"),
        (45.6, "45.6"),
        (0.0, "0"),
        (15260.37, "15,260"),
        (300, "300"),
        (True, "True"),
        ("31c45db42dc30e26", "31c45db42dc30e26"),
    ],
)
def test_a_float_reads_to_four_significant_digits_and_nothing_else_changes(value, shown):
    assert readable(value) == shown


def test_a_summary_reads_rounded_for_people_and_exact_in_json(capsys):
    summary = {"run_id": "digits-1", "goodput": 0.5168033730877046, "final_step": 300}
    emit(summary, as_json=False)
    shown = capsys.readouterr().err
    assert "0.5168" in shown and "0.51680337" not in shown and "digits-1" in shown and "300" in shown
    emit(summary, as_json=True)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == summary


def test_durations_and_dollars_read_in_a_persons_units_however_small():
    assert [readable_duration(s) for s in (3.6e-6, 30, 600, 7200, 3.6e7)] == ["<1 s", "30 s", "10 min", "2.0 h",
                                                                              "10,000.0 h"]
    assert [readable_usd(d) for d in (1.845e-09, 0.0, 0.01234, 12345.678)] == ["<0.0001", "0.0000", "0.0123",
                                                                              "12,345.6780"]

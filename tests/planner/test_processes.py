"""`map_in_processes`: processes give the answer in order, one core maps here, and a booking over several
chips (searched in processes where there are cores) is the booking searched here."""

import pytest

from planner import processes
from planner.book import book
from planner.processes import map_in_processes

pytestmark = pytest.mark.pure


def test_processes_answer_in_order():
    assert map_in_processes(abs, [-3, 1, -2]) == [3, 1, 2]


def test_one_core_maps_here(monkeypatch):
    monkeypatch.setattr(processes, "free_cores", lambda: 1)
    monkeypatch.setattr(processes, "ProcessPoolExecutor", None)  # a pool would fail here
    assert map_in_processes(abs, [-3, 1]) == [3, 1]


def test_a_booking_in_processes_is_the_booking_here(monkeypatch):
    chips = ["v6e", "v5e"]
    apart = book("llama3.1-8b", "1M", tokens="100B", within="30d", chips=chips).to_dict()
    monkeypatch.setattr(processes, "free_cores", lambda: 1)
    assert book("llama3.1-8b", "1M", tokens="100B", within="30d", chips=chips).to_dict() == apart

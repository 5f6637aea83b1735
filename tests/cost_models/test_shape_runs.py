"""Pure tier: a price prices what does not read the links once per run of rows alike but for them, and each
row of such a table is priced as that row alone is."""

import dataclasses

import numpy as np
import pytest

import planner
from cost_models.candidates import LinkColumns, stacked
from cost_models.pricing import price
from cost_models.pricing.step import shape_runs
from planner.estimate import candidates_of

pytestmark = pytest.mark.pure


def _slower_links(x, factor: float):
    """`x` with every collective and ring link `factor` times slower."""

    def slower(link: LinkColumns) -> LinkColumns:
        return LinkColumns(link.bw / factor, link.latency * factor)

    return dataclasses.replace(x, links={g: slower(link) for g, link in x.links.items()}, ring_link=slower(x.ring_link))


def test_rows_alike_but_for_links_are_one_run_and_each_is_priced_as_alone():
    plan = planner.plan("llama3.1-8b", "128k", "v5p:2x2x4", global_batch=4)
    x = candidates_of(plan)
    other_remat = dataclasses.replace(x, remat=(x.remat + 1) % 4)
    parts = [x, _slower_links(x, 2.0), _slower_links(x, 3.0), other_remat]
    table = stacked(parts, np.arange(len(parts)), x.case)
    shapes, which = shape_runs(table)
    assert len(shapes.ring) == 2 and which.tolist() == [0, 0, 0, 1]
    both = price(table)
    for i, part in enumerate(parts):
        alone = price(part)
        assert float(both.step_time_s[i]) == float(alone.step_time_s[0])
        for name, column in alone.memory.items():
            assert float(np.broadcast_to(both.memory[name], (4,))[i]) == float(np.broadcast_to(column, (1,))[0])
    # the links change the step, not the memory
    assert both.step_time_s[1] > both.step_time_s[0]
    assert float(both.hbm_total[1]) == float(both.hbm_total[0])

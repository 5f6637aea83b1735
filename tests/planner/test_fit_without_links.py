"""The batch probe's short cut: where the memory and host bytes (which do not read the links) decide whether
some candidate fits, they decide it as the full price does, at the plain and the surely-fitting cap."""

import collections

import pytest

from cost_models.models import get_model
from cost_models.targets import Target
from cost_models.topology import get_topology
from planner.options import SearchOptions, parse_seq_len
from planner.search import SearchSpace

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    "model, seq_len, topology, target",
    [
        ("llama3.1-8b", "1M", "v5p-256", Target.CPPLAN),  # both backward kernels priced
        ("llama3.1-8b", "4M", "tpu7x-128", Target.CPPLAN),
        ("llama3.1-8b", "128K", "v5p-64", Target.MAXTEXT),  # MaxText's kernels: one way
        ("gemma3-12b", "128K", "v5p-64", Target.CPPLAN),  # local layers choose their strategy: never short cut
    ],
)
def test_fit_read_off_memory_is_the_full_prices(model, seq_len, topology, target):
    space = SearchSpace(
        get_model(model), parse_seq_len(seq_len), get_topology(topology), SearchOptions.build(), target=target
    )
    plain = space.topology.hbm_bytes_per_device
    answers = collections.Counter()
    for shards in space.shard_counts[:8]:
        for per_shard in (1, 2, 5, 16, 64):
            for cap in (plain, plain / (1 + space._memory_margins[0])):
                known = space._fits_unpriced(shards, per_shard, cap)
                answers[known] += 1
                assert known is None or known == (space._least_hbm(shards, per_shard) <= cap), (shards, per_shard)
    if model.startswith("gemma"):
        assert set(answers) == {None}
    else:  # it decides most probes, both ways
        assert answers[True] and answers[False] and answers[None] < answers[True] + answers[False]

"""One priced candidate of the `small` model at 2048 tokens, every link 1 GB/s with no latency, for
tests that check a strategy's spec by hand (imported by pure tests; tests/conftest.py puts tests/ on the path)."""

from cost_models.candidates import Candidates, LinkColumns
from cost_models.case import Case
from cost_models.models import MODELS
from cost_models.topology import get_topology
from cost_models.vocabulary import CPStrategy


def one_candidate(
    strategy: CPStrategy, topology: str = "v5p:2x2x1", *, ring: int = 1, ulysses: int = 1, zigzag: bool = False
) -> Candidates:
    """The one candidate: one sequence, blocks of 128, no data, FSDP or tensor parallelism."""
    link = LinkColumns([1e9], [0.0])
    return Candidates(
        case=Case(MODELS["small"], get_topology(topology), seq_len=2048, global_batch=1),
        strategy=strategy,
        data=[1],
        fsdp=[1],
        ring=[ring],
        ulysses=[ulysses],
        tensor=[1],
        remat=[0],
        zigzag=[zigzag],
        block_q=[128],
        block_kv=[128],
        links={k: link for k in ("data", "weights", "tensor", "context", "ulysses")},
        ring_link=link,
    )

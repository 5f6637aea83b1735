"""cpplan's planner: search mesh shapes × context-parallel strategies × remat, price each with
`cost_models`, and explain the choice. Never imports jax."""

from cost_models.errors import CpplanError
from cost_models.estimate import Estimate
from cost_models.models import ModelSpec
from cost_models.vocabulary import AXES, CPStrategy, LoadBalance, RematPolicy
from planner.api import LongestSequence, evaluate, explain, max_seq_len, plan
from planner.book import Booking, book
from planner.estimate import candidates_of, estimate
from planner.explanation import Explanation
from planner.plan import Plan, make_mesh
from planner.search import Rejection

__all__ = [
    "AXES",
    "Booking",
    "CPStrategy",
    "CpplanError",
    "Estimate",
    "Explanation",
    "LoadBalance",
    "LongestSequence",
    "ModelSpec",
    "Plan",
    "Rejection",
    "RematPolicy",
    "book",
    "candidates_of",
    "estimate",
    "evaluate",
    "explain",
    "make_mesh",
    "max_seq_len",
    "plan",
]

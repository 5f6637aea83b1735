"""cpplan's planner: search mesh shapes × context-parallel strategies × remat, price each with
`cost_models`, and explain the choice. Never imports jax."""
from cost_models.errors import CpplanError
from cost_models.models import ModelSpec
from cost_models.vocabulary import AXES, CPStrategy, LoadBalance, RematPolicy
from planner.plan import Plan, make_mesh

__all__ = ["AXES", "CPStrategy", "CpplanError", "LoadBalance", "ModelSpec", "Plan", "RematPolicy", "make_mesh"]

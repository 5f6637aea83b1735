"""The optimizer of a training run, defined once for `cpplan run`, `cpplan validate` (`runtime.run`) and
the compiles: AdamW with MaxText 0.2.5's defaults. The learning rate rises linearly from 0 over the
warmup, then decays to a floor (cosine unless asked otherwise) by the run's last step; the gradients are
clipped to a global norm before the update.

Sources, MaxText 0.2.5 (PyPI wheel maxtext-0.2.5-py3-none-any.whl, sha256 2fe8e4ff…c9406):
`maxtext/configs/base.yml` gives learning_rate 3.e-5, lr_schedule_type 'cosine',
learning_rate_final_fraction 0.1 (named cosine_learning_rate_final_fraction in earlier releases),
warmup_steps_fraction 0.1, learning_rate_schedule_steps -1 (the run's steps), gradient_clipping_threshold
1.0, adam_b1 0.9, adam_b2 0.95, adam_eps 1.e-8, adam_weight_decay 0.1; `maxtext/utils/maxtext_utils.py`
`create_learning_rate_schedule` builds the warmup (int(steps × fraction) steps, from 0) and the cosine,
which reaches the floor at the last step; `maxtext/trainers/pre_train/train.py` clips the raw gradients
by their global norm (optax's `clip_by_global_norm`) before the optimizer's update. This module follows
that behaviour in its own code.

Jax-free at import: the CLI checks the flags with it before jax starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from cost_models.errors import CpplanError

WARMUP_FRACTION = 0.1  # base.yml warmup_steps_fraction: the warmup's share of the run's steps


class Decay(Enum):
    """How the learning rate falls from its peak after the warmup."""

    COSINE = "cosine"  # MaxText's lr_schedule_type 'cosine': half a cosine down to the floor
    LINEAR = "linear"  # a straight line down to the floor
    CONSTANT = "constant"  # no decay: the peak to the end

    @classmethod
    def parse(cls, text: "str | Decay") -> "Decay":
        """Raises CpplanError naming the known decays."""
        if isinstance(text, cls):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise CpplanError(
                f"--decay {text!r} is not a decay; give one of {', '.join(d.value for d in cls)}."
            ) from None


@dataclass(frozen=True)
class AdamW:
    """AdamW over a run of `steps` steps: the rate warms up from 0 to `learning_rate` over `warmup_steps`
    (None: `WARMUP_FRACTION` of the steps, rounded down, as MaxText), then follows `decay` down to
    `final_fraction` × `learning_rate` at the last step; the gradients' global norm is clipped to
    `clip_norm` first (0: no clipping). `steps` None (a step taken by hand, a compile) has no span to
    decay over: the rate holds its peak after any warmup.

    Raises:
        CpplanError: a value out of its range, named with the flag that sets it and the fix.
    """

    steps: int | None = None
    learning_rate: float = 3e-5
    warmup_steps: int | None = None
    decay: Decay = Decay.COSINE
    final_fraction: float = 0.1
    clip_norm: float = 1.0
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self):
        object.__setattr__(self, "decay", Decay.parse(self.decay))
        if self.steps is not None and not _whole(self.steps, 1):
            raise CpplanError(f"--steps {self.steps!r}: the schedule spans a whole number of steps, at least 1.")
        if not _number(self.learning_rate) or self.learning_rate <= 0:
            raise CpplanError(
                f"--learning-rate {self.learning_rate!r}: the peak learning rate must be a number above 0; "
                f"give e.g. 3e-05 (MaxText's default)."
            )
        if self.warmup_steps is not None:
            if not _whole(self.warmup_steps, 0):
                raise CpplanError(f"--warmup-steps {self.warmup_steps!r}: give a whole number of steps, 0 or more.")
            if self.steps is not None and self.warmup_steps > self.steps:
                raise CpplanError(
                    f"--warmup-steps {self.warmup_steps} with --steps {self.steps}: the warmup must end by the "
                    f"run's last step; give at most {self.steps} warmup steps, or more --steps."
                )
        if not _number(self.final_fraction) or not 0 <= self.final_fraction <= 1:
            raise CpplanError(
                f"--final-lr-fraction {self.final_fraction!r}: the rate decays to this fraction of "
                f"--learning-rate, from 0 to 1; give e.g. 0.1 (MaxText's default)."
            )
        for flag, value, what, default in (
            ("--clip-norm", self.clip_norm, "the gradients' largest global norm (0: no clipping)", 1.0),
            ("--weight-decay", self.weight_decay, "AdamW's weight decay", 0.1),
        ):
            if not _number(value) or value < 0:
                raise CpplanError(
                    f"{flag} {value!r}: {what} is a number of 0 or more; give e.g. {default} (MaxText's default)."
                )
        for name, value, default in (("b1", self.b1, 0.9), ("b2", self.b2, 0.95)):
            if not _number(value) or not 0 <= value < 1:
                raise CpplanError(f"adam {name} {value!r}: a moment's decay rate is in [0, 1); give e.g. {default}.")
        if not _number(self.eps) or self.eps <= 0:
            raise CpplanError(f"adam eps {self.eps!r}: give a number above 0, e.g. 1e-08.")

    @property
    def warmup(self) -> int:
        """Steps of the warmup."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(WARMUP_FRACTION * self.steps) if self.steps is not None else 0

    @property
    def final_learning_rate(self) -> float:
        """The rate at the last step (the peak where nothing decays)."""
        if self.steps is None or self.decay is Decay.CONSTANT or self.warmup >= self.steps:
            return self.learning_rate
        return self.learning_rate * self.final_fraction

    def schedule(self):
        """The learning rate of the update numbered `count` (0 for the first step), as optax calls it:
        `count / warmup` of the peak during the warmup, then the decay, whose `steps - warmup` updates
        run from the peak at its first to the floor at its last (one update: the floor)."""
        import jax.numpy as jnp

        peak, floor, warmup = self.learning_rate, self.learning_rate * self.final_fraction, self.warmup
        span = None if self.steps is None or self.decay is Decay.CONSTANT else self.steps - warmup - 1

        def rate(count):
            count = jnp.asarray(count, jnp.float32)
            rising = peak * count / max(warmup, 1)
            if span is None:
                after = jnp.float32(peak)
            else:
                done = jnp.clip((count - warmup) / span, 0.0, 1.0) if span > 0 else jnp.float32(1.0)
                if self.decay is Decay.COSINE:
                    after = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * done))
                else:
                    after = peak + (floor - peak) * done
            return jnp.where(count < warmup, rising, after)

        return rate

    def transformation(self, *, mu_dtype: str = "float32"):
        """The optax transformation: clipping, then AdamW on the schedule, its first moment in `mu_dtype`
        (MaxText's mu_dtype), its second in the parameters' dtype (optax keeps nu as the parameters). The
        state is the moments the price counts (`cost_models`), and two int32 step counts (Adam's and the
        schedule's): 8 bytes, not priced."""
        import jax
        import jax.numpy as jnp
        import optax

        adamw = optax.adamw(
            self.schedule(),
            b1=self.b1,
            b2=self.b2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            mu_dtype=jnp.dtype(mu_dtype),
        )
        # the gradients whole before their norm is taken: left free, XLA's TPU compiler (libtpu 0.0.52) fuses the
        # norm's squares into the gradients' reduce-scatters and, for a vocabulary split eight ways with
        # sequence parallelism, fails ("No feasible span count for single input all reduce scatter fusion")
        whole = optax.stateless(lambda updates, params=None: jax.lax.optimization_barrier(updates))
        clip = (whole, optax.clip_by_global_norm(self.clip_norm))
        # without clipping, stateless steps in their place: the state is laid out alike either way, so a run
        # resumes from its checkpoints whatever --clip-norm either part of it was given
        return optax.chain(*(clip if self.clip_norm > 0 else (optax.identity(),) * len(clip)), adamw)

    def __str__(self) -> str:
        rate = f"learning rate {self.learning_rate:g}"
        if self.warmup:
            rate = f"learning rate 0 → {self.learning_rate:g} over {self.warmup} warmup steps"
        if self.final_learning_rate != self.learning_rate:
            rate += f", then {self.decay.value} to {self.final_learning_rate:g} at step {self.steps}"
        elif self.steps is not None and self.warmup < self.steps:
            rate += ", then constant"
        clip = f"gradients clipped to global norm {self.clip_norm:g}" if self.clip_norm > 0 else "no clipping"
        return (
            f"AdamW (b1 {self.b1:g}, b2 {self.b2:g}, eps {self.eps:g}, weight decay {self.weight_decay:g}): "
            f"{rate}; {clip}"
        )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low

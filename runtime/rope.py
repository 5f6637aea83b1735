"""Rotary position embedding: the rotation of queries and keys by their positions (rotate-half form, as
Hugging Face's Llama and Mistral checkpoints lay q and k out), and the frequencies it turns at: a base
`theta` (Llama 3's by default), optionally rescaled as a Hugging Face config's `rope_scaling` (or
`rope_parameters`) says: `linear`, `llama3` or `yarn`; Gemma 3's global and local layers each turn at their
own (`Rope.per_layer_type`). The one implementation the model calls.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from cost_models.errors import CpplanError

ROPE_THETA = 500_000.0  # Llama 3
# Hugging Face's base when a llama or mistral config names none (their configs' `default_theta`)
HF_DEFAULT_THETA = 10_000.0
# Gemma 3's bases of its global and local layers where a config names none (Gemma3TextConfig's `default_theta`)
GEMMA3_DEFAULT_THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
SCALINGS = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class Rope:
    """RoPE's frequencies: `theta ** (-2i / head_dim)` for rotation pair i, rescaled by `scaling`:

    - linear: every frequency divided by `factor` (positions interpolated);
    - llama3: frequencies whose wavelength exceeds `original_context / low_freq_factor` divided by `factor`,
      those under `original_context / high_freq_factor` kept, a smooth blend between (Llama 3.1);
    - yarn: each frequency blended between itself and itself over `factor` by a ramp over the rotation
      pairs between the pairs that turn `beta_fast` and `beta_slow` times over `original_context`
      (floored and ceiled where `truncate`), and cos and sin scaled by `attention_factor` (YaRN, arXiv
      2309.00071, Eq. 21 for the default factor `0.1 ln(factor) + 1`).
    """

    theta: float = ROPE_THETA
    scaling: str = "default"
    factor: float = 1.0
    original_context: int = 0  # the pre-training context (`original_max_position_embeddings`): llama3, yarn
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise CpplanError(f"RoPE scaling {self.scaling!r} is not one cpplan's runtime runs: {', '.join(SCALINGS)}.")
        if not (isinstance(self.theta, (int, float)) and self.theta > 1 and math.isfinite(self.theta)):
            raise CpplanError(f"RoPE theta={self.theta!r} must be a finite number above 1, e.g. 500000.")
        if self.scaling != "default" and not self.factor > 0:
            raise CpplanError(f"RoPE {self.scaling} scaling: factor={self.factor!r} must be positive.")
        if self.scaling in ("llama3", "yarn") and not self.original_context >= 1:
            raise CpplanError(
                f"RoPE {self.scaling} scaling needs the pre-training context (original_max_position_embeddings), "
                f"a positive integer, not {self.original_context!r}."
            )
        if self.scaling == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise CpplanError(
                f"RoPE llama3 scaling: high_freq_factor={self.high_freq_factor} must exceed "
                f"low_freq_factor={self.low_freq_factor}."
            )

    def frequencies(self, head_dim: int) -> np.ndarray:
        """The `head_dim // 2` angular frequencies (radians per position), float64."""
        half = head_dim // 2
        base = self.theta ** (-2.0 * np.arange(half) / head_dim)
        if self.scaling == "linear":
            return base / self.factor
        if self.scaling == "llama3":
            wavelength = 2 * math.pi / base
            smooth = (self.original_context / wavelength - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            # smooth ≤ 0: a long wavelength, divided by the factor; ≥ 1: a short one, kept
            smooth = np.clip(smooth, 0.0, 1.0)
            return (1 - smooth) * base / self.factor + smooth * base
        if self.scaling == "yarn":
            low, high = (self._pair_turning(turns, head_dim) for turns in (self.beta_fast, self.beta_slow))
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, head_dim - 1)
            if low == high:
                high += 0.001  # a step, not a ramp
            interpolated = np.clip((np.arange(half) - low) / (high - low), 0.0, 1.0)
            return base * (1 - interpolated) + base / self.factor * interpolated
        return base

    def _pair_turning(self, turns: float, head_dim: int) -> float:
        """The (fractional) rotation pair whose wavelength fits `turns` times into `original_context`."""
        return head_dim * math.log(self.original_context / (turns * 2 * math.pi)) / (2 * math.log(self.theta))

    def describe(self) -> str:
        """The settings in a phrase."""
        if self.scaling == "default":
            return f"theta {self.theta:g}"
        return f"theta {self.theta:g}, {self.scaling} scaling by {self.factor:g}"

    @classmethod
    def from_hf_config(cls, cfg: dict, *, where: str, theta: float | None = None) -> "Rope":
        """The RoPE of a Hugging Face config: its `rope_parameters` (transformers 5), else `rope_theta` with
        `rope_scaling` (transformers 4); `theta` (None: the config's) overrides the base.

        Raises:
            CpplanError: a scaling the runtime does not run, per-layer-type RoPE, a partial rotary factor,
                or a malformed field, named with `where` (the config's path).
        """
        params = cfg.get("rope_parameters")
        if params is None:
            params = cfg.get("rope_scaling") or {}
        if not isinstance(params, dict):
            raise CpplanError(f"{where}: rope_parameters={params!r:.60} must be an object; fix the config.")
        if params and all(isinstance(v, dict) for v in params.values()):
            raise CpplanError(
                f"{where}: rope_parameters gives each layer type its own RoPE ({', '.join(params)}); cpplan's "
                f"runtime turns every layer at one set of frequencies."
            )
        kind = params.get("rope_type", params.get("type")) or "default"
        if kind not in SCALINGS:
            raise CpplanError(
                f"{where}: RoPE scaling {kind!r} is not one cpplan's runtime runs; it runs {', '.join(SCALINGS)}."
            )
        rotary = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        if rotary != 1.0:
            raise CpplanError(
                f"{where}: partial_rotary_factor={rotary!r}: cpplan's runtime rotates every dimension of a head."
            )
        base = params.get("rope_theta", cfg.get("rope_theta", HF_DEFAULT_THETA)) if theta is None else theta
        original = params.get("original_max_position_embeddings") or cfg.get(
            "original_max_position_embeddings", cfg.get("max_position_embeddings", 0)
        )
        factor = params.get("factor")
        if factor is None and kind == "yarn" and original:  # transformers' inference for YaRN configs
            factor = cfg.get("max_position_embeddings", 0) / original
        try:
            rope = cls(
                theta=float(base),
                scaling=kind,
                factor=float(factor if factor is not None else 1.0),
                original_context=int(original or 0),
                low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                beta_fast=float(params.get("beta_fast") or 32.0),
                beta_slow=float(params.get("beta_slow") or 1.0),
                truncate=bool(params.get("truncate", True)),
            )
        except (TypeError, ValueError) as err:
            if isinstance(err, CpplanError):
                raise CpplanError(f"{where}: {err} Fix the config.") from None
            raise CpplanError(f"{where}: a RoPE field does not read as a number ({err}); fix the config.") from None
        if kind != "yarn":
            return rope
        return _with_yarn_attention_factor(rope, params, where)

    @classmethod
    def per_layer_type(cls, cfg: dict, *, where: str, theta: float | None = None) -> tuple["Rope", "Rope"]:
        """The `(global, local)` RoPEs of a config whose global and local layers turn at frequencies of their
        own (Gemma 3): its `rope_parameters` per layer type (transformers 5), else `rope_theta` with
        `rope_scaling` for the global layers and `rope_local_base_freq` for the local ones, unscaled
        (transformers 4); bases a config leaves out are Gemma 3's. `theta` overrides the global base.

        Raises:
            CpplanError: as `from_hf_config`, or a layer type other than full and sliding attention.
        """
        params = cfg.get("rope_parameters")
        if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
            unknown = sorted(set(params) - set(GEMMA3_DEFAULT_THETAS))
            if unknown:
                raise CpplanError(
                    f"{where}: rope_parameters names layer type {unknown[0]!r}; cpplan's runtime turns "
                    f"{' and '.join(GEMMA3_DEFAULT_THETAS)} layers at their own frequencies, no others."
                )
            by_type = {kind: dict(params.get(kind) or {}) for kind in GEMMA3_DEFAULT_THETAS}
        else:
            scaling = (params if isinstance(params, dict) else None) or cfg.get("rope_scaling") or {}
            by_type = {
                "full_attention": {**scaling, "rope_theta": cfg.get("rope_theta")},
                "sliding_attention": {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq")},
            }
        ropes = []
        for kind, default in GEMMA3_DEFAULT_THETAS.items():
            flat = {**by_type[kind]}
            if flat.get("rope_theta") is None:
                flat["rope_theta"] = default
            given = theta if kind == "full_attention" else None
            ropes.append(cls.from_hf_config({**cfg, "rope_parameters": flat}, where=f"{where} ({kind})", theta=given))
        return ropes[0], ropes[1]


def yarn_scale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude for a context stretched `factor` times: `0.1 · mscale · ln(factor) + 1` (1 within)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _with_yarn_attention_factor(rope: Rope, params: dict, where: str) -> Rope:
    """`rope` with YaRN's attention factor: the config's, else from `mscale` over `mscale_all_dim` where it
    gives both (DeepSeek's form), else YaRN's default for the factor."""
    given, mscale, all_dims = (params.get(k) for k in ("attention_factor", "mscale", "mscale_all_dim"))
    if given is None:
        if mscale and all_dims:
            given = yarn_scale(rope.factor, mscale) / yarn_scale(rope.factor, all_dims)
        else:
            given = yarn_scale(rope.factor)
    if not isinstance(given, (int, float)) or not given > 0:
        raise CpplanError(f"{where}: RoPE attention_factor={given!r} must be a positive number; fix the config.")
    return dataclasses.replace(rope, attention_factor=float(given))


def _rotation(positions: jax.Array, head_dim: int, settings: Rope) -> tuple[jax.Array, jax.Array]:
    """cos and sin of RoPE's angles at integer `positions` `[b, s]`, scaled by the attention factor, fp32
    `[b, s, 1, head_dim // 2]`."""
    freq = jnp.asarray(settings.frequencies(head_dim), jnp.float32)
    angle = positions.astype(jnp.float32)[..., None, None] * freq
    return jnp.cos(angle) * settings.attention_factor, jnp.sin(angle) * settings.attention_factor


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x's halves rotated by the angles (rotate-half form), computed in cos's dtype, returned in x's."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(cos.dtype), x[..., half:].astype(cos.dtype)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


DEFAULT = Rope()


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rope(x: jax.Array, positions: jax.Array, settings: Rope) -> jax.Array:
    return _rotate(x, *_rotation(positions, x.shape[-1], settings))


def rope(x: jax.Array, positions: jax.Array, settings: Rope = DEFAULT) -> jax.Array:
    """Rotary embedding (rotate-half form) of `[b, s, heads, d]` at integer `positions` `[b, s]`, turning at
    `settings`' frequencies."""
    return _rope(x, positions, settings)


def _rope_forward(x: jax.Array, positions: jax.Array, settings: Rope) -> tuple[jax.Array, jax.Array]:
    return _rope(x, positions, settings), positions


def _rope_backward(settings: Rope, positions: jax.Array, grad: jax.Array) -> tuple[jax.Array, None]:
    # A rotation's transpose is the rotation by minus the angle (times the same attention factor). It runs
    # in the gradient's dtype: autodiff of the fp32 forward casts dq to fp32 first, and on tpu7x the
    # relayout after Ulysses' all-to-all then holds that fp32 copy at the heap's top
    # (docs/provenance/cost_models.md#memory).
    cos, sin = _rotation(positions, grad.shape[-1], settings)
    return _rotate(grad, cos.astype(grad.dtype), -sin.astype(grad.dtype)), None


_rope.defvjp(_rope_forward, _rope_backward)

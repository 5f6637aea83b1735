"""Collective times on torus axes, in the scaling book's terms ("How to Scale Your Model").

`bw` is the bandwidth an axis gets for collectives (`AxisLinks.collective_bw_bytes_per_s`), `lat` its
latency term; arguments are numpy arrays or scalars. `Collectives` prices them for one chip row: by
these formulas, or at a host's measured rate per kind (`Chip.host_collectives`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _safe(volume, n, bw):
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, volume * (n - 1) / np.maximum(n, 1) / bw, 0.0)


def all_gather(gathered_bytes, n, bw, lat):
    """All-gather whose result is `gathered_bytes` per device: V/W · (n-1)/n, plus latency."""
    return _safe(gathered_bytes, n, bw) + np.where(np.asarray(n) > 1, lat, 0.0)


def reduce_scatter(unreduced_bytes, n, bw, lat):
    """Reduce-scatter of an array of `unreduced_bytes` per device: the same cost as an all-gather."""
    return all_gather(unreduced_bytes, n, bw, lat)


def all_reduce(bytes_per_device, n, bw, lat):
    """All-reduce: a reduce-scatter then an all-gather."""
    return 2 * all_gather(bytes_per_device, n, bw, lat)


def all_to_all(bytes_per_device, n, bw, lat):
    """All-to-all where each device holds `bytes_per_device` (A) before and after: A·n/(4W), a quarter of
    the whole array's all-gather, so it does not grow with n (A·(n−1)/(4W) would beat the links at n = 2)."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, np.asarray(bytes_per_device) * n / (4 * bw) + lat, 0.0)


def ppermute(bytes_per_device, ring_bw, ring_lat):
    """One ring step: every device sends its block to the next one."""
    return bytes_per_device / ring_bw + ring_lat


def windowed_einsum(gathered_bytes, n, bw, lat):
    """A matmul XLA splits into a loop that passes one operand's shards round the ring both ways
    (a windowed einsum), where the whole operand is `gathered_bytes`: n/2 steps each way and the
    first, V/W · (n+1)/n, where a ring all-gather of it moves (n−1)/n."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, gathered_bytes * (n + 1) / np.maximum(n, 1) / bw + lat, 0.0)


def host_all_to_all(bytes_per_device, n, bw, lat):
    """All-to-all in shared memory: each device copies in the (n-1)/n of A it does not keep."""
    return _safe(bytes_per_device, n, bw) + np.where(np.asarray(n) > 1, lat, 0.0)


HOST_FORMULAS = {
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "all_to_all": host_all_to_all,
    "ppermute": lambda bytes_per_device, n, bw, lat: ppermute(bytes_per_device, bw, lat),
}
# over links every kind has the same formula as on a host but the all-to-all (A·n/4W on a torus); the
# windowed einsum is the TPU compiler's alone
TORUS_FORMULAS = {**HOST_FORMULAS, "all_to_all": all_to_all, "windowed_einsum": windowed_einsum}


@dataclass(frozen=True)
class Collectives:
    """Collective times for one chip row; `host` holds ((kind, bytes/s, latency s), ...) measured on a
    host, and a kind listed there is priced at its own rate, whatever links are given."""

    host: tuple = ()

    def _price(self, kind, volume, n, bw, lat):
        for name, host_bw, host_lat in self.host:
            if name == kind:
                return HOST_FORMULAS[kind](volume, n, host_bw, host_lat)
        return TORUS_FORMULAS[kind](volume, n, bw, lat)

    def all_gather(self, gathered_bytes, n, bw, lat):
        return self._price("all_gather", gathered_bytes, n, bw, lat)

    def reduce_scatter(self, unreduced_bytes, n, bw, lat):
        return self._price("reduce_scatter", unreduced_bytes, n, bw, lat)

    def all_reduce(self, bytes_per_device, n, bw, lat):
        """A reduce-scatter then an all-gather."""
        return self.reduce_scatter(bytes_per_device, n, bw, lat) + self.all_gather(bytes_per_device, n, bw, lat)

    def all_to_all(self, bytes_per_device, n, bw, lat):
        return self._price("all_to_all", bytes_per_device, n, bw, lat)

    def windowed_einsum(self, gathered_bytes, n, bw, lat):
        return self._price("windowed_einsum", gathered_bytes, n, bw, lat)

    def ppermute(self, bytes_per_device, ring_bw, ring_lat):
        return self._price("ppermute", bytes_per_device, 2, ring_bw, ring_lat)  # a ring step: n plays no part

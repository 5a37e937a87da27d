"""Importance sampling against the engine's logprobs: truncated (TIS) and masked (MIS).

TRL's async loss is PPO's clipped surrogate with the ratio r = pi_theta / pi_engine taken
against the logprobs vLLM returned when it sampled (no second "old policy" forward). r
mixes two things: the policy moved since it sampled (staleness, earlier micro-steps) and
the two sides compute the same policy differently (kernels, dtype: largest with bfloat16,
nil with float32 on both sides on a CPU). PPO's clip bounds r only where the advantage
pushes it further out; with a negative advantage a token the trainer finds far likelier
than the engine did has an unbounded term. Per token, with rho = r (detached):

- **MIS**, a band [low, high]: a token whose rho leaves it is masked out of the loss (no
  gradient): the two sides disagree too much for its term to mean anything (prime-rl's
  token mask, IcePop).
- **TIS**, a cap C: a token with a negative advantage and rho > C keeps its gradient with
  the weight C instead of rho (truncated importance sampling, Yao et al. 2025; in this
  ratio-against-the-engine form, PPO's dual clip). Positive advantages are bounded by
  PPO's clip already.

`correct` is applied to the forward's log-probs before TRL's loss reads them, so the loss
itself stays TRL's: a masked token's log-prob becomes the engine's (r = 1, a constant),
a capped one `old + log C + (lp - lp.detach())` (value C, gradient C * grad lp).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Importance:
    """`grpo.importance_cap` (None: no TIS) and `grpo.importance_band` (None: no MIS)."""

    cap: float | None = 2.0
    band: tuple[float, float] | None = (0.125, 8.0)


def correct(log_probs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
            settings: Importance) -> tuple[torch.Tensor, torch.Tensor]:
    """The trained tokens' log-probs as the loss should see them, and the mask of the
    tokens left out (MIS)."""
    import torch

    rho = torch.exp(log_probs.detach() - old)
    masked = torch.zeros_like(rho, dtype=torch.bool)
    if settings.band is not None:
        low, high = settings.band
        masked = (rho < low) | (rho > high)
    out = torch.where(masked, old, log_probs)
    if settings.cap is not None:
        truncated = old + math.log(settings.cap) + (log_probs - log_probs.detach())
        out = torch.where(_capped(rho, advantages, masked, settings), truncated, out)
    return out, masked


def _capped(rho: torch.Tensor, advantages: torch.Tensor, masked: torch.Tensor,
            settings: Importance) -> torch.Tensor:
    """TIS's tokens: rho over the cap with a negative advantage, not already masked."""
    import torch

    if settings.cap is None:
        return torch.zeros_like(masked)
    return (rho > settings.cap) & (advantages < 0) & ~masked


STATS: tuple[str, ...] = ("tokens", "masked", "capped", "ratio_sum", "kl_sum", "live")


def measure(log_probs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
            masked: torch.Tensor, settings: Importance) -> torch.Tensor:
    """One batch's sums, in `STATS` order (a tensor, for the ranks' reduction): trained
    tokens, masked, capped, rho, TRL's approximate KL to the sampler ((rho - 1) - log
    rho), and tokens left in the loss with a non-zero advantage."""
    import torch

    log_rho = log_probs.detach() - old
    rho = torch.exp(log_rho)
    capped = _capped(rho, advantages, masked, settings)
    return torch.stack([torch.ones_like(rho).sum(), masked.float().sum(),
                        capped.float().sum(), rho.sum(), ((rho - 1) - log_rho).sum(),
                        ((advantages != 0) & ~masked).float().sum()])


def metrics(sums: Mapping[str, float], ratio_max: float) -> dict[str, float | tuple[float, float]]:
    """One batch's figures in TRL's sink shapes: rates as (numerator, denominator)."""
    n = sums["tokens"]
    return {"harnessrl/is_masked_fraction": (sums["masked"], n),
            "harnessrl/is_capped_fraction": (sums["capped"], n),
            "harnessrl/is_ratio_mean": (sums["ratio_sum"], n),
            "harnessrl/is_ratio_max": ratio_max,
            "harnessrl/kl_to_sampler": (sums["kl_sum"], n)}

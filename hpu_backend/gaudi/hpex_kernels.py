"""``hpex`` kernels beyond attention that Optimum Habana calls: ``FusedRMSNorm`` and ``CTCLoss``.

Each computes what Intel's kernel documents, in the host dtype, with torch's ops (so autograd, lazy mode
and torch.compile see ordinary ops):

- ``hpex.normalization.FusedRMSNorm.apply(data_in, gamma, eps, use_stages=True, bwd_mode=0, fast_math=False)``:
  ``gamma * data_in * rsqrt(mean(data_in², last dim) + eps)``. The staging, backward and fast-math switches
  choose how Gaudi's TPC kernel schedules the work, not what it computes.
- ``hpex.kernels.CTCLoss.apply(log_probs, targets, input_lengths, target_lengths, blank, reduction,
  zero_infinity)``: torch's ``ctc_loss`` over ``targets`` padded to [batch, max_target] (Optimum passes its
  labels with -100 padding; only the first ``target_length`` entries of a row are read).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FusedRMSNorm:
    """Root-mean-square normalization of the last dimension, scaled by ``gamma`` (Intel's signature)."""

    @staticmethod
    def apply(data_in: torch.Tensor, gamma: torch.Tensor, eps: float, use_stages: bool = True, bwd_mode: int = 0,
              fast_math: bool = False) -> torch.Tensor:
        variance = data_in.pow(2).mean(-1, keepdim=True)
        return gamma * (data_in * torch.rsqrt(variance + eps))


class CTCLoss:
    """Connectionist temporal classification loss over padded targets (Intel's signature)."""

    @staticmethod
    def apply(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
              target_lengths: torch.Tensor, blank: int = 0, reduction: str = "mean",
              zero_infinity: bool = False) -> torch.Tensor:
        padded = targets.clamp_min(0)  # padding past each row's length is never read; -100 is not a class
        return F.ctc_loss(log_probs, padded, input_lengths, target_lengths, blank=blank, reduction=reduction,
                          zero_infinity=zero_infinity)

"""Speculative decoding: proposers of draft tokens (one file each) and their counters
(the configuration, ``SpeculativeConfig``, is validated with the rest in ``trillium.config``).

The scheduler asks a proposer for up to ``num_speculative_tokens`` drafts per decoding request;
the step computes the request's last token and its drafts together (k + 1 tokens) and the
runner verifies them (``ops.spec_verify``), keeping the accepted run plus one token of its own.
"""

from trillium.speculative.depth import DraftDepth
from trillium.speculative.ngram import NgramProposer, TokenSource
from trillium.speculative.stats import SpecStats

__all__ = ["DraftDepth", "NgramProposer", "SpecStats", "TokenSource"]

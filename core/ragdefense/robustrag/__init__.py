"""RobustRAG (Xiang et al.): isolate-then-aggregate answering with certifiable robustness.

Each aggregation is configured by its own settings object, passed as ``RobustRAG(llm,
aggregation=...)`` (or named, with its defaults):

* :class:`KeywordAggregation` (``"keyword"``; Algorithm 1, :mod:`.keyword_aggregation`):
  keywords of the non-abstaining isolated answers are counted once per answer; those with count
  >= mu = min(alpha * n, beta) are kept and the LLM answers from them, sorted.
* :class:`MajorityVote` (``"majority"``; :mod:`.majority_vote`): for multiple-choice questions,
  a vote over the isolated choices.
* :class:`SecureDecoding` (``"decoding"``; Algorithm 2, :mod:`.secure_decoding`): averaged
  next-token distributions, for models that expose them.

A certificate (Appendix B and C, Algorithm 4) says, for a number k' of injected (or modified)
passages, whether the answer provably cannot change, and why.
"""

from .engine import Aggregation, RobustRAG
from .keyword_aggregation import KeywordAggregation
from .majority_vote import MajorityVote
from .secure_decoding import SecureDecoding
from .types import (
    ISOLATED_PROMPT,
    KEYWORD_PROMPT,
    MULTIPLE_CHOICE_PROMPT,
    NO_RETRIEVAL_PROMPT,
    Certificate,
    DecodingStep,
    IsolatedResponse,
    RobustAnswer,
    is_abstention,
)

__all__ = [
    "ISOLATED_PROMPT",
    "KEYWORD_PROMPT",
    "MULTIPLE_CHOICE_PROMPT",
    "NO_RETRIEVAL_PROMPT",
    "Aggregation",
    "Certificate",
    "DecodingStep",
    "IsolatedResponse",
    "KeywordAggregation",
    "MajorityVote",
    "RobustAnswer",
    "RobustRAG",
    "SecureDecoding",
    "is_abstention",
]

"""Next-token distributions of several contexts extended by the same tokens, over one batched
KV cache (:class:`TokenSession`): what RobustRAG's secure decoding reads from a local model."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .huggingface import TransformersLLM

__all__ = ["TokenSession"]


class TokenSession:
    """Next-token distributions of several contexts that are extended by the *same* tokens
    (RobustRAG's secure decoding): one batched KV cache; rows can be dropped and the session
    cloned (to branch)."""

    def __init__(self, llm: TransformersLLM, texts: list[str]) -> None:
        import torch

        self.llm = llm
        res, self._cache, self._mask = llm._prefill(texts)
        self.probs = torch.softmax(res.logits[:, -1].float(), dim=-1).cpu().numpy()

    def advance(self, token: int) -> Any:
        """Append ``token`` to every row; returns (and stores) the new distributions."""
        import torch

        tokens = torch.full((self._mask.shape[0],), token, dtype=torch.long, device=self.llm.device)
        res, self._cache, self._mask = self.llm._step(tokens, self._cache, self._mask)
        self.probs = torch.softmax(res.logits[:, -1].float(), dim=-1).cpu().numpy()
        return self.probs

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Drop every row not in ``rows`` (in place)."""
        import torch

        index = torch.tensor(list(rows), dtype=torch.long, device=self.llm.device)
        self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        self.probs = self.probs[list(rows)]

    def clone(self) -> TokenSession:
        """An independent copy (for branching)."""
        other = object.__new__(TokenSession)
        other.llm = self.llm
        other._cache = copy.deepcopy(self._cache)
        other._mask = self._mask.clone()
        other.probs = self.probs.copy()
        return other

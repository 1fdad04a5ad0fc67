"""The public API as a user's code types it: ``make lint`` runs ``mypy --strict`` on this file
(pytest does not collect it). Each line is a documented use an annotation once rejected."""

from __future__ import annotations

from collections.abc import Sequence

from typing_extensions import assert_type

import ragdefense
from langchain_ragdefense import ConsensusCompressor, RobustRAGChain, RobustRAGOutput
from llama_index.postprocessor.ragdefense import ConsensusPostprocessor
from ragdefense import Consensus, Defense, DefenseResult, PassageLike, Quarantine, RobustAnswer


class ReadOnlyName:
    """A user's defense whose name is a property: a defense all the same."""

    pool_factor = 1
    min_pool = 0
    min_passages = 1

    @property
    def name(self) -> str:
        return "mine"

    def defend(self, query: str, passages: Sequence[PassageLike]) -> DefenseResult:
        return Consensus().defend(query, passages)


def answers(chain: RobustRAGChain) -> RobustAnswer:
    """Never called: the chain's output is the documented dict, its report the core answer."""
    out = chain.invoke("Who wrote Hamlet?")
    assert_type(out, RobustRAGOutput)
    return out["report"]


def uses() -> list[object]:
    """Never called: mypy reads it."""
    audited: Defense = Quarantine.from_report("audit/")
    mine: Defense = ReadOnlyName()
    compressor = ConsensusCompressor(trusted={"who.int"})  # a set, as the docstrings show
    postprocessor = ConsensusPostprocessor(trusted=frozenset({"who.int"}))
    guard = ragdefense.defense()  # a name: a defense that takes vectors, as the docstring shows
    result = guard.defend_embeddings("Who wrote Hamlet?", ["a", "b"], [[1.0, 0.0], [0.0, 1.0]])
    assert_type(ragdefense.defense(Consensus()), Consensus)  # an object: its own type
    return [audited, mine, compressor, postprocessor, result]

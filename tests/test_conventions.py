"""Each framework's conventions for an integration package: LangChain's ``EXPECTED_ALL`` import
test and standard embeddings suites; LlamaIndex's class / MRO test, ``class_name()`` and a
``Field(description=)`` on every field;"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import BaseDocumentCompressor
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, RetrieversIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.response_synthesizers import BaseSynthesizer
from pydantic import BaseModel

import langchain_ragdefense
import llama_index.postprocessor.ragdefense as li_ragdefense
from langchain_ragdefense import RagdefenseEmbeddings

PACKAGE = "llama_index.postprocessor.ragdefense"
LANGCHAIN_EXPECTED_ALL = [
    "EVENT_NAME",
    "AutoDefenseCompressor",
    "ConsensusCompressor",
    "DefendedRetriever",
    "DefenseCompressor",
    "GRADACompressor",
    "RAGDefenderCompressor",
    "RagdefenseEmbeddings",
    "RobustRAGChain",
    "RobustRAGOutput",
    "RobustRAGQuestion",
    "__version__",
    "defend",
    "red_team",
]
LLAMAINDEX_EXPECTED_ALL = [
    "AutoDefensePostprocessor",
    "ConsensusPostprocessor",
    "DefensePostprocessor",
    "DefenseRemovedEvent",
    "GRADAPostprocessor",
    "RAGDefenderPostprocessor",
    "RagdefenseEmbedding",
    "RobustRAGQueryEngine",
    "RobustRAGSynthesizer",
    "__version__",
    "DefendedRetriever",
    "defend",
    "red_team",
]
# the base class each public class must derive from, as the frameworks' own tests check it
LANGCHAIN_BASES: dict[str, type] = {
    "AutoDefenseCompressor": BaseDocumentCompressor,
    "ConsensusCompressor": BaseDocumentCompressor,
    "DefenseCompressor": BaseDocumentCompressor,
    "GRADACompressor": BaseDocumentCompressor,
    "RAGDefenderCompressor": BaseDocumentCompressor,
    "DefendedRetriever": BaseRetriever,
    "RagdefenseEmbeddings": Embeddings,
    "RobustRAGChain": Runnable,
}
LLAMAINDEX_BASES: dict[str, type] = {
    "AutoDefensePostprocessor": BaseNodePostprocessor,
    "ConsensusPostprocessor": BaseNodePostprocessor,
    "DefensePostprocessor": BaseNodePostprocessor,
    "GRADAPostprocessor": BaseNodePostprocessor,
    "RAGDefenderPostprocessor": BaseNodePostprocessor,
    "DefenseRemovedEvent": BaseEvent,
    "RagdefenseEmbedding": BaseEmbedding,
    "RobustRAGQueryEngine": BaseQueryEngine,
    "RobustRAGSynthesizer": BaseSynthesizer,
}


def test_langchain_all() -> None:
    assert sorted(langchain_ragdefense.__all__) == sorted(LANGCHAIN_EXPECTED_ALL)


def test_llamaindex_all() -> None:
    assert sorted(li_ragdefense.__all__) == sorted(LLAMAINDEX_EXPECTED_ALL)


@pytest.mark.parametrize("name", sorted(LANGCHAIN_BASES))
def test_langchain_classes_derive_from_the_framework_base(name: str) -> None:
    cls = getattr(langchain_ragdefense, name)
    assert LANGCHAIN_BASES[name].__name__ in [b.__name__ for b in cls.__mro__]


@pytest.mark.parametrize("name", sorted(LLAMAINDEX_BASES))
def test_llamaindex_classes_mro_class_name_and_field_descriptions(name: str) -> None:
    cls = getattr(li_ragdefense, name)
    base = LLAMAINDEX_BASES[name]
    assert base.__name__ in [b.__name__ for b in cls.__mro__]
    assert cls.class_name() == name
    if issubclass(cls, BaseModel):
        framework = [b for b in cls.__mro__[1:] if issubclass(b, BaseModel)]
        inherited = {
            f for b in framework if not b.__module__.startswith(PACKAGE) for f in b.model_fields
        }
        own = [f for f in cls.model_fields if f not in inherited]
        undescribed = [f for f in own if not cls.model_fields[f].description]
        assert not undescribed, f"{name}: fields without description: {undescribed}"


@pytest.mark.parametrize("module", [langchain_ragdefense, li_ragdefense])
def test_one_version_source_per_distribution(module: Any) -> None:
    from importlib.metadata import version

    dist = {
        "langchain_ragdefense": "langchain-ragdefense",
        "llama_index.postprocessor.ragdefense": "llama-index-postprocessor-ragdefense",
    }[module.__name__]
    assert module.__version__ == version(dist)


def test_core_version_matches_its_distribution() -> None:
    from importlib.metadata import version

    import ragdefense

    assert ragdefense.__version__ == version("ragdefense")


class TestRagdefenseEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[RagdefenseEmbeddings]:
        return RagdefenseEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        from ragdefense import CallableEmbedder
        from tests.conftest import bag_of_words

        return {"embedder": CallableEmbedder(bag_of_words)}


@pytest.mark.slow
class TestRagdefenseEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[RagdefenseEmbeddings]:
        return RagdefenseEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {}


@pytest.mark.slow
@pytest.mark.parametrize("defense", [None, "strict", "grada"])
class TestOneLineDefendStandard(RetrieversIntegrationTests):
    """LangChain's standard retriever suite on what the one line builds,
    ``defend(store.as_retriever(), defense)``, for the default and two named defenses (the
    class itself passes it with a compressor, in ``test_langchain``)."""

    @pytest.fixture(autouse=True)
    def _defense(self, defense: str | None) -> None:
        self.defense = defense

    @property
    def retriever_constructor(self) -> Any:
        from langchain_core.vectorstores import InMemoryVectorStore

        from langchain_ragdefense import defend
        from ragdefense.data import demo_documents

        store = InMemoryVectorStore.from_texts(
            [text for text, _ in demo_documents()], RagdefenseEmbeddings()
        )
        return lambda k=None: defend(store.as_retriever(), self.defense, k=k)

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {}

    @property
    def retriever_query_example(self) -> str:
        return "What is the capital of Australia?"

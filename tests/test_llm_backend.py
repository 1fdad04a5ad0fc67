"""The local transformers LLM, with the packaged SmolLM2: it reads local files only, loads
SmolLM2 only where nothing else is given, stops at the model's own end of turn, and a leading
newline does not end its first line. Found by an independent review of the backends."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ragdefense.llm import TransformersLLM

from .conftest import cancel_once_started

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    """A model and tokenizer of their own (the tests change their settings)."""
    packaged = TransformersLLM()
    return copy.deepcopy(packaged.model), copy.deepcopy(packaged.tokenizer)


def test_models_and_tokenizers_are_read_from_local_files_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A hub name was sent to the hub (about 25 s of retries, air-gapped); the project's
    models are local folders or objects. A model that cannot load fails once, with its
    error, where it was an error per prompt (each loading the model again) that RobustRAG
    counted as an abstention: its answer was "I don't know"."""
    import transformers

    asked: list[dict[str, Any]] = []

    def record(name: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        raise OSError("not a model folder")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", record)
    with pytest.raises(OSError, match="nothing is downloaded"):
        TransformersLLM("HuggingFaceTB/SmolLM2-135M-Instruct").generate(["hi"])
    with pytest.raises(OSError, match="not a model folder"):
        TransformersLLM(tmp_path).generate(["hi", "there", "again"])
    assert asked == [{"local_files_only": True}] * 2  # once each, not once per prompt


def test_a_model_object_needs_no_packaged_llm(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's model without its tokenizer had SmolLM2's folder worked out (converted from
    its GGUF, or the install asked for) for a path never used."""
    import ragdefense.llm.huggingface as hf

    def missing(*_: Any) -> Any:
        raise ImportError("the packaged LLM is missing")

    monkeypatch.setattr(hf, "packaged_smollm2_dir", missing)
    model, _ = smollm2
    out = TransformersLLM(model).generate(["What is the capital of France?"], max_new_tokens=12)
    assert out[0].ok and "Paris" in str(out[0].text)


def test_generation_stops_at_the_models_own_end_of_turn(smollm2: tuple[Any, Any]) -> None:
    """Only the tokenizer's EOS stopped decoding: a model whose generation config lists its
    end-of-turn token beside it (Gemma's) ran on into the next turn."""
    model, tok = copy.deepcopy(smollm2)
    turn_end = tok.eos_token_id
    tok.eos_token = "<|endoftext|>"  # the document end, as such tokenizers name it
    model.generation_config.eos_token_id = [turn_end, tok.eos_token_id]
    llm = TransformersLLM(model, tok, first_line=False)
    assert llm.stop_ids == {turn_end, tok.eos_token_id}
    text = llm.generate(["What is the capital of France?"], max_new_tokens=25)[0].text
    assert text is not None and "Paris" in text and "user" not in text


def test_a_leading_newline_does_not_end_the_first_line(smollm2: tuple[Any, Any]) -> None:
    """Decoding stopped at the first newline even before any text: an empty answer, marked
    ok (a base model's raw prompt often opens its answer with one)."""
    model, tok = smollm2
    prompt = "Write a haiku about the sea.\n"
    full = TransformersLLM(model, tok, chat=False, first_line=False)
    assert str(full._greedy([full.format(prompt)], 8)[0]).startswith("\n")  # the premise
    first = TransformersLLM(model, tok, chat=False).generate([prompt], max_new_tokens=8)[0]
    assert first.ok and first.text, first


def test_a_given_model_whose_tokenizer_cannot_load_says_to_pass_it(
    smollm2: tuple[Any, Any], tmp_path: Any
) -> None:
    """A model loaded from a GGUF file names its folder, where no tokenizer can be loaded
    as is: every prompt failed alone, and RobustRAG answered "I don't know"."""
    model = copy.deepcopy(smollm2[0])
    model.name_or_path = str(tmp_path)
    with pytest.raises(ValueError, match="pass it, TransformersLLM\\(model, tokenizer\\)"):
        TransformersLLM(model).generate(["hi"])


def test_the_packaged_model_is_converted_into_a_folder_of_its_own_in_the_cache(
    tmp_path: Any,
) -> None:
    """``cache_dir`` was the converted model's folder itself: a folder holding anything
    failed after each conversion (the rename onto it refused)."""
    from ragdefense.llm import packaged

    (tmp_path / "notes.txt").write_text("mine")
    converted = tmp_path / "smollm2-135m-instruct-q4_1"
    converted.mkdir()
    (converted / "config.json").write_text('{"tie_word_embeddings": true}')  # converted before
    assert packaged.packaged_smollm2_dir(tmp_path) == converted
    assert packaged.packaged_smollm2_dir(converted) == converted  # a converted copy as is


def test_a_converted_copy_of_the_packaged_model_needs_no_gguf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The GGUF reader is needed only to convert: with the converted copy in the cache, the
    check asked to install it anyway."""
    import importlib.util

    from ragdefense.llm import packaged

    converted = tmp_path / "smollm2-135m-instruct-q4_1"
    converted.mkdir()
    (converted / "config.json").write_text('{"tie_word_embeddings": true}')
    monkeypatch.setenv("RAGDEFENSE_CACHE", str(tmp_path))
    find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find(name, *a)
    )
    packaged.check_packaged_llm()  # no ImportError
    monkeypatch.setenv("RAGDEFENSE_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ImportError, match="gguf"):
        packaged.check_packaged_llm()
    packaged.check_packaged_llm(cache_dir=tmp_path)  # where TransformersLLM(cache_dir=) finds it
    packaged.check_packaged_llm(cache_dir=converted)  # the converted copy itself


def test_a_conversion_by_an_old_transformers_is_made_again(tmp_path: Any) -> None:
    """transformers before 4.48 converted SmolLM2 without its output layer (tied to the
    input embeddings): the cached folder answered noise under any later transformers, and
    the check took it for a sound copy."""
    from ragdefense.llm import packaged

    stale = tmp_path / "smollm2-135m-instruct-q4_1"
    stale.mkdir()
    (stale / "config.json").write_text('{"tie_word_embeddings": false}')
    (stale / "model.safetensors").write_text("old")
    assert packaged.packaged_smollm2_dir(tmp_path) == stale
    assert not (stale / "model.safetensors").read_bytes().startswith(b"old")  # converted again
    llm = TransformersLLM(cache_dir=str(tmp_path))
    out = llm.generate(["What is the capital of France?"], max_new_tokens=12)
    assert out[0].ok and "Paris" in str(out[0].text)


def test_a_folder_needs_transformers_said_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TransformersLLM()`` without transformers (or torch) was made, then failed at its
    first answer with a bare ModuleNotFoundError instead of the install command."""
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else find(name, *a),
    )
    with pytest.raises(ImportError, match=r"packaged LLM needs transformers.*ragdefense\[llm\]"):
        TransformersLLM()
    with pytest.raises(ImportError, match=r"model folder needs transformers: pip install torch"):
        TransformersLLM("/some/model/folder")


def test_a_given_model_is_moved_to_the_device_named() -> None:
    """A model object with ``device=`` kept its own device while the inputs were made on the
    one named: every batch failed on tensors on two devices."""

    class Model:
        name_or_path = "/models/mine"
        device = "cpu"

        def to(self, device: str) -> Any:
            self.device = device
            return self

    model = Model()
    llm = TransformersLLM(model, device="cuda:1")
    assert model.device == "cuda:1" and llm.device == "cuda:1"
    kept = Model()
    assert TransformersLLM(kept).device == "cpu" and kept.device == "cpu"  # not named: its own
    dispatched = Model()
    dispatched.hf_device_map = {"": "cuda:0"}  # type: ignore[attr-defined]  # device_map="auto"
    TransformersLLM(dispatched, device="cuda:0")
    assert dispatched.device == "cpu"  # left where accelerate placed it (its inputs go there)


def test_cancelling_an_async_batch_stops_the_decoding(smollm2: tuple[Any, Any]) -> None:
    """``agenerate`` decodes in a worker thread; cancelling the awaiting task (a client gone)
    left the model decoding to ``max_new_tokens`` or the deadline, holding the CPU."""
    model, tok = smollm2
    steps: list[int] = []

    class Endless(TransformersLLM):
        @property
        def stop_ids(self) -> set[int]:
            return set()  # an answer that never ends by itself

        def _step(self, tokens: Any, cache: Any, mask: Any) -> tuple[Any, Any, Any]:
            steps.append(1)
            return super()._step(tokens, cache, mask)

    llm = Endless(model, tok, chat=False, first_line=False, timeout=None)

    cancel_once_started(lambda: llm.agenerate(["Count: 1, 2, 3,"], max_new_tokens=400), steps)
    assert 0 < len(steps) < 399


def test_threads_asking_for_the_default_llm_at_once_share_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the packaged model is one per process: threads starting together (a server's first
    # requests) must not each make (and later load) their own
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ragdefense.llm import huggingface

    made: list[object] = []

    class Slow:
        def __init__(self) -> None:
            time.sleep(0.05)  # wide enough for every thread to miss at once
            made.append(self)

    monkeypatch.setattr(huggingface, "TransformersLLM", Slow)
    monkeypatch.setattr(huggingface, "_DEFAULT", None, raising=False)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: huggingface.default_llm(), range(8)))
    assert len(made) == 1
    assert all(g is made[0] for g in got)


def test_a_packaged_backend_pickles_without_its_model_and_copies_share_it() -> None:
    # Ray, multiprocessing and deep copies of a RobustRAG need its backend to pickle: the
    # packaged model is loaded again where used (not shipped), a shallow copy shares it
    import pickle

    import ragdefense

    llm = TransformersLLM(batch_size=3)
    _ = llm.model  # loaded
    blob = pickle.dumps(llm)
    assert len(blob) < 100_000  # neither weights nor tokenizer
    again = pickle.loads(blob)
    assert again.batch_size == 3 and again._loaded == {"model": None, "tokenizer": None}
    assert copy.deepcopy(llm)._loaded["model"] is None
    assert copy.copy(llm).model is llm.model  # one load for both
    [answer] = again.generate(["Say the word yes."], max_new_tokens=3)
    assert answer.text and answer.error is None
    engine = ragdefense.RobustRAG(llm=llm)
    _ = engine.llm  # resolved (a copy of the backend sharing its model)
    assert len(pickle.dumps(engine)) < 100_000


def test_a_conversion_by_a_later_transformers_major_is_made_again(tmp_path: Any) -> None:
    # a cache shared with an environment running a later transformers: its copy names
    # tokenizer classes this one lacks (it failed to load); one it wrote, or an earlier
    # release, or one that does not say, is used as it is
    from ragdefense.llm import packaged

    folder = tmp_path / "copy"
    folder.mkdir()
    for version, sound in (("99.0.0", False), ("4.48.3", True), (None, True), ("dev", True)):
        said: dict[str, Any] = {"tie_word_embeddings": True}
        said |= {"transformers_version": version} if version else {}
        (folder / "config.json").write_text(json.dumps(said))
        assert packaged._converted(folder) is sound, version

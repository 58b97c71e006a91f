"""The router's tokenizer: the token ids a worker's engine will compute for a request, without
torch or transformers, so the router can match them against its mirrors of the workers' caches.

Built from the description an engine serves at GET /get_tokenizer (the HF fast tokenizer's own
JSON plus the chat template and special tokens), or from a local tokenizer.json. It encodes as
the engine does:
- a text prompt (/generate `text`, /v1/completions `prompt`) as transformers' `encode(text)`:
  the backend tokenizer with special tokens (its post-processor carries add_bos/add_eos), no
  truncation, no padding;
- chat messages as the engine's `chat_prompt`: render the template (see chat_template.py) with
  the generation prompt, then encode without special tokens when the text already starts with
  the BOS token (no second BOS), with them otherwise.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tokenizers import AddedToken, Tokenizer

from radixserve.protocol.request_fields import is_token_id, message_dicts, template_tools
from radixserve.router.chat_memo import ChatPrefixMemo
from radixserve.router.mirror.tree import decode_tokens, encode_tokens
from radixserve.router.token_pieces import PieceEncoder, encode_whole

logger = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
# tokenizer_config.json classes that load tokenizer.json unchanged (model-specific classes, such
# as LlamaTokenizer, may rebuild parts of it from their own defaults).
GENERIC_CLASSES = (None, "TokenizersBackend", "PreTrainedTokenizerFast")
# transformers' named special tokens: the variables every chat template may read.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _is_ids(x: object) -> bool:
    return isinstance(x, list) and bool(x) and all(is_token_id(t) for t in x)


@dataclass(frozen=True)
class RouterTokenizer:
    backend: Tokenizer
    chat_template: str | dict[str, str] | None
    special_tokens: dict[str, str]
    # the ids without post-processing, from remembered pieces (shared system prompts)
    pieces: PieceEncoder
    # the post-processor adds no token: add_special_tokens=True encodes from pieces too
    adds_nothing: bool
    # tenants' rendered chat-template heads (chat_memo.py)
    chat_memo: ChatPrefixMemo = field(default_factory=ChatPrefixMemo, compare=False)

    # ---- construction ---------------------------------------------------------------------------

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> RouterTokenizer:
        """From the engine's GET /get_tokenizer answer."""
        if not isinstance(info, dict):
            raise ValueError("tokenizer info: expected an object")
        raw = info.get("tokenizer_json")
        if not isinstance(raw, str):
            raise ValueError("tokenizer_json: expected the tokenizer's JSON as a string")
        try:
            backend = Tokenizer.from_str(raw)
        except Exception as exc:  # the Rust side raises plain Exception
            raise ValueError(f"tokenizer_json: not a tokenizer: {exc}") from None
        split = info.get("split_special_tokens", False)
        if not isinstance(split, bool):
            raise ValueError("split_special_tokens: expected a boolean")
        return cls._build(
            backend, info.get("chat_template"), _special_tokens(info.get("special_tokens")), split
        )

    @classmethod
    async def fetch(
        cls, client: httpx.AsyncClient, worker_url: str, headers: Mapping[str, str] | None = None
    ) -> RouterTokenizer:
        """GET {worker_url}/get_tokenizer from a live worker with `headers` (its API key);
        HTTP errors propagate."""
        resp = await client.get(worker_url.rstrip("/") + "/get_tokenizer", headers=headers)
        resp.raise_for_status()
        return cls.from_info(resp.json())

    @classmethod
    def from_file(cls, path: str | Path) -> RouterTokenizer:
        """A local tokenizer.json (or the folder holding it), with the tokenizer_config.json,
        chat_template.jinja and additional_chat_templates/ next to it when present, read the
        way transformers' from_pretrained reads them for its generic fast tokenizer: the
        tokenizer.json's post-processor decides BOS/EOS (transformers ignores the config's
        add_bos_token/add_eos_token when a tokenizer.json exists)."""
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"path: {str(file)!r} is not a tokenizer.json file")
        folder = file.parent
        config = _read_json(folder / "tokenizer_config.json")
        backend = Tokenizer.from_file(str(file))
        specials = {
            name: _token_text(config[name])
            for name in SPECIAL_TOKEN_NAMES
            if config.get(name) is not None
        }
        _add_missing_specials(backend, specials.values())
        if config.get("tokenizer_class") not in GENERIC_CLASSES:
            logger.warning(
                "tokenizer_class %s may change tokenizer.json when transformers loads it; "
                "fetch the tokenizer from a worker (/get_tokenizer) to be exact",
                config.get("tokenizer_class"),
            )
        template = _file_templates(folder) or _config_templates(config.get("chat_template"))
        split = bool(config.get("split_special_tokens", False))
        return cls._build(backend, template, specials, split)

    @classmethod
    def _build(
        cls, backend: Tokenizer, template: Any, specials: dict[str, str], split: bool
    ) -> RouterTokenizer:
        if template is not None and not _is_template(template):
            raise ValueError("chat_template: expected a string, an object of strings, or null")
        # transformers' encode() sets these per call (no truncation, no padding unless asked)
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = split
        probe = ["a b", ""]
        adds_nothing = encode_whole(backend, probe, True) == encode_whole(backend, probe, False)
        return cls(backend, template, specials, PieceEncoder(backend), adds_nothing)

    def _key(self, text: str, add_special_tokens: bool) -> bytes:
        """The ids as `encode_tokens` bytes (the trees' key format)."""
        if add_special_tokens and not self.adds_nothing:
            return encode_tokens(encode_whole(self.backend, [text], True)[0])
        return self.pieces.encode_bytes(text)

    # ---- encoding -------------------------------------------------------------------------------

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    def encode_prompt(self, text: str) -> list[int]:
        """A text prompt's ids, as the engine's /generate and /v1/completions compute them."""
        return decode_tokens(self._prompt_key(text))

    def _prompt_key(self, text: str) -> bytes:
        if not isinstance(text, str):
            raise ValueError("prompt: expected a string")
        return self._key(text, True)

    def chat_text(self, messages: Any, chat_template_kwargs: Any = None) -> str:
        """The templated prompt text of an OpenAI `messages` list."""
        if self.chat_template is None:
            raise ValueError("messages: this model has no chat template")
        dicts = message_dicts(messages)
        return self.chat_memo.render(
            self.chat_template, dicts, self.special_tokens, chat_template_kwargs
        )

    def encode_chat(self, messages: Any, chat_template_kwargs: Any = None) -> list[int]:
        """A chat request's prompt ids, as the engine's /v1/chat/completions computes them."""
        return decode_tokens(self._chat_key(messages, chat_template_kwargs))

    def _chat_key(self, messages: Any, chat_template_kwargs: Any = None) -> bytes:
        text = self.chat_text(messages, chat_template_kwargs)
        bos = self.bos_token
        return self._key(text, not (bos and text.startswith(bos)))

    def routing_tokens(self, path: str, body: dict[str, Any]) -> list[int] | None:
        """The ids of the request's (first) prompt, or None when the body has no usable prompt
        (the router then routes without cache information and the worker answers the 400)."""
        key = self.routing_key(path, body)
        return None if key is None else decode_tokens(key)

    def routing_key(self, path: str, body: dict[str, Any]) -> bytes | None:
        """`routing_tokens` as `encode_tokens` bytes, what the router's trees match on."""
        if not isinstance(body, dict):
            return None
        try:
            key = self._prompt_tokens(path, body)
        except ValueError:
            return None
        return key or None  # an empty prompt is the engine's 400, not a routing key

    def _prompt_tokens(self, path: str, body: dict[str, Any]) -> bytes | None:
        if path == GENERATE_PATH:
            return self._generate_tokens(body)
        if path == COMPLETIONS_PATH:
            return self._completion_tokens(body.get("prompt"))
        if path == CHAT_PATH:
            kwargs = body.get("chat_template_kwargs")
            tools = template_tools(body.get("tools"), body.get("tool_choice"))
            if tools is not None:  # as the engine renders a tool request (tools win)
                kwargs = {**(kwargs if isinstance(kwargs, dict) else {}), "tools": tools}
            return self._chat_key(body.get("messages"), kwargs)
        return None

    def _generate_tokens(self, body: dict[str, Any]) -> bytes | None:
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            return None
        if isinstance(text, str):
            return self._prompt_key(text)
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return self._first_text(text)
        if isinstance(ids, list) and _is_ids(ids):  # a bool is no token id (the engine refuses it)
            return self._client_ids(ids)
        if isinstance(ids, list) and ids and all(_is_ids(x) for x in ids):
            return self._first_ids(ids)
        return None

    # A batch routes by its first prompt, but only when the engine would take the whole batch:
    # one empty prompt (or ids outside the vocabulary) anywhere is its 400 for all of them.
    def _first_text(self, texts: list[str]) -> bytes | None:
        return self._prompt_key(texts[0]) if all(texts) else None

    def _client_ids(self, ids: list[int]) -> bytes | None:
        """Ids the client sent: outside the vocabulary they are the engine's 400, not a routing
        key (ids the tokenizer made are inside it)."""
        vocab = self.backend.get_vocab_size(with_added_tokens=True)
        return encode_tokens(ids) if all(0 <= t < vocab for t in ids) else None

    def _first_ids(self, batch: list[list[int]]) -> bytes | None:
        vocab = self.backend.get_vocab_size(with_added_tokens=True)
        usable = all(x and all(0 <= t < vocab for t in x) for x in batch)
        return encode_tokens(batch[0]) if usable else None

    def _completion_tokens(self, prompt: Any) -> bytes | None:
        if isinstance(prompt, str):
            return self._prompt_key(prompt)
        if not isinstance(prompt, list) or not prompt:
            return None
        if all(isinstance(p, str) for p in prompt):
            return self._first_text(prompt)
        if all(is_token_id(t) for t in prompt):
            return self._client_ids(prompt)
        if all(_is_ids(p) for p in prompt):
            return self._first_ids(prompt)
        return None


# ---- helpers for the tokenizer description ----------------------------------------------------


def _is_template(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _special_tokens(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError("special_tokens: expected an object of strings")
    return dict(value)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path.name}: expected a JSON object")
    return data


def _token_text(value: Any) -> str:
    """A special token in tokenizer_config.json: a string or an AddedToken object."""
    content = value.get("content") if isinstance(value, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(value, str):
        return value
    raise ValueError(f"tokenizer_config.json: a special token must be a string, got {value!r}")


def _add_missing_specials(backend: Tokenizer, tokens: Any) -> None:
    """transformers adds the config's special tokens that tokenizer.json lacks (not normalized)."""
    missing = [t for t in dict.fromkeys(tokens) if backend.token_to_id(t) is None]
    if missing:
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])


def _file_templates(folder: Path) -> str | dict[str, str] | None:
    """chat_template.jinja (the default) and additional_chat_templates/<name>.jinja."""
    found: dict[str, str] = {}
    default = folder / "chat_template.jinja"
    if default.is_file():
        found["default"] = default.read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            found[f.stem] = f.read_text(encoding="utf-8")
    if list(found) == ["default"]:
        return found["default"]
    return found or None


def _config_templates(value: Any) -> str | dict[str, str] | None:
    """tokenizer_config.json's chat_template: a string or a list of {name, template}."""
    if isinstance(value, list):
        return {e["name"]: e["template"] for e in value if isinstance(e, dict)}
    return value if isinstance(value, str) else None

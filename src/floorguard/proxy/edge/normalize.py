"""The guard owns the work it admits (docs/design.md §12): one step, before admission, turns a
client's body into the bytes the guard forwards and the sizes it meters.

* **Output length.** `ℓ` is the cap the guard *forwards*: `max_tokens` and
  `max_completion_tokens` (equal when both are given) checked against `limits.max_tokens`, the
  configured default when neither is, and written into the forwarded body as `max_tokens`
  (and as `max_completion_tokens` on a chat request that used it), so the backend cannot
  generate more than was metered. `min_tokens` must not exceed `ℓ`; `ignore_eos` only makes
  the backend run to the cap, which is what is metered anyway.
* **Sequences.** One request is one sequence in one slot: `n`, `best_of` > 1 and beam search
  are refused (`unsupported_n`); send several requests instead, each metered.
* **Scheduling.** A client never sets dispatch priority: `priority`, `service_tier`,
  `request_id` and `kv_transfer_params` are removed, and the guard's own `priority` is
  written when the operator asks for it (`forward_priority`).
* **The prompt** is counted here: with the backend model's tokenizer when one is configured
  (`limits.tokenizer`, a local `tokenizer.json`), else bounded from above by its UTF-8 length
  (a byte-level or byte-fallback tokenizer never makes more tokens than bytes; + 2 for special
  tokens per text). Chat adds `limits.chat_overhead_tokens` per message for the template.
  Everything a chat template renders is counted: each message's role (one of
  `limits.chat_roles`, else a 400 `invalid_role`: a backend renders any string as a role),
  its content, its other fields (`name`, tool calls) as JSON, and the body's
  `TEMPLATE_FIELDS`; a completion's `suffix` whatever form its prompt takes.
  The count (an upper bound) is what the token meter and `s_max` weigh; the lower bound
  (the exact count, or the template-free content count with a tokenizer, else 0) is what the
  doom gate's `L` may use, so a drop stays a proof.
* **Work the meter does not see** is refused or bounded: fields that make the
  backend do unmetered work (`COSTLY_FIELDS`: `prompt_logprobs`, a client's `chat_template`
  anywhere, custom logits processors, prompt embeddings, …) are a 400 `costly_field` unless
  the operator lists them in `limits.allow_fields`, whatever `unknown_fields` says; lists the
  sampler walks per token (`stop`, `stop_token_ids`, `logit_bias`, `allowed_token_ids`,
  `bad_words`) and guided-decoding schemas, grammars and choices are bounded by count and by
  size (400 `field_too_large` naming the field); `top_logprobs` (and a completion's integer
  `logprobs`), which grow every streamed token, by `limits.max_top_logprobs`. What a chat
  template renders into the prompt — `tools`, `documents`, and everything in
  `chat_template_kwargs` — is counted into the prompt bound.
* **Fields it does not know** follow `limits.unknown_fields`: `refuse` (default: 400
  `unknown_field` naming it), `drop`, or `forward`; `limits.allow_fields` forwards named ones.

The forwarded bytes are built once, here; nothing re-serializes after dispatch. Everything
wrong is a `BadRequestError` naming the field; nothing else is ever raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from floorguard.errors import ConfigError
from floorguard.proxy.config.sections import DEFAULT_CHAT_ROLES, LimitsSpec

__all__ = [
    "BadRequestError",
    "EdgeLimits",
    "TokenCounter",
    "Work",
    "edge_limits",
    "load_tokenizer",
    "normalize",
    "prompt_tokens",
]

SCHEDULING_FIELDS = frozenset({"priority", "service_tier", "request_id", "kv_transfer_params"})
"""Fields a backend schedules or places by: never the client's to set."""

SAMPLING_FIELDS = frozenset(
    {
        "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty",
        "stop", "stop_token_ids", "seed", "logit_bias", "logprobs", "user", "metadata",
        "response_format", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids",
        "bad_words", "add_special_tokens", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "guided_decoding_backend",
        "guided_whitespace_pattern", "structured_outputs", "return_tokens_as_token_ids",
        "cache_salt", "ignore_eos", "echo",
        # rewritten or checked below, known to both APIs
        "max_tokens", "max_completion_tokens", "min_tokens", "n", "best_of", "use_beam_search",
    }
)  # fmt: skip
"""Known to both APIs (OpenAI's and vLLM's extensions) and harmless once `ℓ` is owned."""

COSTLY_FIELDS = frozenset(
    {
        "prompt_logprobs", "chat_template", "logits_processors", "prompt_embeds",
        "mm_processor_kwargs", "vllm_xargs", "structural_tag",
    }
)  # fmt: skip
"""Work a backend (vLLM's request models) does beyond ℓ tokens over the metered prompt that
no bound here can price: refused unless `limits.allow_fields` names it."""

TEMPLATE_FIELDS = (
    "tools", "functions", "documents", "chat_template_kwargs", "tool_choice", "function_call",
    "reasoning_effort",
)  # fmt: skip
"""Body fields a chat template may render into the prompt: each is counted as its JSON."""

TOKEN_LISTS = ("stop_token_ids", "allowed_token_ids", "bad_words")
"""Lists the sampler checks at every token: bounded by `limits.max_list_items`."""

CONSTRAINTS = (
    "response_format", "guided_json", "guided_regex", "guided_grammar", "guided_choice",
    "structured_outputs", "guided_whitespace_pattern",
)  # fmt: skip
"""Guided decoding: a schema, grammar or choice list is compiled and walked per token —
bounded by its JSON size (`limits.max_constraint_bytes`)."""

COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "suffix"}
CHAT_FIELDS = SAMPLING_FIELDS | {
    "messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "reasoning_effort", "include_reasoning", "add_generation_prompt",
    "continue_final_message", "documents", "chat_template_kwargs", "store",
}  # fmt: skip
"""`chat_template` is not here: a client's own template can expand the prompt without bound."""
EMBEDDING_FIELDS = frozenset(
    {"model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens",
     "add_special_tokens"}
)  # fmt: skip
"""`/v1/embeddings` (OpenAI's and vLLM's): one forward pass over the input, no output."""


class BadRequestError(Exception):
    """A request body the guard refuses before it reaches the core (400/413)."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


class TokenCounter(Protocol):
    """Counts a text's tokens with the backend model's tokenizer."""

    def count(self, text: str, *, special: bool) -> int: ...


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    max_tokens: int = 4096
    default_max_tokens: int = 16
    max_prompt_tokens: int = 32768
    chat_overhead_tokens: int = 8
    """Tokens a chat template adds per message (role markers), counted on top of the text."""
    unknown_fields: Literal["refuse", "drop", "forward"] = "refuse"
    allow_fields: frozenset[str] = frozenset()
    max_stop: int = 4
    """Stop strings (each at most `max_constraint_bytes`)."""
    max_list_items: int = 1024
    """Entries of `stop_token_ids`, `allowed_token_ids`, `bad_words`."""
    max_logit_bias: int = 300
    max_constraint_bytes: int = 16_384
    """A guided-decoding schema, grammar, regex or choice list, as JSON."""
    max_top_logprobs: int = 5
    chat_roles: frozenset[str] = DEFAULT_CHAT_ROLES
    """The roles a chat message may name: a backend renders any string it is given as a role
    (vLLM does), so a role is refused unless it is one of these (and counted when it is)."""


def edge_limits(spec: LimitsSpec) -> EdgeLimits:
    """The configured `limits:` as `normalize` checks a body against them."""
    return EdgeLimits(
        max_tokens=spec.max_tokens,
        default_max_tokens=spec.default_max_tokens,
        max_prompt_tokens=spec.max_prompt_tokens,
        chat_overhead_tokens=spec.chat_overhead_tokens,
        unknown_fields=spec.unknown_fields,
        allow_fields=frozenset(spec.allow_fields),
        max_stop=spec.max_stop,
        max_list_items=spec.max_list_items,
        max_logit_bias=spec.max_logit_bias,
        max_constraint_bytes=spec.max_constraint_bytes,
        max_top_logprobs=spec.max_top_logprobs,
        chat_roles=frozenset(spec.chat_roles),
    )


@dataclass(slots=True)
class Work:
    """What the guard admits: the forwarded bytes and the sizes it meters. Built once, not
    changed after; not frozen, for the reason `Request` is not."""

    body: bytes
    """The forwarded request, built once."""
    num_output_tokens: int
    """`ℓ`: the output cap written into `body`."""
    num_prompt_tokens: int
    """The prompt's tokens as metered (exact, or an upper bound)."""
    min_prompt_tokens: int | None
    """A lower bound where `num_prompt_tokens` is not exact (None: exact)."""
    stream: bool
    model: str | None = None
    """The body's `model` (None when it names none)."""
    usage_asked: bool = False
    """A stream whose client asked for the usage event itself
    (`stream_options.include_usage`); the guard asks for it on every stream and takes it
    out of the others (usage.py)."""

    def __init__(  # noqa: PLR0917
        self,
        body: bytes,
        num_output_tokens: int,
        num_prompt_tokens: int,
        min_prompt_tokens: int | None,
        stream: bool,
        model: str | None = None,
        usage_asked: bool = False,
    ) -> None:
        self.body = body
        self.num_output_tokens = num_output_tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.min_prompt_tokens = min_prompt_tokens
        self.stream = stream
        self.model = model
        self.usage_asked = usage_asked


Priority = int | None | Callable[[str | None], int | None]
"""The backend `priority` to write into the forwarded body: none, one value, or one per
model (a callable of the body's `model`, which may refuse it with a BadRequestError)."""


def prompt_tokens(
    body: dict[str, Any],
    *,
    chat: bool,
    limits: EdgeLimits | None = None,
    tokenizer: TokenCounter | None = None,
    embedding: bool = False,
) -> int:
    """The prompt's (an embedding's input's) tokens as the guard meters them (exact with a
    tokenizer, else the byte bound); BadRequestError when there is none to count."""
    limits = limits if limits is not None else EdgeLimits()
    if embedding:
        return _embedding_input(body, tokenizer)[0]
    upper, _ = (
        _chat_prompt(body, limits, tokenizer) if chat else _completion_prompt(body, tokenizer)
    )
    return upper


def normalize(
    raw: bytes,
    *,
    chat: bool,
    limits: EdgeLimits,
    priority: Priority = None,
    tokenizer: TokenCounter | None = None,
    embedding: bool = False,
) -> Work:
    """The forwarded body and metered sizes of one request (module docstring); `embedding`:
    a `/v1/embeddings` request (`_embedding_work`)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(400, "invalid_json", f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError(400, "invalid_request", "the body must be a JSON object")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequestError(400, "invalid_request", "stream must be true or false", "stream")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequestError(400, "invalid_request", "model must be a string", "model")
    if callable(priority):
        priority = priority(model)
    if embedding:
        return _embedding_work(body, limits, priority, tokenizer, model)
    forwarded = _known_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, limits)
    _one_sequence(forwarded)
    _bounded_work(forwarded, limits, chat)
    num_output_tokens = _output_cap(body, limits)
    if chat:
        upper, lower = _chat_prompt(body, limits, tokenizer, limits.chat_roles)
    else:
        upper, lower = _completion_prompt(body, tokenizer)
    _within_prompt_limit(upper, limits, tokenizer, "messages" if chat else "prompt")
    forwarded["max_tokens"] = num_output_tokens
    if chat and "max_completion_tokens" in body:
        forwarded["max_completion_tokens"] = num_output_tokens
    else:
        forwarded.pop("max_completion_tokens", None)
    if priority is not None:
        forwarded["priority"] = priority
    stream = body.get("stream") is True
    usage_asked = stream and _ask_usage(body, forwarded)
    try:
        data = orjson.dumps(forwarded)
    except (orjson.JSONEncodeError, TypeError) as exc:  # e.g. nested deeper than 255
        raise BadRequestError(400, "invalid_json", f"the body cannot be forwarded: {exc}") from exc
    return Work(
        data,
        num_output_tokens,
        upper,
        None if lower == upper else lower,
        stream,
        model,
        usage_asked,
    )


def _within_prompt_limit(
    upper: int, limits: EdgeLimits, tokenizer: TokenCounter | None, field: str
) -> None:
    """A prompt (an input) over `limits.max_prompt_tokens` is a 400 naming `field`."""
    if upper > limits.max_prompt_tokens:
        bound = "counted" if tokenizer is not None else "bounded by its length at"
        raise BadRequestError(
            400,
            "prompt_too_long",
            f"the {'input' if field == 'input' else 'prompt'} is {bound} {upper} tokens > "
            f"limits.max_prompt_tokens = {limits.max_prompt_tokens}",
            field,
        )


def _embedding_work(
    body: dict[str, Any],
    limits: EdgeLimits,
    priority: int | None,
    tokenizer: TokenCounter | None,
    model: str | None,
) -> Work:
    """An embedding: metered by its input (prompt) tokens, with no output (ℓ = 0): one
    input a request, as one prompt a completion — the guard meters and places one
    sequence a request, and a batch of inputs is a batch of sequences on the backend."""
    forwarded = _known_fields(body, EMBEDDING_FIELDS, limits)
    upper, lower = _embedding_input(body, tokenizer)
    _within_prompt_limit(upper, limits, tokenizer, "input")
    if priority is not None:
        forwarded["priority"] = priority
    try:
        data = orjson.dumps(forwarded)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise BadRequestError(400, "invalid_json", f"the body cannot be forwarded: {exc}") from exc
    return Work(data, 0, upper, None if lower == upper else lower, False, model)


def _embedding_input(body: dict[str, Any], tokenizer: TokenCounter | None) -> tuple[int, int]:
    value = body.get("input")
    if isinstance(value, list) and value and not _is_token_ids(value):
        if len(value) != 1:
            raise BadRequestError(
                400,
                "multiple_inputs",
                f"{len(value)} inputs in one request: send one request per input (the guard "
                "meters and places one sequence a request)",
                "input",
            )
        value = value[0]
    if isinstance(value, list) and value and _is_token_ids(value):
        return len(value), len(value)
    if isinstance(value, str) and value:
        return _count_text(value, tokenizer, special=True)
    raise BadRequestError(
        400, "invalid_input", "input must be a non-empty string or list of token ids", "input"
    )


def _ask_usage(body: dict[str, Any], forwarded: dict[str, Any]) -> bool:
    """A stream asks the backend for its usage event (it reports what a stream cost only
    when asked: usage.py); whether its client asked too (a malformed ask is a 400)."""
    options = body.get("stream_options")
    if options is None:
        forwarded["stream_options"] = {"include_usage": True}
        return False
    if not isinstance(options, dict):
        raise BadRequestError(
            400, "invalid_request", "stream_options must be an object", "stream_options"
        )
    asked = options.get("include_usage", False)
    if not isinstance(asked, bool):
        raise BadRequestError(
            400,
            "invalid_request",
            "stream_options.include_usage must be true or false",
            "stream_options",
        )
    forwarded["stream_options"] = {**options, "include_usage": True}
    return asked


def _known_fields(
    body: dict[str, Any], known: frozenset[str], limits: EdgeLimits
) -> dict[str, Any]:
    """The body without scheduling fields, and unknown fields as the policy says."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in SCHEDULING_FIELDS:
            continue
        if key in COSTLY_FIELDS and key not in limits.allow_fields:
            raise _costly(key)
        if key in known or key in limits.allow_fields or limits.unknown_fields == "forward":
            out[key] = value
        elif limits.unknown_fields == "refuse":
            raise BadRequestError(
                400,
                "unknown_field",
                f"field {key[:60]!r} is not forwarded by this guard (limits.unknown_fields: "
                f"refuse; an operator can list it in limits.allow_fields)",
                key[:60],
            )
    return out


def _costly(key: str) -> BadRequestError:
    return BadRequestError(
        400,
        "costly_field",
        f"{key} makes the backend do work this guard does not meter: refused (an operator "
        f"can list it in limits.allow_fields)",
        key,
    )


def _too_large(key: str, what: str, limit: int, name: str) -> BadRequestError:
    return BadRequestError(400, "field_too_large", f"{key}: {what} > limits.{name} = {limit}", key)


def _json_size(value: object) -> int:
    try:
        return len(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return 1 << 62  # unwritable (too deep): as large as can be


def _bounded_work(body: dict[str, Any], limits: EdgeLimits, chat: bool) -> None:
    """What the sampler or a guided decoder walks per token, bounded (module docstring)."""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > limits.max_stop:
        raise _too_large("stop", f"{len(stops)} stop strings", limits.max_stop, "max_stop")
    if any(_json_size(item) > limits.max_constraint_bytes for item in stops):
        raise _too_large(
            "stop", "a stop string's size", limits.max_constraint_bytes, "max_constraint_bytes"
        )
    for key in TOKEN_LISTS:
        value = body.get(key)
        if isinstance(value, list) and len(value) > limits.max_list_items:
            raise _too_large(key, f"{len(value)} entries", limits.max_list_items, "max_list_items")
    bias = body.get("logit_bias")
    if isinstance(bias, (dict, list)) and len(bias) > limits.max_logit_bias:
        raise _too_large(
            "logit_bias", f"{len(bias)} entries", limits.max_logit_bias, "max_logit_bias"
        )
    for key in CONSTRAINTS:
        if key in body and _json_size(body[key]) > limits.max_constraint_bytes:
            raise _too_large(
                key, "its size in bytes", limits.max_constraint_bytes, "max_constraint_bytes"
            )
    _bounded_output(body, limits, chat)


def _bounded_output(body: dict[str, Any], limits: EdgeLimits, chat: bool) -> None:
    """Logprobs that grow every token, and costly work hidden inside other fields."""
    for key in ("top_logprobs", "logprobs"):
        value = body.get(key)
        if type(value) is int and value > limits.max_top_logprobs:
            raise _too_large(key, str(value), limits.max_top_logprobs, "max_top_logprobs")
    kwargs = body.get("chat_template_kwargs")
    allowed = limits.allow_fields
    if isinstance(kwargs, dict) and "chat_template" in kwargs and "chat_template" not in allowed:
        raise _costly("chat_template_kwargs")
    echo_logprobs = body.get("echo") is True and body.get("logprobs") not in (None, False)
    if not chat and echo_logprobs and "prompt_logprobs" not in allowed:
        raise _costly("echo")  # echo with logprobs computes the prompt's logprobs


def _one_sequence(body: dict[str, Any]) -> None:
    """One sequence (`n`, `best_of` 1 or absent; no beam search). A null count is removed,
    not forwarded: a backend reads an absent one as 1, a null one as its own default."""
    for key in ("n", "best_of"):
        value = body.get(key)
        if value is None:
            body.pop(key, None)
        elif type(value) is not int or value != 1:
            raise BadRequestError(
                400,
                "unsupported_n",
                f"{key} = {value!r:.40}: one request is one sequence here (1 or absent); "
                f"send several requests instead",
                key,
            )
    if body.get("use_beam_search") not in (None, False):
        raise BadRequestError(
            400, "unsupported_n", "beam search runs several sequences: refused", "use_beam_search"
        )


def _cap_field(body: dict[str, Any], key: str, cap: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= cap:
        raise BadRequestError(
            400,
            "invalid_max_tokens",
            f"{key} = {value!r:.40}: must be an integer in [1, {cap}]",
            key,
        )
    return value


def _output_cap(body: dict[str, Any], limits: EdgeLimits) -> int:
    """`ℓ`: the output cap the guard forwards (docs/design.md §12)."""
    max_tokens = _cap_field(body, "max_tokens", limits.max_tokens)
    max_completion = _cap_field(body, "max_completion_tokens", limits.max_tokens)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise BadRequestError(
            400,
            "conflicting_max_tokens",
            f"max_tokens = {max_tokens} and max_completion_tokens = {max_completion}: give one",
            "max_completion_tokens",
        )
    cap = max_tokens or max_completion or limits.default_max_tokens
    min_tokens = body.get("min_tokens")
    if min_tokens is not None and (type(min_tokens) is not int or not 0 <= min_tokens <= cap):
        raise BadRequestError(
            400,
            "invalid_min_tokens",
            f"min_tokens = {min_tokens!r:.40}: must be an integer in [0, max_tokens = {cap}]",
            "min_tokens",
        )
    return cap


def _count_text(
    text: str, tokenizer: TokenCounter | None, special: bool = False
) -> tuple[int, int]:
    """(upper, lower) token bounds of one text."""
    if tokenizer is not None:
        count = tokenizer.count(text, special=special)
        return count, count
    return len(text.encode()) + 2, 0


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def _completion_prompt(body: dict[str, Any], tokenizer: TokenCounter | None) -> tuple[int, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not _is_token_ids(prompt):
        if len(prompt) != 1:
            raise BadRequestError(
                400,
                "multiple_prompts",
                f"{len(prompt)} prompts in one request: send one request per prompt",
                "prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, list) and _is_token_ids(prompt):
        upper, lower = len(prompt), len(prompt)
    elif isinstance(prompt, str):
        upper, lower = _count_text(prompt, tokenizer, special=True)
    else:
        raise BadRequestError(
            400, "invalid_prompt", "prompt must be a string or a list of token ids", "prompt"
        )
    suffix = body.get("suffix")
    if suffix is not None:  # rendered beside the prompt whatever form the prompt takes
        if not isinstance(suffix, str):
            raise BadRequestError(400, "invalid_prompt", "suffix must be a string", "suffix")
        more_upper, more_lower = _count_text(suffix, tokenizer)
        upper, lower = upper + more_upper, lower + more_lower
    return upper, lower


def _role(message: Mapping[str, Any], roles: frozenset[str] | None) -> str:
    """A message's role: a string, and one of `roles` where those are given (None: any).
    A backend renders whatever string it is given as the role."""
    role = message.get("role")
    if not isinstance(role, str) or (roles is not None and role not in roles):
        allowed = ", ".join(sorted(roles)) if roles is not None else "any string"
        raise BadRequestError(
            400,
            "invalid_role",
            f"a message's role must be one of: {allowed} (limits.chat_roles); "
            f"got {str(role)[:40]!r}",
            "messages",
        )
    return role


def _chat_texts(message: Mapping[str, Any]) -> Iterable[str]:
    """The texts one message puts into the prompt besides its role: its content, and any
    other field (tool calls, names; a text part's other keys) as its JSON."""
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequestError(
                    400,
                    "unsupported_content",
                    f"a content part of type {str(kind)[:40]!r}: only text is metered here",
                    "messages",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequestError(400, "invalid_prompt", "a text part needs text", "messages")
            yield text
            others = {k: v for k, v in part.items() if k not in ("type", "text")}
            if others:
                yield orjson.dumps(others).decode()
    elif content is not None:
        raise BadRequestError(400, "invalid_prompt", "content must be text", "messages")
    rest = {k: v for k, v in message.items() if k not in ("role", "content")}
    if rest:
        yield orjson.dumps(rest).decode()


def _chat_prompt(
    body: dict[str, Any],
    limits: EdgeLimits,
    tokenizer: TokenCounter | None,
    roles: frozenset[str] | None = None,
) -> tuple[int, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError(
            400, "invalid_prompt", "messages must be a non-empty list", "messages"
        )
    upper, lower = limits.chat_overhead_tokens, 0  # the template's own tokens: not in `lower`
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequestError(
                400, "invalid_prompt", "each message must be an object", "messages"
            )
        # the role: in the upper bound only (the lower one counts what the client wrote)
        upper += limits.chat_overhead_tokens + _count_text(_role(message, roles), tokenizer)[0]
        for text in _chat_texts(message):
            more_upper, more_lower = _count_text(text, tokenizer)
            upper, lower = upper + more_upper, lower + more_lower
    for key in TEMPLATE_FIELDS:
        if body.get(key) is not None:  # rendered into the prompt by the template
            more_upper, more_lower = _count_text(orjson.dumps(body[key]).decode(), tokenizer)
            upper, lower = upper + more_upper, lower + more_lower
    return upper, lower


class _HfTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def count(self, text: str, *, special: bool) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=special).ids)


def load_tokenizer(path: str) -> TokenCounter:
    """A local `tokenizer.json` (Hugging Face `tokenizers`); nothing is downloaded. A
    missing package or an unreadable file is a ConfigError naming `limits.tokenizer`."""
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 (an optional dependency)
    except ImportError as exc:
        raise ConfigError(
            "limits.tokenizer",
            path,
            "needs the tokenizers package: pip install 'floorguard[tokenizer]'",
        ) from exc
    try:
        return _HfTokenizer(Tokenizer.from_file(path))
    except Exception as exc:  # tokenizers raises its own Exception type for any bad file
        raise ConfigError(
            "limits.tokenizer", path, f"cannot be read as a tokenizer.json ({exc})"
        ) from exc

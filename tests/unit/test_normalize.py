"""The edge's normalization step (docs/design.md §12): what it forwards, meters and refuses."""

from __future__ import annotations

import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from floorguard.errors import ConfigError
from floorguard.proxy.edge.normalize import BadRequestError, EdgeLimits, load_tokenizer, normalize

LIMITS = EdgeLimits(max_tokens=512, default_max_tokens=16, max_prompt_tokens=4096)


def _work(body: dict, *, chat: bool = False, limits: EdgeLimits = LIMITS, **kw):
    return normalize(orjson.dumps(body), chat=chat, limits=limits, **kw)


def _refusal(body: dict, **kw) -> BadRequestError:
    with pytest.raises(BadRequestError) as refused:
        _work(body, **kw)
    return refused.value


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE tokenizer trained here (no download), saved as tokenizer.json."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["the floor holds under the learner"] * 50, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_missing_cap_is_the_default_written_into_the_forwarded_body():
    work = _work({"model": "m", "prompt": "hi"})
    assert work.num_output_tokens == 16
    assert orjson.loads(work.body)["max_tokens"] == 16


def test_a_null_sequence_count_is_not_forwarded():
    """`n: null` or `best_of: null` is removed (absent means one sequence), not handed to
    the backend's own default."""
    body = orjson.loads(_work({"model": "m", "prompt": "hi", "n": None, "best_of": None}).body)
    assert "n" not in body and "best_of" not in body


def test_max_completion_tokens_alone_is_the_cap_and_is_forwarded_as_both_on_chat():
    work = _work(
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 40}, chat=True
    )
    body = orjson.loads(work.body)
    assert work.num_output_tokens == body["max_tokens"] == body["max_completion_tokens"] == 40


def test_on_completions_max_completion_tokens_becomes_max_tokens():
    body = orjson.loads(_work({"prompt": "hi", "max_completion_tokens": 40}).body)
    assert body["max_tokens"] == 40 and "max_completion_tokens" not in body


def test_client_scheduling_fields_are_removed_or_replaced_by_the_guards():
    body = {"prompt": "hi", "priority": -100, "service_tier": "priority", "request_id": "x"}
    assert set(orjson.loads(_work(body).body)) == {"prompt", "max_tokens"}
    assert orjson.loads(_work(body, priority=1).body)["priority"] == 1


def test_unknown_fields_follow_the_policy_and_the_allow_list():
    body = {"prompt": "hi", "surprise": {"a": 1}}
    assert _refusal(body).param == "surprise"
    drop = EdgeLimits(unknown_fields="drop")
    assert "surprise" not in orjson.loads(_work(body, limits=drop).body)
    allow = EdgeLimits(allow_fields=frozenset({"surprise"}))
    assert orjson.loads(_work(body, limits=allow).body)["surprise"] == {"a": 1}
    forward = EdgeLimits(unknown_fields="forward")
    assert "priority" not in orjson.loads(_work({**body, "priority": 0}, limits=forward).body)


def test_without_a_tokenizer_the_prompt_is_bounded_by_its_bytes_and_L_counts_none():
    work = _work({"prompt": "héllo"})  # 6 UTF-8 bytes
    assert (work.num_prompt_tokens, work.min_prompt_tokens) == (8, 0)


def test_token_ids_are_counted_exactly():
    work = _work({"prompt": [1, 2, 3, 4]})
    assert (work.num_prompt_tokens, work.min_prompt_tokens) == (4, None)


def test_with_the_models_tokenizer_a_completion_prompt_is_counted_exactly(tokenizer_file):
    tokenizer = load_tokenizer(str(tokenizer_file))
    text = "the floor holds " * 20
    exact = len(Tokenizer.from_file(str(tokenizer_file)).encode(text).ids)
    work = _work({"prompt": text}, tokenizer=tokenizer)
    assert (work.num_prompt_tokens, work.min_prompt_tokens) == (exact, None)
    assert exact < len(text.encode())  # tighter than the byte bound


def test_chat_adds_the_template_overhead_to_the_metered_count_but_not_to_L(tokenizer_file):
    tokenizer = load_tokenizer(str(tokenizer_file))
    messages = [{"role": "system", "content": "the floor"}, {"role": "user", "content": "holds"}]
    work = _work({"messages": messages}, chat=True, tokenizer=tokenizer)
    content = tokenizer.count("the floor", special=False) + tokenizer.count("holds", special=False)
    assert work.min_prompt_tokens == content
    roles = tokenizer.count("system", special=False) + tokenizer.count("user", special=False)
    assert work.num_prompt_tokens == content + roles + 8 * 3  # per message, once for the template


@pytest.mark.parametrize(
    ("body", "chat", "code"),
    [
        ({"prompt": ["a", "b"]}, False, "multiple_prompts"),
        ({"prompt": {"text": "a"}}, False, "invalid_prompt"),
        ({"messages": []}, True, "invalid_prompt"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, True,
         "unsupported_content"),
        ({"prompt": "x" * 5000}, False, "prompt_too_long"),
        ({"prompt": "x", "max_tokens": True}, False, "invalid_max_tokens"),
        ({"prompt": "x", "max_tokens": 513}, False, "invalid_max_tokens"),
        ({"prompt": "x", "max_tokens": 8, "min_tokens": 9}, False, "invalid_min_tokens"),
        ({"prompt": "x", "n": 2}, False, "unsupported_n"),
        ({"prompt": "x", "stream": "yes"}, False, "invalid_request"),
    ],
)  # fmt: skip
def test_what_cannot_be_metered_is_refused_naming_the_field(body, chat, code):
    assert _refusal(body, chat=chat).kind == code


def test_a_missing_tokenizer_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"limits\.tokenizer"):
        load_tokenizer(str(tmp_path / "nope.json"))


@pytest.mark.parametrize("policy", ["refuse", "drop", "forward"])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"prompt_logprobs": 5}, "prompt_logprobs"),
        ({"chat_template": "{{ x }}"}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": "{{ x }}"}}, "chat_template_kwargs"),
        ({"logits_processors": ["pkg.mod:Proc"]}, "logits_processors"),
        ({"vllm_xargs": {"a": 1}}, "vllm_xargs"),
    ],
)
def test_costly_fields_are_refused_whatever_the_unknown_field_policy(extra, param, policy):
    """Work a backend does that no bound prices is a 400 `costly_field` under every
    `unknown_fields` policy, and forwarded only when the operator allows it by name."""
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    refused = _refusal(body, chat=True, limits=EdgeLimits(unknown_fields=policy))
    assert (refused.kind, refused.param) == ("costly_field", param)
    allowed = EdgeLimits(allow_fields=frozenset({param, "chat_template"}))
    assert param in orjson.loads(_work(body, chat=True, limits=allowed).body)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": "x" * 20_000}, "stop"),
        ({"stop_token_ids": list(range(2000))}, "stop_token_ids"),
        ({"allowed_token_ids": list(range(2000))}, "allowed_token_ids"),
        ({"bad_words": ["w"] * 2000}, "bad_words"),
        ({"logit_bias": {str(t): 1 for t in range(400)}}, "logit_bias"),
        ({"guided_choice": ["c"] * 20_000}, "guided_choice"),
        ({"guided_regex": "(a|b)" * 5000}, "guided_regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"x": "y" * 20_000}}},
         "response_format"),
        ({"top_logprobs": 20, "logprobs": True}, "top_logprobs"),
    ],
)  # fmt: skip
def test_what_the_sampler_walks_per_token_is_bounded(extra, param):
    """Stop lists, token lists, logit bias, guided-decoding constraints and top_logprobs
    past their default bounds are a 400 `field_too_large` naming the field."""
    refused = _refusal({"messages": [{"role": "user", "content": "hi"}], **extra}, chat=True)
    assert (refused.kind, refused.param) == ("field_too_large", param)


def test_what_a_chat_template_renders_is_counted_into_the_prompt():
    """`documents` inside `chat_template_kwargs` weigh on the metered prompt like top-level
    ones: 750 KB there is `prompt_too_long`, not 20 tokens."""
    messages = [{"role": "user", "content": "hi"}]
    small = _work({"messages": messages}, chat=True).num_prompt_tokens
    kwargs = {"chat_template_kwargs": {"documents": [{"text": "d" * 500}]}}
    assert _work({"messages": messages, **kwargs}, chat=True).num_prompt_tokens > small + 500
    huge = {"chat_template_kwargs": {"documents": [{"text": "d" * 750_000}]}}
    assert _refusal({"messages": messages, **huge}, chat=True).kind == "prompt_too_long"


def test_a_completion_may_not_echo_its_prompt_with_logprobs():
    """`echo` with `logprobs` on a completion computes the prompt's logprobs: costly."""
    refused = _refusal({"prompt": "hi", "echo": True, "logprobs": 1})
    assert (refused.kind, refused.param) == ("costly_field", "echo")


@pytest.mark.parametrize(
    "role", ["x" * 20_000, "narrator", None, 7], ids=["huge", "unlisted", "none", "int"]
)
def test_a_role_outside_the_configured_set_is_refused(role):
    """A backend renders any string as a role: a 20,000-byte one was metered as 19 tokens.
    A role that is not one of `limits.chat_roles` is a 400 `invalid_role`."""
    refused = _refusal({"messages": [{"role": role, "content": "hi"}]}, chat=True)
    assert (refused.kind, refused.param) == ("invalid_role", "messages")


def test_a_role_the_operator_lists_is_allowed_and_counted():
    """An operator's own role is forwarded and its bytes weigh on the metered prompt."""
    limits = EdgeLimits(chat_roles=frozenset({"user", "narrator" * 100}))
    short = _work({"messages": [{"role": "user", "content": "hi"}]}, chat=True, limits=limits)
    long = _work({"messages": [{"role": "narrator" * 100, "content": "hi"}]}, chat=True,
                 limits=limits)  # fmt: skip
    assert long.num_prompt_tokens - short.num_prompt_tokens == 800 - 4


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "hi", "name": "n" * 20_000},
        {"role": "user", "content": [{"type": "text", "text": "hi", "extra": "e" * 20_000}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function",
                         "function": {"name": "f", "arguments": "a" * 20_000}}]},
    ],
    ids=["name", "text-part-key", "tool-call"],
)  # fmt: skip
def test_every_field_of_a_message_is_counted(message):
    """A message's other fields — its name, a text part's extra keys, its tool calls — are
    counted as their JSON: 20,000 bytes there weigh at least 20,000 tokens."""
    work = _work({"messages": [message]}, chat=True, limits=EdgeLimits())
    assert work.num_prompt_tokens > 20_000


@pytest.mark.parametrize("field", ["tool_choice", "reasoning_effort", "function_call"])
def test_body_fields_a_template_reads_are_counted(field):
    """Body fields a chat template may render are counted like `tools`."""
    body = {"messages": [{"role": "user", "content": "hi"}], field: "r" * 20_000}
    assert _work(body, chat=True, limits=EdgeLimits()).num_prompt_tokens > 20_000


def test_a_suffix_counts_beside_a_token_id_prompt():
    """A token-id prompt with a 20,000-byte suffix was metered as its 3 ids."""
    work = _work({"prompt": [1, 2, 3], "suffix": "s" * 2_000})
    assert work.num_prompt_tokens == 3 + 2_002
    assert _refusal({"prompt": [1, 2, 3], "suffix": "s" * 20_000}).kind == "prompt_too_long"
    assert _refusal({"prompt": "x", "suffix": 5}).kind == "invalid_prompt"


def test_forty_stuffed_roles_are_not_a_long_prompt_answered():
    """The figure that found it: forty messages, each with a 20,000-byte role, were metered 448."""
    messages = [{"role": "r" * 20_000, "content": "x"}] * 40
    assert _refusal({"messages": messages}, chat=True, limits=EdgeLimits()).kind == "invalid_role"
    roomy = EdgeLimits(chat_roles=frozenset({"r" * 20_000}), max_prompt_tokens=1_000_000)
    assert _work({"messages": messages}, chat=True, limits=roomy).num_prompt_tokens > 800_000

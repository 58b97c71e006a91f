"""The remembered chat heads (router/chat_memo.py) give the text the template gives: against
the engine's own chat prompt (SmolLM2's template, transformers), and against the full render
for templates that read their messages' content (trim it, measure it, test how it starts),
with questions of any text. Heads repeat, so most chats take the remembered path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.router.chat_memo import ChatPrefixMemo
from radixserve.router.chat_template import render_chat
from radixserve.router.tokenization import RouterTokenizer
from tests.router.test_tokenization import EngineSide, engine_chat_ids

SYSTEM = "You are a careful assistant for the tide tables of a small harbour. Answer briefly."
HEADS = [
    [{"role": "system", "content": SYSTEM}],
    [{"role": "system", "content": SYSTEM + " Mention the moon."}],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "When is high tide?"},
        {"role": "assistant", "content": "At 6:10 and 18:31."},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  hello  "}],
]
QUESTIONS = st.text(min_size=1, max_size=60) | st.sampled_from(
    [
        "What now?",
        " padded ",
        "<tool_response>x</tool_response>",
        "{{ x }}",
        "a\nb",
        "\ue000",
        "x" * 22,
        "y" * 5,
    ]
)
# Templates that read the content: a fast path that ignored them would render other text.
TEMPLATES = {
    "trim": "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}",
    "length": "{% for m in messages %}{{ m.role }}({{ m.content | length }}): {{ m.content }}\n"
    "{% endfor %}",
    "starts": "{% for m in messages %}{% if m.content.startswith('<tool_response>') %}TOOL"
    "{% else %}{{ m.role }}{% endif %}: {{ m.content }}\n{% endfor %}",
    "last-query": "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' "
    "and not m.content.startswith('<') %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if loop.index0 >= ns.last %}[{{ m.role }}] {{ m.content }}"
    "{% endif %}{% endfor %}",
}


@settings(max_examples=200, deadline=None)
@given(head=st.sampled_from(HEADS), question=QUESTIONS)
def test_remembered_heads_give_the_engines_ids(
    engine: EngineSide, router_tok: RouterTokenizer, head: list[dict[str, str]], question: str
) -> None:
    messages = [*head, {"role": "user", "content": question}]
    assert router_tok.encode_chat(messages) == engine_chat_ids(engine, messages)


def test_the_remembered_path_is_taken(router_tok: RouterTokenizer) -> None:
    before = router_tok.chat_memo.hits
    for q in ("What now?", "And then?", "Why?"):
        router_tok.encode_chat([*HEADS[0], {"role": "user", "content": q}])
    assert router_tok.chat_memo.hits - before >= 2  # the first chat of a head renders it


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(TEMPLATES)), head=st.sampled_from(HEADS), question=QUESTIONS)
def test_templates_that_read_the_content_render_as_in_full(
    name: str, head: list[dict[str, str]], question: str
) -> None:
    memo = MEMOS.setdefault(name, ChatPrefixMemo())
    messages = [*head, {"role": "user", "content": question}]
    assert memo.render(TEMPLATES[name], messages, {}, None) == render_chat(
        TEMPLATES[name], messages, {}, None
    )


MEMOS: dict[str, ChatPrefixMemo] = {}  # one per template, kept across examples


def test_heads_are_bounded() -> None:
    memo = ChatPrefixMemo(max_heads=3)
    for i in range(10):
        head = {"role": "system", "content": f"tenant {i}"}
        memo.render(TEMPLATES["length"], [head, {"role": "user", "content": "q"}], {}, None)
    assert len(memo._heads) == 3

"""Prompts, conversations and chat_template_kwargs on which router-side and engine-side token ids
are compared (shared by the in-process and the live-server golden tests)."""

from __future__ import annotations

from typing import Any

PROMPTS = [
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    "\t\tindented with tabs",
    "hello",
    "Hello, world!",
    "   leading and trailing spaces   ",
    "multiple   spaces     inside  the  text",
    "line one\nline two\r\nline three\rline four",
    "naïve café résumé façade",
    "日本語のテキストを分かち書きする",
    "中文分词测试，标点符号。",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "emoji 🎉🚀 family 👩‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "combining e\u0301 versus precomposed é",
    "def square(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"json": [1, 2.5, null, true], "nested": {"k": "v"}}',
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text<|im_end|>",
    "<|im_start",
    "almost<|im_start|>special",
    "<s>[INST] llama style [/INST]</s>",
    "1234567890 3.14159 -1e-10 0xDEADBEEF",
    "URL https://example.com/a/b?c=d&e=f#frag and mail a.b@c.org",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "x" * 2000,
]

SYSTEM = {"role": "system", "content": "You are terse."}

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [SYSTEM, {"role": "user", "content": "Name a colour."}],
    [
        SYSTEM,
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "continue"}, {"role": "assistant", "content": None}],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
        }
    ],
    [{"role": "user", "content": [], "name": "alice"}],
    [{"role": "user", "content": "emoji 🎉 and <|im_start|> and <|im_end|> inside", "x": 1}],
    [{"role": "tool", "content": '{"result": 42}'}, {"role": "user", "content": "  spaces  "}],
    [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "é" * i}
        for i in range(20)
    ],
]

# Conversations the engine refuses (400): the router must refuse them too.
BAD_CONVERSATIONS: list[Any] = [
    [],
    "not a list",
    [{"content": "no role"}],
    [{"role": 7, "content": "role not a string"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": 12}],
]

# Exercises every helper transformers gives templates: special-token variables, tojson, dict,
# namespace, loop controls, the generation block, strftime_now, and trim/lstrip of blocks.
CUSTOM_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(count=0) %}
{% for m in messages %}
    {% if m['role'] == 'tool' %}{% continue %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    [{{ m['role'] | upper }}{% if m.name is defined %} ({{ m.name }}){% endif %}] {{ m['content'] }}
    {% if loop.index > 12 %}{% break %}{% endif %}
    {% generation %}{{ eos_token }}{% endgeneration %}
{% endfor %}
{% if tools %}TOOLS {{ tools | tojson(indent=2) }}{% endif %}
{% if documents %}DOCS {{ documents | tojson }}{% endif %}
{% if custom_var is defined %}C {{ custom_var }} {{ dict(a=1, b=['ü']) | tojson }}{% endif %}
YEAR {{ strftime_now('%Y') }} COUNT {{ ns.count }}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <in> a city & country's capital",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

# (chat_template_kwargs, expect_error): the same answer is required of router and engine either way.
TEMPLATE_KWARGS: list[tuple[dict[str, Any] | None, bool]] = [
    (None, False),
    ({}, False),
    ({"enable_thinking": False}, False),
    ({"padding": True, "truncation": True, "max_length": 3, "return_dict": True}, False),
    ({"chat_template": CUSTOM_TEMPLATE}, False),
    ({"chat_template": CUSTOM_TEMPLATE, "tools": TOOLS}, False),
    ({"chat_template": CUSTOM_TEMPLATE, "documents": [{"title": "T", "text": "ünïcode"}]}, False),
    ({"chat_template": CUSTOM_TEMPLATE, "custom_var": "v", "bos_token": "BOS!"}, False),
    ({"chat_template": "no bos here: {{ messages[0]['content'] }}"}, False),
    ({"chat_template": None}, False),
    ({"chat_template": "{{ raise_exception('refused by template') }}"}, True),
    ({"chat_template": "{% for %}"}, True),
    ({"chat_template": "{% set ns = namespace(_private=1) %}"}, True),
    ({"chat_template": "{{ messages.append(1) }}"}, True),
    ({"add_generation_prompt": False}, True),
    ({"tokenize": True}, True),
    ({"messages": []}, True),
    ({"continue_final_message": True}, True),
    ({"return_assistant_tokens_mask": True}, True),
    ({"tools": 5}, True),
    ({"tools": ["not an object"]}, True),
]

"""Prompts of the real-engine tier: a known answer, a long shared system prompt, a copy task."""

from __future__ import annotations

from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

CAPITAL_QUESTION = "What is the capital of France?"
CAPITAL_ANSWER = "The capital of France is Paris."

# The chat template's default system turn plus the question, as /v1/completions sees it.
CAPITAL_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\n" + CAPITAL_QUESTION + "<|im_end|>\n<|im_start|>assistant\n"
)

_RULES = (
    "Answer in plain English and keep every answer short and to the point.",
    "When a question is ambiguous, state the reading you chose before answering.",
    "Quote numbers with their units, and round them to a sensible precision.",
    "Prefer a worked example over an abstract explanation whenever one fits.",
    "Never invent a reference; say so when you do not know the answer.",
    "Use lists for steps that must happen in order, and prose for everything else.",
    "Name the assumption behind every estimate you give.",
    "Keep code samples small, complete and runnable as written.",
)


def long_system_prompt(rules: int = 34, nonce: str = "") -> str:
    """A system prompt of about 700 tokens (34 rules: 694 prompt tokens with a short question
    under the SmolLM2 chat template); ``nonce`` at the very start makes the prefix unique, so
    no engine has it cached."""
    lines = [f"{nonce}You are the help desk of a company that sells garden tools."]
    lines += [f"Rule {i + 1}: {_RULES[i % len(_RULES)]}" for i in range(rules)]
    return "\n".join(lines)


def shared_prefix_messages(question: str, nonce: str = "") -> list[ChatCompletionMessageParam]:
    """The long system prompt, then ``question``."""
    return [
        ChatCompletionSystemMessageParam(role="system", content=long_system_prompt(nonce=nonce)),
        ChatCompletionUserMessageParam(role="user", content=question),
    ]


COPY_CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def factorial(n):
    """Return n factorial."""
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result


def is_prime(n):
    """Return True if n is prime."""
    if n < 2:
        return False
    for i in range(2, int(n ** 0.5) + 1):
        if n % i == 0:
            return False
    return True
'''

COPY_PROMPT = "Repeat this code exactly, without any change:\n\n" + COPY_CODE


def user(content: str) -> list[ChatCompletionMessageParam]:
    """One user turn (the chat template adds its default system turn)."""
    return [ChatCompletionUserMessageParam(role="user", content=content)]

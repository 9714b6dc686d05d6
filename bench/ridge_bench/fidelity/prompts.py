"""The requests of the fidelity report (:mod:`ridge_bench.fidelity.benchmark`), as chat messages.

None of them is a calibration request (``tests/real_engine/measure_ground_truth.py``: the
capital-of-France question, a ~700-token help-desk system prompt sent twice): the simulator is
fitted to those, so checking it on them would prove nothing. Texts and lengths here differ.

Every prompt that must reach an engine cold starts with a session line (``tag`` + repeat), so
two runs, or two repeats, never share a cached block; the same tag goes to the real engine and
to the simulator, so both count the same text.
"""

from __future__ import annotations

from typing import Any

Messages = list[dict[str, Any]]

SHORT_QUESTION = ("Which planet of our solar system is the largest, and how many Earths would "
                  "fit inside it?")

CHAT_QUESTION = "Why do cats purr?"

STORY_TOPICS = (
    "a lighthouse keeper", "a lost umbrella", "a robot gardener", "a night train",
    "a clockmaker's apprentice", "a snowed-in village", "a talking parrot", "a desert well",
)

_STATIONS = ("Aldgate", "Brixton", "Camden", "Dalston", "Euston", "Fulham", "Greenwich",
             "Hackney", "Islington", "Kew", "Lambeth", "Mitcham")
_POLICIES = (
    "Members may borrow up to eight items at a time, of which at most two may be films.",
    "Loans last three weeks and can be renewed twice online, by phone or at any desk.",
    "Reserved items are held for seven days at the branch the member chose.",
    "Reference books, maps and local newspapers stay in the reading room.",
    "Children's cards carry no late fees; adult cards pay a small fee per day.",
    "Lost or damaged items are replaced at cost, or with an identical new copy.",
    "Study rooms can be booked for two hours a day, up to a week in advance.",
    "Printing and scanning are paid at the desk; the first ten pages a week are free.",
    "Guide dogs are welcome everywhere; other animals are not allowed inside.",
    "Quiet floors forbid phone calls; group work belongs on the ground floor.",
)

COPY_CODE = '''def binary_search(items, target):
    """Return the index of target in the sorted list items, or -1."""
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1


def gcd(a, b):
    """Return the greatest common divisor of a and b."""
    while b:
        a, b = b, a % b
    return a


def bubble_sort(items):
    """Sort the list items in place and return it."""
    n = len(items)
    for i in range(n):
        for j in range(n - i - 1):
            if items[j] > items[j + 1]:
                items[j], items[j + 1] = items[j + 1], items[j]
    return items


def reverse_words(text):
    """Return text with its words in reverse order."""
    return " ".join(reversed(text.split()))
'''

COPY_PROMPT = "Repeat the following code exactly:\n" + COPY_CODE


def user(content: str) -> Messages:
    """One user turn (the chat template adds its default system turn)."""
    return [{"role": "user", "content": content}]


def session(tag: str, repeat: int) -> str:
    return f"Session {tag}-{repeat}."


def long_prompt(tag: str, repeat: int, notes: int = 34) -> Messages:
    """About 1,000 prompt tokens (34 notes) of station notes to summarise, cold."""
    lines = [session(tag, repeat), "Summarise these station notes in one sentence:"]
    for i in range(notes):
        station = _STATIONS[i % len(_STATIONS)]
        lines.append(f"Note {i + 1}: at {station} the {8 + i % 12}:{(i * 7) % 60:02d} service "
                     f"left from platform {1 + i % 9} with {40 + (i * 13) % 160} passengers.")
    return user("\n".join(lines))


def library_prompt(tag: str, repeat: int, policies: int = 35) -> str:
    """A system prompt of about 800 tokens (35 policies), unique to ``tag`` and ``repeat``."""
    lines = [f"{session(tag, repeat)} You are the assistant of a public library."]
    lines += [f"Policy {i + 1}: {_POLICIES[i % len(_POLICIES)]}" for i in range(policies)]
    return "\n".join(lines)


def shared_prefix(system: str, question: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


PREFIX_QUESTIONS = ("Can I renew a film online?", "Where can my study group meet?")
"""The first request with the shared system prompt asks the first (cold), the next the second."""


def story(index: int) -> Messages:
    return user(f"Write a short story about {STORY_TOPICS[index % len(STORY_TOPICS)]}.")


def over_context(words: int = 2400) -> Messages:
    """A prompt longer than SmolLM2's 2,048-token context (about one token per word)."""
    return user("Count the words: " + " ".join(f"w{i % 10}" for i in range(words)))

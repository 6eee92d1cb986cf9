"""Held-out prompts for the connector's figures: generated from a seed, never the shipped texts.

Each prompt is a short made-up document (a town's records, an inventory, a schedule, a letter)
built from word lists and seeded numbers, so no prompt is in the repository, and the model has
seen none of them. ``documents(n, seed)`` gives ``n`` of them; ``token_prompt`` fills an exact
token count by concatenating documents.
"""

from __future__ import annotations

import random
from collections.abc import Callable

_TOWNS = ["Aldercove", "Brinmoor", "Calloway Reach", "Dunhallow", "Eastwick Ferry", "Fennmarsh",
          "Greywater", "Harrowgate", "Islemere", "Juniper Hollow", "Kestrel Point", "Larkspur"]
_PEOPLE = ["Mara Voss", "Tobias Quill", "Ines Harrow", "Oskar Lind", "Priya Nandakumar",
           "Felix Marchetti", "Aiko Tanabe", "Ruth Okonkwo", "Dmitri Sokol", "Helena Brandt"]
_GOODS = ["copper wire", "lamp oil", "rye flour", "wool blankets", "tin buckets", "salt cod",
          "window glass", "rope", "candles", "iron nails", "barley", "printing ink"]
_EVENTS = ["the spring flood", "a fire at the mill", "the opening of the railway",
           "a dry summer", "the harbour strike", "a visit from the governor", "the new school",
           "an outbreak of fever"]
_VERBS = ["repaired", "inspected", "sold", "bought", "shipped", "counted", "recorded", "moved"]


def _records(rng: random.Random) -> str:
    town = rng.choice(_TOWNS)
    lines = [f"Records of {town}, year {rng.randint(1820, 1960)}."]
    for _ in range(rng.randint(6, 10)):
        lines.append(f"In {rng.choice(['January', 'March', 'June', 'August', 'October'])}, "
                     f"{rng.choice(_PEOPLE)} {rng.choice(_VERBS)} {rng.randint(2, 900)} units of "
                     f"{rng.choice(_GOODS)} after {rng.choice(_EVENTS)}.")
    return " ".join(lines)


def _inventory(rng: random.Random) -> str:
    rows = [f"- {rng.choice(_GOODS)}: {rng.randint(1, 500)} at "
            f"{rng.randint(1, 99)}.{rng.randint(0, 99):02d} each"
            for _ in range(rng.randint(6, 12))]
    return f"Inventory of the {rng.choice(_TOWNS)} depot, kept by {rng.choice(_PEOPLE)}:\n" + (
        "\n".join(rows))


def _schedule(rng: random.Random) -> str:
    stops = rng.sample(_TOWNS, 5)
    times = sorted(rng.sample(range(5 * 60, 23 * 60), 5))
    legs = [f"{stop} {t // 60:02d}:{t % 60:02d}" for stop, t in zip(stops, times, strict=True)]
    return (f"Timetable of the {rng.choice(['morning', 'evening', 'night'])} coach, driver "
            f"{rng.choice(_PEOPLE)}: " + ", then ".join(legs) + ". Fares are "
            f"{rng.randint(2, 30)} pence a stage; parcels under {rng.randint(2, 20)} pounds "
            "ride free.")


def _letter(rng: random.Random) -> str:
    sender, receiver = rng.sample(_PEOPLE, 2)
    return (f"Dear {receiver},\nI write from {rng.choice(_TOWNS)} about {rng.choice(_EVENTS)}. "
            f"We have {rng.choice(_VERBS)} the {rng.choice(_GOODS)} as you asked, "
            f"{rng.randint(3, 80)} crates in all, and expect {rng.choice(_GOODS)} within "
            f"{rng.randint(2, 9)} weeks. The roads are {rng.choice(['poor', 'fair', 'flooded'])}."
            f"\nYours, {sender}")


_KINDS: tuple[Callable[[random.Random], str], ...] = (_records, _inventory, _schedule, _letter)


def documents(n: int, seed: int) -> list[str]:
    """``n`` generated documents (seeded; a different seed gives different ones)."""
    rng = random.Random(seed)
    return [rng.choice(_KINDS)(rng) for _ in range(n)]


def token_prompt(encode: Callable[[str], list[int]], length: int, seed: int) -> list[int]:
    """Exactly ``length`` token ids of generated documents (seeded)."""
    rng = random.Random(seed)
    tokens: list[int] = []
    while len(tokens) < length:
        tokens += encode(rng.choice(_KINDS)(rng) + "\n\n")
    return tokens[:length]

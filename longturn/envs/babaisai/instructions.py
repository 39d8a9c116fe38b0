"""What the agent is told (SPEC_babaisai.md §6): the game in one sentence, the actions, eight tips.

The level's own goal is not revealed, as in BALROG/Verlog; the tips are a paraphrase of theirs.
"""

from __future__ import annotations

# Action name -> description; the index in this order is the engine's action int.
ACTION_DESCRIPTIONS: dict[str, str] = {
    "idle": "wait for one step",
    "up": "take one step up",
    "right": "take one step to the right",
    "down": "take one step down",
    "left": "take one step to the left",
}

GOAL = (
    "You are playing Baba Is You, a puzzle game in which the rules of each level are written on "
    "text blocks that you can push around to change them; find a way to win the level."
)

TIPS: tuple[str, ...] = (
    "Look carefully at every object and text block on the map.",
    'Rules are made of text blocks in the form "[Subject] IS [Property]", e.g. "BABA IS YOU".',
    "Think about how pushing text blocks can change existing rules or create new ones.",
    "Only things that are not STOP can be moved through or pushed.",
    "The goal is usually to reach the object that is WIN, but which object wins can change.",
    "Be creative: changing a rule can change how objects behave in unexpected ways.",
    "When you are stuck, try breaking an existing rule apart and see what happens.",
    "Sometimes you have to become another object, or change what wins.",
)

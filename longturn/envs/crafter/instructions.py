"""What the system prompt says about Crafter (Verlog's dynamic prompt content, SPEC §4.2).

Action descriptions state each action's requirements; the goal lists only the achievements not yet
unlocked (rebuilt after every step); the tips carry Verlog's guide to the objects and its planning
advice. The wording is our own paraphrase of the spec, not Verlog's verbatim text.
"""

from __future__ import annotations

from typing import Mapping

from longturn.envs.base import Instructions
from longturn.envs.crafter.vocabulary import ACHIEVEMENTS

ACTION_DESCRIPTIONS: dict[str, str] = {
    "Noop": "do nothing",
    "Move West": "move west on flat ground",
    "Move East": "move east on flat ground",
    "Move North": "move north on flat ground",
    "Move South": "move south on flat ground",
    "Do": "multi-use action: mine stone, gather materials, chop trees, drink water, "
          "or attack whatever creature is in front of you",
    "Sleep": "sleep somewhere safe when your energy level is low",
    "Place Stone": "place a stone in front of you if the cell in front is free; needs 1 stone",
    "Place Table": "build and place a crafting table in front of you if the cell in front is free; "
                   "needs 2 wood",
    "Place Furnace": "build and place a furnace in front of you if the cell in front is free; "
                     "needs 4 stone",
    "Place Plant": "place a plant in front of you; needs 1 sapling",
    "Make Wood Pickaxe": "craft a wood pickaxe; needs a nearby table and 1 wood",
    "Make Stone Pickaxe": "craft a stone pickaxe; needs a nearby table, 1 wood and 1 stone",
    "Make Iron Pickaxe": "craft an iron pickaxe; needs a nearby table and furnace, "
                         "1 wood, 1 coal and 1 iron",
    "Make Wood Sword": "craft a wood sword; needs a nearby table and 1 wood",
    "Make Stone Sword": "craft a stone sword; needs a nearby table, 1 wood and 1 stone",
    "Make Iron Sword": "craft an iron sword; needs a nearby table and furnace, "
                       "1 wood, 1 coal and 1 iron",
}

# Verlog's 13 "objects you can interact with" entries, in its order.
OBJECT_GUIDE: tuple[str, ...] = (
    "Tree: chop it with bare hands to collect wood, which you need for tools",
    "Cow: killing it gives meat that restores your health and hunger; a weapon helps",
    "Grass: usually gives nothing, sometimes a sapling; no tool needed; grass is not wood",
    "Stone: mine it with a pickaxe to collect stone, used for better tools and furnaces",
    "Path: you can walk on it; it gives no resources",
    "Coal: mine it with a pickaxe; needed for iron tools",
    "Iron: mine it with a stone pickaxe; needed for advanced tools",
    "Diamond: mine it with an iron pickaxe",
    "Crafting Table: lets you craft tools and weapons while you are next to it; costs 2 wood",
    "Furnace: lets you craft iron tools when it is nearby",
    "Water: drinking it restores your thirst",
    "Zombie: hostile at close range; a sword is recommended",
    "Skeleton: hostile, shoots arrows from a distance; a sword is best",
)

PLANNING_TIP = (
    "Plan carefully before acting: take into account your inventory, the items you see, the item "
    "in front of you, the achievements left, the available actions and your status, and what each "
    "item and action requires."
)


def goal_text(achievements: Mapping[str, int] | None) -> str:
    """Unlock as much as possible: the numbered list of what is still locked, in prompt order
    (all 22 before the first step), each titled as the prompt spells it (`Make Wood Pickaxe`)."""
    remaining = [name for name in ACHIEVEMENTS
                 if achievements is None or achievements.get(name, 0) == 0]
    if not remaining:
        return "survive: you have unlocked every achievement"
    listed = ",\n".join(f"{n}. {name.replace('_', ' ').title()}"
                        for n, name in enumerate(remaining, start=1))
    return ("progress as much as possible in Crafter by unlocking these achievements you have "
            f"not unlocked yet:\n{listed}")


def crafter_instructions(achievements: Mapping[str, int] | None) -> Instructions:
    """Instructions for the prompt builder, given the latest achievement counts (None at reset)."""
    return Instructions(goal=goal_text(achievements), actions=dict(ACTION_DESCRIPTIONS),
                        tips=[*OBJECT_GUIDE, PLANNING_TIP])

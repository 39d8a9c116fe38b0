"""Crafter's names as the text wrappers use them: the 17 language actions, the semantic-map ids
and the 22 achievements (SPEC_crafter_text.md §2, §3.2, §8).

The order of ACTIONS is crafter's action index; the order of ACHIEVEMENTS is the prompt's.
"""

from __future__ import annotations

# Language action, in crafter's action-index order (index i is `crafter.constants.actions[i]`).
ACTIONS: tuple[str, ...] = (
    "Noop",
    "Move West",
    "Move East",
    "Move North",
    "Move South",
    "Do",
    "Sleep",
    "Place Stone",
    "Place Table",
    "Place Furnace",
    "Place Plant",
    "Make Wood Pickaxe",
    "Make Stone Pickaxe",
    "Make Iron Pickaxe",
    "Make Wood Sword",
    "Make Stone Sword",
    "Make Iron Sword",
)
DEFAULT_ACTION = "Noop"

# Semantic-map id -> name (crafter 1.8.3: materials first, then object classes).
ID_NAMES: tuple[str, ...] = (
    "None", "water", "grass", "stone", "path", "sand", "tree", "lava", "coal", "iron",
    "diamond", "table", "furnace", "player", "cow", "zombie", "skeleton", "arrow", "plant",
)
PLAYER_ID = ID_NAMES.index("player")

VITALS: tuple[str, ...] = ("health", "food", "drink", "energy")

# Achievements in the fixed order the system prompt lists them.
ACHIEVEMENTS: tuple[str, ...] = (
    "collect_wood", "place_table", "eat_cow", "collect_sapling", "collect_drink",
    "make_wood_pickaxe", "make_wood_sword", "place_plant", "defeat_zombie", "collect_stone",
    "place_stone", "eat_plant", "defeat_skeleton", "make_stone_pickaxe", "make_stone_sword",
    "wake_up", "place_furnace", "collect_coal", "collect_iron", "make_iron_pickaxe",
    "make_iron_sword", "collect_diamond",
)

"""Playing episodes: the train loop's two collections (`collection`: fixed-turn batches, or whole
episodes in groups) over either protocol's slots: the action protocol's env slots in lock-step
(`env_slots`, `env_player`), and the chat protocol's conversations (`conversation_player`), each
one growing token sequence (`conversation_rollout`, `conversation`; a reply given its history
window, `history_window`, or the whole episode), whose chat messages are appended as template
deltas (`chat_deltas`) checked against a full re-render (`tokenization_check`)."""

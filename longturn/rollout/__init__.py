"""Playing episodes: the action protocol's env slots in lock-step (`env_slots`, the collectors),
and the chat protocol's conversations, each one growing token sequence (`conversation_rollout`,
`conversation`; a reply given its history window, `history_window`, or the whole episode), whose
chat messages are appended as template deltas (`chat_deltas`) checked against a full re-render
(`tokenization_check`)."""

"""Playing episodes: env slots in lock-step with a history window (`env_slots`, the collectors),
and whole episodes as one growing token sequence (`conversation_rollout`, `conversation`), whose
chat messages are appended as template deltas (`chat_deltas`) checked against a full re-render
(`tokenization_check`)."""

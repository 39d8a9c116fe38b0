"""Playing episodes: the train loop's two collections (`collection`: fixed-turn batches, or whole
episodes in groups) over slots of conversations (`conversation_player`) of either protocol (an
env's episodes are conversations of its interaction, each reply given the action prompt), each
one growing token sequence (`conversation_rollout`, `conversation`; a reply given its history
window, `history_window`, or the whole episode), whose chat messages are appended as template
deltas (`chat_deltas`) checked against a full re-render (`tokenization_check`)."""

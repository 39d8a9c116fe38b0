"""The stages' drivers: params mapped onto library objects (`wiring`), the train loop, the critic
warm-up, evaluation, prompt validation, checkpoints and the preflight checks."""

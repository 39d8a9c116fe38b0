"""The GPU campaign's parts (bench/gpu_campaign.py is the command): the node's environment,
the learning run's stages, the GPU sampler, the profiled iteration's trace, the summary and the
archive that comes back from the node."""

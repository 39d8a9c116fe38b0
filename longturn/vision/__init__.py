"""Image observations for vision-language models: the frozen image side kept beside a causal LM
(`encoder`), the split of a LLaVA-layout model into the two (`split`), how image features reach
the LM's embeddings (`feed`), and frames as PNG bytes in the Parquet (`frames`)."""

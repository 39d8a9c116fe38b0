"""The engine served to agents over the loopback as an OpenAI-compatible endpoint, every call
recorded (docs/openai-endpoint.md)."""

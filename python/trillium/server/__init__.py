"""HTTP front end: OpenAI-compatible routes, SSE framing, error JSON. Touches no tensors."""

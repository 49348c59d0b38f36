"""The HTTP guard: the core on the wall clock in front of OpenAI-compatible backends."""

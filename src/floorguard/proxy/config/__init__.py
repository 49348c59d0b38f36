"""The guard's configuration (pydantic, from YAML): it imports nothing else of proxy/."""

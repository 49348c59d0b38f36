"""A model's pool on the wall clock: admission through the core, the serve loop, the backend
behind it (forward, pump, relay), slot shares across replicas, health, the learner callout."""

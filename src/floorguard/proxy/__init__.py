"""The HTTP guard: the core on the wall clock in front of OpenAI-compatible backends.

Five folders; a module imports only from its own folder or one below it in this list (a test
holds it, docs/architecture.md):

* `process/`: the process and its lifecycle — `serve`, the aiohttp application and its
  routes, the HTTP server, connections, workers, the admin page.
* `pool/`: a model's pool on the wall clock — admission through the core, dispatch, the
  backend (forward, pump, relay), slot shares across replicas, health, the learner callout.
* `edge/`: the request before admission — identity and API keys, the body's normalization and
  metering, the client's answers (replies, refusals, rate-limit headers).
* `observe/`: observers of the trace events — access and decision logs, metrics, usage,
  tracing.
* `config/`: the configuration (pydantic), importing nothing else of proxy/.
"""

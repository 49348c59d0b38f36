"""The live test rig, apart from the serving guard: an emulated OpenAI-compatible backend,
an open-loop load generator, the loopback demo, a throw-away `redis-server` and loopback
port helpers. The benchmarks, the demo and the tests use it; `floorguard serve` does not."""

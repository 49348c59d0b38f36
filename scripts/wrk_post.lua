-- wrk script for the guard's hot path (docs/benchmarks.md):
--   TOKEN=<a JWT for the bench tenant> wrk -t1 -c1 -d3s --latency -s scripts/wrk_post.lua URL/v1/completions
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"x","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("TOKEN") or "")

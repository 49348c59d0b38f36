"""A request before admission: who sent it (identity, API keys), what it is and what it costs
(normalization, metering), and what the client is answered (replies, refusals, rate-limit
headers)."""

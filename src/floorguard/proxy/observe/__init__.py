"""Observers of the guard's trace events: the access and decision logs, metrics, usage, and
tracing."""

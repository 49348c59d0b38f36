"""`floorguard bench …`: each benchmark measured beside a reference in the same run (the
machine is shared and noisy: only the ratio compares across machines)."""

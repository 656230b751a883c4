"""Timeline prepare adapters, one module per op of role ``prepare``: ``harness/prepares/<op>.py``
defines ``ADAPTER``, a ``harness.timeline.Prepare`` (how the op runs as a family's prepare step in
the timeline model, with its checks); the op's ``OpSpec.timeline`` returns it."""

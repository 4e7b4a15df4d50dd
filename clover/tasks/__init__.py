"""Tasks: data generators, tools and scorers that Clover models are trained and benchmarked on.

Each task lives in its own package (`clover.tasks.airspace`) and exposes the same small surface:
seeded `generate_examples`, a `score` function, and a `cli.register` hook for `clover data|score`.
"""

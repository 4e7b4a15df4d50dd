"""Clover: Mixture-of-Experts diffusion language models (define, train, decode, serve, benchmark)."""

__version__ = "0.1.0"

"""Clover: Mixture-of-Experts diffusion language models : define, train, decode, serve, bench."""

__version__ = "0.1.0"

"""`ServerConfig`: the server's settings, one field per `clover serve` flag (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "models/clover-smol"


@dataclass(kw_only=True)
class ServerConfig:
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None  # default: the directory's or preset's name
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32  # rows in the running batch (KV-cache rows)
    max_queue: int = 256  # requests waiting for a row before 429
    max_tokens_in_flight: int | None = None  # prompt + max_tokens over running requests
    max_model_len: int | None = None  # context length (default: the model's max_seq_len)
    default_max_tokens: int = 256  # when a request gives none (capped by the context)
    device: str = "auto"
    dtype: str = "auto"
    api_key: str | None = None
    max_body_bytes: int = 2 * 2**20
    torch_threads: int | None = None  # CPU threads for torch (default: torch's choice)

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "default_max_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 "
                                 f"(got {getattr(self, name)})")
        if self.max_tokens_in_flight is not None and self.max_tokens_in_flight < 1:
            raise ValueError("--max-tokens-in-flight must be >= 1 "
                             f"(got {self.max_tokens_in_flight})")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1 (got {self.torch_threads})")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535] (got {self.port})")

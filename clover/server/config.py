"""`ServerConfig`: the server's settings, one field per `clover serve` flag (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_MODEL = "models/clover-smol"


@dataclass(kw_only=True)
class ServerConfig:
    model: str = DEFAULT_MODEL
    draft: str | None = None  # a drafter adapter: self-speculative decoding (greedy only)
    served_model_name: str | None = None  # default: the directory's or preset's name
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32  # rows in the running batch (KV-cache rows)
    max_queue: int = 256  # requests waiting for a row (beyond the free rows) before 429
    max_tokens_in_flight: int | None = None  # prompt + max_tokens over running requests
    max_model_len: int | None = None  # context length (default: the model's max_seq_len)
    prefix_cache_mb: float = 256.0  # keys and values of shared prompt heads, reused (0: off)
    default_max_tokens: int = 256  # when a request gives none (capped by the context)
    # OpenAI's and vLLM's default: a request that names no temperature samples at 1.0 (with a
    # drafter too: speculative sampling; 0 makes such requests greedy)
    default_temperature: float = 1.0
    max_n: int = 8  # most choices (`n`) one request may ask for
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False  # cached forwards as one compiled graph (3-5 minutes of compiling first)
    api_key: str | None = None
    max_body_bytes: int = 2 * 2**20
    torch_threads: int | None = None  # CPU threads for torch (default: torch's choice)
    # grammar compilation (structured output), per request, in sandbox processes
    grammar_time_budget: float = 5.0  # seconds
    grammar_memory_budget: int = 1024  # MiB
    grammar_max_bytes: int = 256 * 1024  # size of a schema / grammar source
    grammar_workers: int = 1  # sandbox processes (compilations in parallel)
    # connections and lifecycle
    timeout_keep_alive: float = 5.0  # idle keep-alive connection closed after (s)
    timeout_headers: float = 10.0  # request line + headers must arrive within (s)
    timeout_body: float = 30.0  # the whole body must arrive within (s) of the headers
    shutdown_grace: float = 10.0  # on SIGTERM running requests may finish within (s)
    stall_after: float = 60.0  # /health answers 503 when the engine loop is stuck this long

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _POSITIVE and value is not None and value <= 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be > 0 (got {value})")
        if not 0 <= self.default_temperature <= 2:
            raise ValueError(f"--default-temperature must be in [0, 2] "
                             f"(got {self.default_temperature})")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"--prefix-cache-mb must be >= 0 (got {self.prefix_cache_mb})")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535] (got {self.port})")


_POSITIVE = {"max_batch", "max_queue", "default_max_tokens", "max_body_bytes",
             "max_tokens_in_flight", "torch_threads", "max_n", "grammar_time_budget",
             "grammar_memory_budget", "grammar_max_bytes", "grammar_workers",
             "timeout_keep_alive", "timeout_headers", "timeout_body", "shutdown_grace",
             "stall_after"}

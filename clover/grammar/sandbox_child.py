"""The grammar sandbox's child process: compile grammars under an address-space limit.

Run as a script by `sandbox.py` (never imported by Clover: it must not load torch or the
`clover` package, so it starts in a fraction of a second and its memory is the grammar's).
Protocol on stdin/stdout: frames of a 4-byte big-endian length plus UTF-8 JSON. The first frame
is the setup (tokenizer JSON, vocabulary size, EOS id, memory budget in bytes); each later frame
is `{"grammar": ...}`, answered `{"error": null}` when the grammar compiles and its first token
mask is computed, or `{"error": "..."}` with llguidance's message. When the grammar needs more
memory than the budget, the allocation fails and the process dies: the parent reads that as
"over the memory budget". Work runs at low priority (nice 10) so compiling yields to serving.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import sys


def _read(stream) -> dict | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return json.loads(stream.read(n).decode("utf-8"))


def _write(stream, obj: dict) -> None:
    data = json.dumps(obj).encode("utf-8")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _limit_memory(budget_bytes: int) -> None:
    """Cap the address space at what this process uses now plus the budget."""
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    limit = used + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _check(llg, tokenizer, grammar: str, vocab_size: int, eos_id: int) -> str | None:
    """None when `grammar` compiles and its start state allows some token, else the error."""
    m = llg.LLMatcher(tokenizer, grammar, log_level=0,
                      limits=llg.LLParserLimits(verbose_errors=False))
    if m.is_error():
        return m.get_error()
    words = (vocab_size + 31) // 32
    mask = bytearray(words * 4)
    buf = (ctypes.c_char * len(mask)).from_buffer(mask)
    m.unsafe_compute_mask_ptr(ctypes.addressof(buf), len(mask))
    if m.is_error():
        return m.get_error()
    allowed = int.from_bytes(mask, "little") & ~(1 << eos_id)
    if not (m.is_accepting() or allowed):
        return "unsatisfiable: it matches no text at all"
    return None


def main() -> int:
    import llguidance as llg

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    setup = _read(stdin)
    if setup is None:
        return 0
    tokenizer = llg.LLTokenizer(setup["tokenizer_json"], n_vocab=setup["vocab_size"],
                                eos_token=setup["eos_id"])
    try:
        os.nice(10)
    except OSError:
        pass
    if setup.get("memory_bytes"):
        _limit_memory(setup["memory_bytes"])
    _write(stdout, {"ready": True})
    while (task := _read(stdin)) is not None:
        try:
            error = _check(llg, tokenizer, task["grammar"], setup["vocab_size"], setup["eos_id"])
        except MemoryError:
            return 3
        except Exception as e:  # noqa: BLE001 - any failure is the grammar's, reported as text
            error = f"{type(e).__name__}: {e}"
        _write(stdout, {"error": error})
    return 0


if __name__ == "__main__":
    sys.exit(main())

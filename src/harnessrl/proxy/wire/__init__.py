"""The capture service's pure pieces, no I/O: what it reads off a request (`boundary`), a
body's content codings (`codings`), how deep a JSON value may nest (`nesting`), the checks
on a conversation before the engine (`history`), SSE framing (`sse`) and the fold of an
engine's stream into one completion (`accumulate`)."""

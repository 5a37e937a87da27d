"""The project's one HTTP client (docs/concepts/engine-http.md): `client` (HTTP/1.1 over
asyncio protocols and httptools, every response framing, keep-alive connections per
origin), on which the proxy makes its model calls to engines, and `call` (one call and its
whole answer, from async or synchronous code) for control calls: the proxy's routes,
vLLM's health, weight and version routes.

The bottom layer with `store/`: it imports nothing of harnessrl."""

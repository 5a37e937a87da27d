"""Weights for TRL's `AsyncGRPOTrainer` without a GPU, and what the trainer needs to run
on a CPU at all.

`FileWeightTransfer` implements TRL's `WeightTransferProtocol` with the file path of
`weights.VLLMWeightSync` (save, `reload_weights`, `reset_prefix_cache`, version name; vLLM
in `VLLM_SERVER_DEV_MODE=1`). TRL calls `pause`, `send_weights`, `resume` around every
sync; here `pause` holds the capture proxy's weight gate, so new model calls wait (they are
not failed) and the calls already running finish on the old weights before vLLM reloads.
Each turn records the version read when its call was admitted (proxy/gate.py), so a
rollout that spans a swap says which turns each version sampled.

Versions are TRL's own counter, named `v<n>`: `v1` is the cold sync before the first step
(the initial weights), `v<n+1>` the weights after the n-th sync. A sample's version is the
oldest that sampled any of its turns, so its staleness is never understated.

On GPUs, leave `weight_transfer` unset: TRL's own NCCL `WeightTransferClient` streams the
weights into vLLM (`--weight-transfer-config '{"backend":"nccl"}'`) and the rollout worker
still tags and drops by TRL's version. That path cannot run on the CPU machines this
project is tested on.

`install_cpu_support` makes the trainer itself run without CUDA: its tree attention calls
a flash-attention kernel fetched from a hub, which a CPU has not got; here each segment of
the packed tree attends to its root-to-segment path through PyTorch's SDPA instead, with
the same bottom-right causal alignment. And its MFU probe asks CUDA for the device name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.proxy.gate import WeightGate
from harnessrl.train.weights import VLLMWeightSync, WeightSyncError

VERSION_PREFIX = "v"


def version_name(version: int) -> str:
    return f"{VERSION_PREFIX}{version}"


def version_number(name: str | None) -> int | None:
    """TRL's version from a turn's recorded name; None when it is not one of ours."""
    if name is None or not name.startswith(VERSION_PREFIX):
        return None
    digits = name.removeprefix(VERSION_PREFIX)
    return int(digits) if digits.isdigit() else None


@dataclass
class _Checkpoint:
    """What `VLLMWeightSync.push` saves: the streamed tensors and the model's config."""

    tensors: dict[str, Any]
    config: Any

    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        save_file(self.tensors, str(Path(path) / "model.safetensors"))
        self.config.save_pretrained(path)


@dataclass
class RemoteGate:
    """The weight gate of a proxy in another process (`proxy/weight_routes.py`), e.g. the
    one TRL's harness worker serves in its child process. On release the proxy is told the
    version vLLM itself reports serving, which the calls admitted from then on record."""

    url: str
    sync: VLLMWeightSync
    admin_token: str | None = None
    timeout: float = 900.0

    def hold(self, timeout: float) -> None:
        self._post("/weights/hold", {"timeout": timeout})

    def release(self) -> None:
        """Release the proxy's gate even when the servers disagree on their version (a
        failed sync): the proxy keeps the version it had, and the disagreement is raised."""
        try:
            version = self.sync.agreed_version()
        except WeightSyncError:
            self._post("/weights/release", {"version": None})
            raise
        self._post("/weights/release", {"version": version})

    def _post(self, path: str, body: dict[str, Any]) -> None:
        """A proxy that refuses the connection is not serving (yet: TRL syncs the initial
        weights before it starts its rollout worker), so no call can pass its gate; when it
        starts it asks vLLM which version it serves."""
        try:
            self._send(path, body)
        except ConnectionRefusedError:
            return

    def _send(self, path: str, body: dict[str, Any]) -> None:
        import json
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json"}
        if self.admin_token:
            headers["Authorization"] = f"Bearer {self.admin_token}"
        request = urllib.request.Request(f"{self.url.rstrip('/')}{path}", method="POST",
                                         data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")[:300]
            raise WeightSyncError(f"POST {path} on the proxy: HTTP {error.code}: {text}"
                                  ) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):
                raise error.reason from None
            raise WeightSyncError(f"POST {path}: the proxy is unreachable: {error}") from None
        except OSError as error:
            raise WeightSyncError(f"POST {path}: the proxy is unreachable: {error}") from None


@dataclass
class FileWeightTransfer:
    """TRL's `WeightTransferProtocol` by file, holding the proxies' gates during a swap."""

    sync: VLLMWeightSync
    model_dir: Path
    # held during each swap: added by the rollout worker (ours: its proxy's gate; TRL's
    # harness worker: a RemoteGate to the proxy its child process serves)
    gates: list[WeightGate | RemoteGate] = field(default_factory=list)
    hold_timeout: float = 600.0
    version: int = 0  # TRL's model_version after the last sync
    seconds: list[float] = field(default_factory=list)  # per swap, gate held to released
    _config: Any = None
    _held_at: float | None = None

    def init_weight_transfer(self) -> None:
        from transformers import AutoConfig

        self.sync.agreed_version()  # all reachable, in dev mode (raises WeightSyncError)
        self._config = AutoConfig.from_pretrained(self.model_dir)

    def pause(self) -> None:
        import time

        self._held_at = time.monotonic()
        held: list[WeightGate | RemoteGate] = []
        try:
            for gate in self.gates:
                gate.hold(self.hold_timeout)
                held.append(gate)
        except BaseException:
            for gate in held:
                gate.release()
            raise

    def send_weights(self, iterator: Any) -> None:
        try:
            tensors = {name: t.detach().to("cpu").contiguous() for name, t in iterator}
            # save once; every server reloads before the version is announced (weights.py)
            self.sync.push(_Checkpoint(tensors, self._config), version_name(self.version + 1))
            self.version += 1  # TRL bumps its own right after `resume`
        except BaseException:
            # TRL does not resume after a failed send; never leave calls held, and raise
            # the send's error, not a release's
            with contextlib.suppress(Exception):
                self.resume()
            raise

    def resume(self) -> None:
        """Release every gate (the first error, if any, is raised after all of them)."""
        import time

        errors: list[Exception] = []
        for gate in self.gates:
            try:
                gate.release()
            except Exception as error:
                errors.append(error)
        if self._held_at is not None:
            self.seconds.append(time.monotonic() - self._held_at)
            self._held_at = None
        if errors:
            raise errors[0]

    def destroy(self) -> None:
        self.gates.clear()


# ------------------------------------------------------------------ CPU support
def _varlen_attention(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                      max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float | None = None,
                      causal: bool = True, window_size: tuple[int, int] = (-1, -1),
                      **_: Any) -> Any:
    """`flash_attn_varlen_func` for CPUs: segment s's queries attend to keys
    k[cu_k[s]:cu_k[s+1]] (its path), causally aligned to the end of the path as flash
    attention aligns them. q is (tokens, heads, dim); k, v may have fewer (grouped) heads."""
    import torch
    import torch.nn.functional as F

    if window_size != (-1, -1):
        raise NotImplementedError("sliding-window tree attention on CPU")
    out = torch.empty_like(q)
    repeat = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for s in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[s], bounds_q[s + 1], bounds_k[s], bounds_k[s + 1]
        qs = q[q0:q1].transpose(0, 1)
        ks = k[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1)
        vs = v[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1)
        mask = None
        if causal:
            lq, lk = q1 - q0, k1 - k0
            mask = (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq))
        out[q0:q1] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                    scale=softmax_scale).transpose(0, 1)
    return out


class _CPUFlashAttention:
    flash_attn_varlen_func = staticmethod(_varlen_attention)


def install_cpu_support() -> None:
    """Let `AsyncGRPOTrainer` train without CUDA (see the module docstring). Does nothing
    where CUDA is available."""
    import torch
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    if torch.cuda.is_available():
        return
    # Both are looked up as module globals when called, so replacing them is enough.
    setattr(packing, "_flash_attn", lambda: _CPUFlashAttention)  # noqa: B010
    setattr(async_grpo_trainer, "get_peak_flops_per_device",  # noqa: B010
            lambda _accelerator, _dtype: None)  # MFU is not reported on CPU

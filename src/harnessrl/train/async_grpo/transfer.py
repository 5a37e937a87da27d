"""Weights for TRL's `AsyncGRPOTrainer` without a GPU, and what the trainer needs to run
on a CPU at all.

`VersionedTransfer` implements TRL's `WeightTransferProtocol` around whichever transfer
moves the weights: `FileMover` (the file path of `weights.VLLMWeightSync`: save once,
`reload_weights` and `reset_prefix_cache` on every server at once; vLLM in
`VLLM_SERVER_DEV_MODE=1`) or TRL's own NCCL `WeightTransferClient` on GPUs
(`grpo.weight_transfer = "trl"`). TRL calls `pause`, `send_weights`, `resume` around every
sync; `pause` holds the capture proxies' weight gates, so new model calls wait (they are
not failed) and the calls already running finish on the old weights before vLLM reloads.
After the weights moved, every server is told the new version's name and the proxies'
engines stamp the name each server then reports serving (`/weight_info`), so the version
comes from the engine whatever moved the weights. TRL's NCCL transfer names none itself
(`finish_weight_update` with no version): unwrapped, vLLM would keep reporting its first
version and every row would be untagged and dropped. Each turn records the version read
when its call was admitted (proxy/gate.py), so a rollout that spans a swap says which
turns each version sampled.

Versions are TRL's own counter, named `v<n>`: `v1` is the cold sync before the first step
(the initial weights), `v<n+1>` the weights after the n-th sync. A sample's version is the
oldest that sampled any of its turns, so its staleness is never understated.

On GPUs TRL's NCCL `WeightTransferClient` streams the weights into one vLLM started with
`--weight-transfer-config '{"backend":"nccl"}'` (docs/cluster.md has the recipe). That
path cannot run on the CPU machines this project is tested on.

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

from harnessrl.train.weights import Gate, VLLMWeightSync, WeightSyncError

VERSION_PREFIX = "v"


def version_name(version: int) -> str:
    """The async trainer's name for TRL's model version `version`, as every turn sampled
    with it records (the sync trainer's are `step-N`: `train.weights.version_name`)."""
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
        from harnessrl.http.call import call, refused
        from harnessrl.http.client import TransportError

        headers = [("Authorization", f"Bearer {self.admin_token}")] if self.admin_token else []
        try:
            reply = call("POST", f"{self.url.rstrip('/')}{path}", body, timeout=self.timeout,
                         headers=headers)
        except (TransportError, TimeoutError, OSError, ValueError) as error:
            if refused(error):
                raise ConnectionRefusedError(f"POST {path}: nothing listens at {self.url}"
                                             ) from None
            raise WeightSyncError(f"POST {path}: the proxy is unreachable: {error}") from None
        if not reply.ok:
            raise WeightSyncError(f"POST {path} on the proxy: HTTP {reply.status}: "
                                  f"{reply.text(300)}")


@dataclass
class FileMover:
    """Moves the weights by file (`VLLMWeightSync.reload`: save once, every server in
    routing reloads at once); names no version: `VersionedTransfer` does."""

    sync: VLLMWeightSync
    model_dir: Path
    _config: Any = None

    def init_weight_transfer(self) -> None:
        from transformers import AutoConfig

        self.sync.agreed_version()  # all reachable, in dev mode (raises WeightSyncError)
        self._config = AutoConfig.from_pretrained(self.model_dir)

    def pause(self) -> None:
        pass  # the gates hold the calls; vLLM itself keeps serving until it reloads

    def send_weights(self, iterator: Any) -> None:
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in iterator}
        self.sync.reload(_Checkpoint(tensors, self._config))

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


@dataclass
class VersionedTransfer:
    """TRL's `WeightTransferProtocol` around whichever transfer moves the weights (`inner`:
    ours by file, TRL's NCCL `WeightTransferClient`, any other), so that every swap names
    a version and every turn records the one its server serves:

    - `pause` holds the proxies' gates (new calls wait; running ones finish on the old
      weights), then the inner transfer's pause;
    - `send_weights` lets the inner transfer move the weights, then names them `v<n+1>` on
      every vLLM server in routing (`/update_weight_version`; TRL's NCCL transfer names
      none, so without this vLLM would still report its first version and every row would
      be untagged and dropped);
    - `resume` resumes the inner transfer, reads back from every server the version it
      serves (`/weight_info`; a server that reports another is retired), has the proxies'
      engines stamp it, and only then releases the gates.
    A server that fails any of it is taken out of routing; none left ends the run.
    """

    inner: Any  # None until the trainer that builds TRL's own hands it over
    sync: VLLMWeightSync
    # held during each swap: added by the rollout worker (its proxy's gate, a cluster's
    # shards' gates, or a RemoteGate to a proxy in another process)
    gates: list[Gate] = field(default_factory=list)
    hold_timeout: float = 600.0
    version: int = 0  # TRL's model_version after the last sync
    seconds: list[float] = field(default_factory=list)  # per swap, gate held to released
    _held_at: float | None = None
    _failed: bool = False  # the last send failed: the servers' weights are unknown

    def init_weight_transfer(self) -> None:
        self.inner.init_weight_transfer()

    def pause(self) -> None:
        import time

        self._held_at = time.monotonic()
        held: list[Gate] = []
        try:
            for gate in self.gates:
                gate.hold(self.hold_timeout)
                held.append(gate)
            self.inner.pause()
        except BaseException:
            for gate in held:
                gate.release()
            raise

    def send_weights(self, iterator: Any) -> None:
        try:
            self.inner.send_weights(iterator)
            self.sync.name(version_name(self.version + 1))
            self.version += 1  # TRL bumps its own right after `resume`
        except BaseException:
            # TRL does not resume after a failed send; never leave calls held, and raise
            # the send's error, not a release's
            self._failed = True
            with contextlib.suppress(Exception):
                self.resume()
            raise

    def resume(self) -> None:
        """Stamp what the servers serve, then release every gate (the first error, if
        any, is raised after all of them)."""
        import time

        errors: list[Exception] = []
        for step in (self.inner.resume, self._stamp):
            try:
                step()
            except Exception as error:
                errors.append(error)
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

    def _stamp(self) -> None:
        if self._failed:  # some servers may hold the new weights under the old name
            self._failed = False
            self.sync.stamp(None)
            return
        self.sync.stamp_served(version_name(self.version) if self.version else None)

    def destroy(self) -> None:
        self.inner.destroy()
        self.gates.clear()


class FileWeightTransfer(VersionedTransfer):
    """`VersionedTransfer` over `FileMover`: the weights go by file (CPU, and anywhere
    TRL's NCCL transfer is not available)."""

    def __init__(self, sync: VLLMWeightSync, model_dir: Path, **options: Any) -> None:
        super().__init__(FileMover(sync, model_dir), sync, **options)


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


def install_cpu_support() -> None:
    """Let `AsyncGRPOTrainer` train without CUDA (see the module docstring). Does nothing
    where CUDA is available."""
    import torch

    from harnessrl.train.trl_compat import install_cpu_kernels

    if torch.cuda.is_available():
        return
    install_cpu_kernels(_varlen_attention)  # and MFU is not reported on CPU

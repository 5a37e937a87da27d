"""Claude Code: Anthropic Messages (`POST /v1/messages?beta=true`, streamed), after a
`HEAD /` probe of its base URL.

Traps:
- As root it refuses `--permission-mode bypassPermissions` unless `IS_SANDBOX=1`; without
  that switch headless mode cannot run its tools at all.
- By default it makes a side call (a session title, no tools) before the task and sends
  telemetry; `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` turns both off.
- Its request has fields no published schema has: a `system` role inside `messages`,
  `context_management`, `output_config`, `thinking: {"type": "adaptive"}`.
- It retries every failed call, a 401 included, up to 11 times with backoff (minutes,
  printing nothing meanwhile); `CLAUDE_CODE_MAX_RETRIES` caps that.
- `--output-format json` prints one record at the end, nothing while it works.

Exit code: honest as far as seen (1 when the API fails, after its retries; 0 after a
normal end). The final record's `subtype` is not: it says "success" even when every call
failed, and only `is_error` (with `api_error_status`) tells. The outcome reads the record:
finished means `subtype == "success"` and not `is_error`.
"""

from __future__ import annotations

from harnessrl.harnesses.base import ExitState, Harness, RunContext, last_of_type


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", instruction, "--model", ctx.model,
            "--permission-mode", "bypassPermissions",
            # one JSON record at the end: the result, with is_error and subtype
            "--output-format", "json"]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": ctx.proxy_root, "ANTHROPIC_API_KEY": ctx.key,
            "IS_SANDBOX": "1",  # allows bypassPermissions when running as root
            # no title call, no telemetry, no update check
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
            # the proxy fails only when its engine does: do not spend minutes retrying
            "CLAUDE_CODE_MAX_RETRIES": "2"}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    record = last_of_type(stdout, "result")
    if record is None:
        return ExitState(False, f"no result record on stdout (exit code {code})")
    ok = record.get("subtype") == "success" and not record.get("is_error")
    return ExitState(ok, f"subtype {record.get('subtype')!r}, is_error "
                       f"{record.get('is_error')!r}, exit code {code}")


HARNESS = Harness(
    name="claude", version="2.1.197", dialect="anthropic", registry="npm",
    package="@anthropic-ai/claude-code", binary="claude", argv=_argv, env=_env,
    outcome=_outcome,
)

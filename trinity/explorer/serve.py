"""Mode serve: the OpenAI-compatible endpoint outside agents call, and their rewarded sessions
written to the buffer for a `mode: train` process of the same run.

    serve = ServeMode(explorer)          # the explorer's engines, client, buffer and synchronizer
    url = await serve.start()            # the endpoint, with /feedback and /commit
    result = await serve.run()           # until the trainer finishes

Every `poll_s` seconds the sessions the feedback book hands out (`endpoint.feedback`: committed
and rewarded; a group only whole) are turned into experiences and written in one buffer write,
a "serve step". The write carries this endpoint's cursor (its name and its step), so the step
count is durable with the experiences: a serve process started again continues after it, and
groups keep ids no other write ever had: `EID(batch=<serve step>, task=<group in the write>,
suffix="serve/<explorer name>")`, unique across the run's serve processes and their restarts.

What the endpoint answered 200 for is on disk before the answer (`endpoint.session_log`, in
`<run folder>/serve/<explorer name>.db`): a commit freezes the session's trajectories as they
will be written (`freeze`: the session takes no calls after it), with its group and feedback.
A process started again under the same name takes the committed sessions and partial groups up
and writes them; a serve step's sessions are on disk as being written in that step before the
buffer write, so the process after a kill settles that step by the buffer's cursor: each
committed session reaches the buffer exactly once. Sessions still open at a kill are lost (410).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.buffer.storage import BufferClosed, Cursor
from trinity.common.experience import EID, Experience
from trinity.common.remote_errors import cause_of
from trinity.common.rollout import SamplingParams
from trinity.config.resolved import resolve
from trinity.endpoint.session_log import SessionLog
from trinity.explorer.ledger import LedgerStats
from trinity.explorer.rollout_stats import rollout_metrics
from trinity.explorer.tool_call_policy import apply_configured_policy
from trinity.sync.synchronizer import TrainingFinished

if TYPE_CHECKING:
    from trinity.endpoint.feedback import FeedbackBook, ReadySession
    from trinity.endpoint.server import EndpointServer, EngineSessions
    from trinity.explorer.explorer import Explorer


class ServeMode:
    """The serving side of one explorer (module doc): its endpoint, sessions and feedback."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.cfg = explorer.cfg
        self.name = self.cfg.explorer.name
        self.sessions: EngineSessions | None = None
        self.book: FeedbackBook | None = None
        self.endpoint: EndpointServer | None = None
        self.step = 0  # serve steps written, this endpoint's whole life (the buffer's cursor)
        self.written = 0  # sessions written, likewise

    async def start(self) -> str:
        """Register as the buffer's writer (taking up the cursor of an earlier process under
        this name) and a weights reader, start the endpoint (`explorer.listen_address`,
        `api_port`) with `/feedback` and `/commit`; returns its URL."""
        from trinity.endpoint.app import build_app
        from trinity.endpoint.feedback import FeedbackBook
        from trinity.endpoint.server import EndpointServer, EngineSessions

        ex, ecfg, m = self.explorer, self.cfg.explorer, self.cfg.model
        await self.register()
        defaults = SamplingParams(
            n=1,
            temperature=m.temperature,
            top_p=m.top_p,
            top_k=m.top_k,
            max_tokens=m.max_response_tokens if m.max_response_tokens is not None else 64,
        )
        cut_to = m.max_prompt_tokens if m.enable_prompt_truncation else None
        self.sessions = EngineSessions(
            ex.client,
            ex.tokenizer,
            defaults,
            m.model_path,
            cut_to,
            reasoning_parser=ecfg.rollout_model.reasoning_parser,
        )
        log = SessionLog(Path(resolve(self.cfg).run_dir) / "serve" / f"{self.name}.db")
        self.book = FeedbackBook(
            window_s=ecfg.feedback_window, log=log, freeze=self.freeze, written_through=self.step
        )
        if lost := self.book.counts["lost"]:
            print(
                f"serve: {lost} sessions the endpoint's previous process held open were lost "
                "with it (their calls were in its memory); their feedback and calls are "
                "answered 410",
                flush=True,
            )
        if restored := self.book.counts["restored"]:
            print(
                f"serve: {restored} committed sessions the previous process had not written "
                f"are taken up ({len(self.book.groups)} groups waiting for more members)",
                flush=True,
            )
        app = build_app(
            self.sessions,
            api_key=ecfg.api_key,
            tool_call_parser=ecfg.rollout_model.tool_call_parser or "hermes",
            reasoning_parser=ecfg.rollout_model.reasoning_parser,
            book=self.book,
        )
        self.endpoint = EndpointServer(app, host=ecfg.listen_address, port=ecfg.api_port)
        return await self.endpoint.start()

    async def register(self) -> None:
        """Register as the buffer's writer (a process under this name before it is superseded)
        and a weights reader; continue after the steps the buffer holds for this name."""
        ex = self.explorer
        ex._token = await ex.buffer.register_writer.remote(self.name)
        await ex.synchronizer.register_reader.remote(self.name, ex._version())
        cursor = await ex.buffer.cursor.remote(self.name)
        if cursor is not None:
            self.step, self.written = cursor.step, cursor.tasks
            print(
                f"serve: continuing after serve step {self.step} ({self.written} sessions "
                "written before)",
                flush=True,
            )

    async def run(self, poll_s: float = 0.2) -> dict[str, Any]:
        """After `start`: every `poll_s` s, write what the book hands out (one write, one report:
        a serve step); every `service_status_check_interval` s, load newer weights the trainer
        published (the engines finish the calls they hold first: weights load between batches,
        and every answer carries its `model_version`). Ends when the trainer has finished (its
        step budget: the buffer is closed), then stops the endpoint and releases the buffer."""
        assert self.book is not None and self.sessions is not None
        ex, ecfg = self.explorer, self.cfg.explorer
        steps, stopped, last_check = 0, "", time.monotonic()
        try:
            while True:
                await asyncio.sleep(poll_s)
                ready = self.book.take_ready()
                for sid in [s for s in self.sessions.sessions if not self.book.is_open(s)]:
                    self.sessions.pop(sid)  # committed (frozen) or expired: it takes no calls
                self.sessions.drop_unused(ecfg.feedback_window)  # nothing recorded, idle
                if ready:
                    steps += 1
                    await self._write_step(ready)
                if time.monotonic() - last_check >= min(1.0, ecfg.service_status_check_interval):
                    finished = await ex.synchronizer.finished_step.remote()
                    if finished is not None:  # no reader is left for what would be written
                        raise TrainingFinished(f"the trainer finished after step {finished}")
                if time.monotonic() - last_check >= ecfg.service_status_check_interval:
                    last_check = time.monotonic()
                    await ex.sync_to_latest()
        except (BufferClosed, TrainingFinished) as e:
            stopped = str(cause_of(e))
            print(f"serve: {stopped}; stopping after {steps} writes", flush=True)
        finally:
            await self.stop()
        await ex.buffer.release_writer.remote(self.name)
        await ex.synchronizer.release_reader.remote(self.name)
        return {"explore_steps": steps, "stopped_by_trainer": stopped}

    async def stop(self) -> None:
        """Stop the endpoint (no more calls). What the book holds committed is on disk (a
        process started again writes it); sessions still open are lost (answered 410)."""
        if self.endpoint is not None:
            await self.endpoint.stop()
            self.endpoint = None
        if self.book is not None and self.book.log is not None:
            self.book.log.close()
            self.book.log = None

    def freeze(self, session_id: str) -> dict[str, Any]:
        """What is written of a session, taken at its commit (`FeedbackBook.freeze`, kept on
        disk with it): its ledger's trajectories (unrewarded; `experiences` rewards them) and
        the ledger's counts. A committed session takes no calls: `run` lets its handle go."""
        assert self.sessions is not None
        handle = self.sessions.sessions.get(session_id)
        if handle is None:  # feedback and commit only: no call was made in it
            return {"experiences": [], "ledger": {}}
        return {
            "experiences": [e.to_dict() for e in handle.extract_experiences()],
            "ledger": dataclasses.asdict(handle.ledger_stats()),
        }

    async def _write_step(self, ready: list[ReadySession]) -> None:
        """One serve step: the ready sessions' experiences in one write, with the cursor. On
        disk as being written in this step first, as trained after (module doc)."""
        ex = self.explorer
        step = self.step + 1
        ids = [r.session_id for r in ready]
        assert self.book is not None
        exps, ledgers = self.experiences(step, ready)  # a failure here marks nothing on disk
        self.book.writing(ids, step)
        t0 = time.perf_counter()
        cursor = Cursor(self.name, step, self.written + len(ready))
        await ex._write(exps, cursor)
        self.step, self.written = step, cursor.tasks
        self.book.written(ids)
        metrics = {
            **(rollout_metrics(exps, "rollout/") if exps else {}),
            **{f"serve/{k}": float(v) for k, v in self.book.counts.items()},
            **{f"rollout/{k}": v for k, v in ledgers.metrics().items()},
            "serve/sessions_written": float(len(ready)),
            "serve/step": float(step),
            "rollout/model_version": float(ex._version()),
            "timing/buffer_write": time.perf_counter() - t0,
        }
        await ex.hub.put.remote("explorer", ex.step_offset + step, metrics)

    def experiences(
        self, step: int, ready: list[ReadySession]
    ) -> tuple[list[Experience], LedgerStats]:
        """The ready sessions' trained trajectories (as frozen at their commits: `freeze`; the
        ledgers' `extract_experiences` leaves out fork branches the agent did not go on with),
        then `explorer.malformed_tool_calls`; and their ledgers' counts.

        A session is one episode of its group: its rows (drift segments, or another prompt the
        agent sent in it) share the session's run, steps 0, 1, ..., so a group baseline counts
        the session once, and every row carries the session's return: its reward, or the sum
        of the rewards of the calls its rows hold (each call once). Sessions committed with one
        `group` share a group id (GRPO compares them); others are groups of their own."""
        out: list[Experience] = []
        stats = LedgerStats()
        groups: dict[str, int] = {}
        runs: dict[str, int] = {}  # the run of each group's latest session
        names = {f.name for f in dataclasses.fields(LedgerStats)}
        for r in ready:
            frozen = r.frozen or {}
            if not frozen.get("experiences"):  # feedback and commit only: no call was made
                continue
            ledger = {k: v for k, v in frozen["ledger"].items() if k in names}
            stats = stats.merged(LedgerStats(**ledger))
            key = r.group if r.group is not None else f"session:{r.session_id}"
            task = groups.setdefault(key, len(groups))
            run = runs[key] = runs.get(key, -1) + 1
            rows = [Experience.from_dict(row) for row in frozen["experiences"]]
            reward = r.reward
            if reward is None:
                by_record = r.record_rewards()
                held = dict.fromkeys(cid for e in rows for _, _, cid in e.info.get("turns", []))
                reward = sum(by_record.get(cid, 0.0) for cid in held)
            for part, e in enumerate(rows):
                e.reward = reward
                e.eid = EID(batch=step, task=task, run=run, step=part, suffix=f"serve/{self.name}")
                e.info["session_id"] = r.session_id
                out.append(e)
        apply_configured_policy(self.cfg, out)
        return out, stats

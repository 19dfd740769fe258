"""SynchronizerActor (used in-process here): exact versions, failure wake-up, timeouts."""

import asyncio

import pytest

from trinity.sync.schedule import (
    explorer_syncs_after,
    trainer_publishes_after,
    versions_to_keep,
    weights_version_after_explore_step,
)
from trinity.sync.synchronizer import SynchronizerActor, TrainingFinished


def test_explorer_gets_exactly_the_version_it_asks_for():
    async def main():
        s = SynchronizerActor("memory", max_versions=8)
        await s.register_reader("e")
        for v in (1, 2, 3):
            await s.publish(v, [f"weights-{v}"])
        # the trainer is ahead (offset > 0), but the schedule asks for v1, then v2
        assert await s.wait_for(1, timeout=1, reader="e") == (1, ["weights-1"])
        assert await s.wait_for(2, timeout=1, reader="e") == (2, ["weights-2"])
        assert sorted(s._payloads) == [2, 3]  # older versions released

    asyncio.run(main())


def test_wait_blocks_until_published():
    async def main():
        s = SynchronizerActor("memory", max_versions=8)
        waiter = asyncio.create_task(s.wait_for(2, timeout=5, reader="e"))
        await s.publish(1, ["w1"])
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await s.publish(2, ["w2"])
        assert await waiter == (2, ["w2"])

    asyncio.run(main())


def test_start_weights_wait_for_the_trainer_that_hands_them_over():
    # sync_method shared: the trainer publishes its start weights as v0, and the explorer,
    # whose count already says v0, waits for that payload rather than taking none
    async def main():
        s = SynchronizerActor("shared", max_versions=8)
        await s.register_reader("e")
        waiter = asyncio.create_task(s.wait_for(0, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await s.publish(0, ["start"])
        assert await waiter == (0, ["start"])
        # a trainer that dies before handing them over wakes the explorer with its error
        s2 = SynchronizerActor("shared", max_versions=8)
        waiter = asyncio.create_task(s2.wait_for(0, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        await s2.fail("RuntimeError: no model")
        with pytest.raises(RuntimeError, match="before publishing v0: RuntimeError: no model"):
            await waiter

    asyncio.run(main())


def test_trainer_failure_wakes_waiters_and_timeout_names_versions():
    async def main():
        s = SynchronizerActor("memory", max_versions=8)
        waiter = asyncio.create_task(s.wait_for(1, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        await s.fail("RuntimeError: out of memory")
        with pytest.raises(RuntimeError, match="out of memory"):
            await waiter
        s2 = SynchronizerActor("memory", max_versions=8)
        with pytest.raises(TimeoutError, match="v3; latest is v0"):
            await s2.wait_for(3, timeout=0.05, reader="e")
        with pytest.raises(ValueError, match="went back"):
            await s2.publish(2, ["a"])
            await s2.publish(1, ["b"])

    asyncio.run(main())


def test_checkpoint_files_of_skipped_versions_are_deleted(tmp_path):
    async def main():
        s = SynchronizerActor("checkpoint", max_versions=8)
        paths = []
        for v in (1, 2):
            p = tmp_path / f"weights_v{v}.safetensors"
            p.write_bytes(b"x")
            paths.append(p)
            await s.publish(v, [str(p)])
        await s.wait_for(2, timeout=1, reader="e")
        assert not paths[0].exists() and paths[1].exists()

    asyncio.run(main())


def test_no_reader_keeps_only_the_newest_version(tmp_path):
    # mode train (SFT): nobody explores, so only the newest version can still be asked for (the
    # final evaluation). 200 publishes leave 1 version, not 200 (unfixed: every one was kept).
    async def main():
        keep = versions_to_keep(1, 0, explorer_syncs=False)
        assert keep == 1
        s = SynchronizerActor("memory", max_versions=keep)
        for v in range(1, 201):
            await s.publish(v, [f"weights-{v}"])
        assert sorted(s._payloads) == [200]
        assert await s.wait_for(200, timeout=1, reader="e") == (200, ["weights-200"])
        # checkpoint sync: the files of dropped versions are deleted as they are dropped
        c = SynchronizerActor("checkpoint", max_versions=keep)
        for v in range(1, 6):
            p = tmp_path / f"weights_v{v}.safetensors"
            p.write_bytes(b"x")
            await c.publish(v, [str(p)])
        assert sorted(q.name for q in tmp_path.iterdir()) == ["weights_v5.safetensors"]
        await c.publish(5, [str(tmp_path / "weights_v5.safetensors")])  # the same file again
        assert (tmp_path / "weights_v5.safetensors").exists()

    asyncio.run(main())


def test_reader_that_never_asks_leaves_a_bounded_window():
    # an explorer that syncs with k = 1, d = 1 keeps d // k + 1 = 2 versions, however many arrive
    async def main():
        s = SynchronizerActor("memory", max_versions=versions_to_keep(1, 1, explorer_syncs=True))
        await s.register_reader("e")
        for v in range(1, 101):
            await s.publish(v, [v])
        assert sorted(s._payloads) == [99, 100]

    asyncio.run(main())


@pytest.mark.parametrize("interval", [1, 2, 3])
@pytest.mark.parametrize("offset", [0, 1, 2, 5])
def test_bounded_window_still_serves_the_exact_schedule(interval, offset):
    """Step-by-step simulation: the trainer runs as far ahead as the data allows (train step t
    needs explore step t), the explorer asks for `s - d` on schedule; with only
    `versions_to_keep` versions held it still gets exactly the version it asks for (and with
    one fewer it would not: the window fills up)."""

    async def main():
        keep = versions_to_keep(interval, offset, explorer_syncs=True)
        s = SynchronizerActor("memory", max_versions=keep)
        await s.register_reader("e")
        total, trained, held = 30, 0, 0
        for step in range(1, total + 1):  # explore step `step`
            if step > 1 and explorer_syncs_after(step - 1, interval, offset):
                want = weights_version_after_explore_step(step - 1, interval, offset)
                got, payload = await s.wait_for(want, timeout=1, reader="e")
                assert (got, payload) == (want, [want])
            # explore step `step` is done: the trainer may catch up to it, publishing on schedule
            while trained < step:
                trained += 1
                if trainer_publishes_after(trained, interval):
                    await s.publish(trained, [trained])
                held = max(held, len(set(s._payloads) - {s.readers["e"]}))
        await s.publish(trained, [trained])  # the final publish, for the last evaluation
        assert await s.wait_for(total, timeout=1, reader="e") == (total, [total])
        # besides the version the explorer holds, the bound is reached: one version fewer would
        # break the schedule
        assert held == keep

    asyncio.run(main())


def test_latest_never_waits_and_shared_actors_count_their_users():
    # mode explore: at a sync point the explorer takes the newest published weights, if newer
    async def main():
        s = SynchronizerActor("memory", max_versions=2)
        assert (
            await s.latest(newer_than=0, reader="e") is None
        )  # nothing yet: carry on with what it has
        for v in (1, 2, 3):
            await s.publish(v, [f"weights-{v}"])
        assert await s.latest(newer_than=0, reader="e") == (3, ["weights-3"])
        assert await s.latest(newer_than=3, reader="e") is None

    asyncio.run(main())
    s = SynchronizerActor("memory", max_versions=1)
    # explore and train process: the first found nobody (it starts the run), the second one
    assert [s.attach("explorer/a"), s.attach("trainer")] == [0, 1]
    # the explore process was SIGKILLed and runs again: the same role, not a third user
    assert s.attach("explorer/a") == 2 and s.users() == ["explorer/a", "trainer"]
    assert [s.detach("explorer/a"), s.detach("trainer")] == [1, 0]  # 0: the last one out ends it


def test_a_restarted_trainer_goes_back_to_its_checkpoint_and_waiters_see_the_end():
    async def main():
        s = SynchronizerActor("memory", max_versions=4)
        await s.register_reader("e", 0)
        for v in (1, 2, 3):
            await s.publish(v, [f"dead-{v}"])
        assert await s.wait_for(3, timeout=1, reader="e") == (3, ["dead-3"])
        await s.fail("RuntimeError: boom")
        # the trainer restarts alone from its checkpoint of step 2: the versions after it came
        # from the dead timeline; publishing 3 again is not "going back", and the failure is gone
        await s.trainer_started(2)
        assert s.version == 2 and s.readers == {"e": 2}
        waiter = asyncio.create_task(s.wait_for(3, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # waits for the new trainer, not failing with the old reason
        await s.publish(3, ["new-3"])
        assert await waiter == (3, ["new-3"])
        # the trainer finishes after step 3: asking for v4 ends at once, with the reason
        await s.finish(3)
        with pytest.raises(TrainingFinished, match="finished after step 3"):
            await s.wait_for(4, timeout=5, reader="e")
        assert await s.request(have=3, timeout=5, reader="e") is None
        assert await s.wait_for(3, timeout=1, reader="e") == (3, ["new-3"])

    asyncio.run(main())


def test_explorer_driven_request_protocol():
    """explorer_driven: the explorer asks; the trainer publishes when asked, only then."""

    async def main():
        s = SynchronizerActor(
            "memory", max_versions=versions_to_keep(1, 0, True, "explorer_driven")
        )
        # nothing trained yet: nothing newer than v0, the explorer goes on at once
        assert await s.request(have=0, timeout=1, reader="e") is None
        # the trainer trained step 1; nobody asked, so it does not publish
        assert await s.trained_step(1) is False
        asker = asyncio.create_task(s.request(have=0, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        assert not asker.done() and s.wanted == 1  # waits for the trainer's current weights
        # the trainer finishes step 2, sees the request, publishes v2 (its current weights)
        assert await s.trained_step(2) is True
        await s.publish(2, ["w2"])
        assert await asker == (2, ["w2"]) and s.wanted == 0
        # the trainer has trained nothing newer than v2: the explorer keeps its weights
        assert await s.trained_step(2) is False
        assert await s.request(have=2, timeout=1, reader="e") is None
        # published weights newer than the explorer's come at once, without asking
        await s.publish(3, ["w3"])
        assert await s.request(have=2, timeout=1, reader="e") == (3, ["w3"])
        # a trainer that dies wakes an asking explorer with its error
        await s.trained_step(4)
        asker = asyncio.create_task(s.request(have=3, timeout=5, reader="e"))
        await asyncio.sleep(0.01)
        await s.fail("RuntimeError: out of memory")
        with pytest.raises(RuntimeError, match="out of memory"):
            await asker

    asyncio.run(main())


def test_explorer_driven_request_times_out_naming_the_versions():
    async def main():
        s = SynchronizerActor("memory", max_versions=2)
        await s.trained_step(3)
        with pytest.raises(TimeoutError, match=r"newer than v0 .* trained step 3"):
            await s.request(have=0, timeout=0.05, reader="e")

    asyncio.run(main())


def test_versions_are_pruned_once_every_registered_reader_has_moved_past_them(tmp_path):
    async def main():
        s = SynchronizerActor("memory", max_versions=8)
        await s.register_reader("a")
        await s.register_reader("b")
        for v in (1, 2, 3):
            await s.publish(v, [v])
        assert await s.wait_for(1, timeout=1, reader="a") == (1, [1])
        assert await s.latest(newer_than=0, reader="b") == (3, [3])
        assert sorted(s._payloads) == [1, 2, 3]  # a holds 1 and may still ask for 2
        await s.wait_for(2, timeout=1, reader="a")
        assert sorted(s._payloads) == [2, 3]  # both readers hold 2 or newer
        await s.release_reader("a")
        assert sorted(s._payloads) == [3]  # b holds 3, the newest
        await s.release_reader("b")
        for v in (4, 5):
            await s.publish(v, [v])
        assert sorted(s._payloads) == [5]  # nobody reads: nothing accumulates

    asyncio.run(main())


def test_the_version_a_reader_holds_outlives_the_window(tmp_path):
    # a restarted engine reloads the weights its explorer holds: a checkpoint's file must stay
    # even when the trainer has published a full window of newer versions since
    async def main():
        s = SynchronizerActor("checkpoint", max_versions=2)
        await s.register_reader("e")
        files = {}
        for v in range(1, 7):
            files[v] = tmp_path / f"weights_v{v}.safetensors"
            files[v].write_bytes(b"x")
            await s.publish(v, [str(files[v])])
            if v == 1:
                await s.wait_for(1, timeout=1, reader="e")
        assert sorted(s._payloads) == [1, 5, 6]
        assert [v for v, f in files.items() if f.exists()] == [1, 5, 6]
        await s.latest(newer_than=1, reader="e")  # takes 6: 1 and 5 can go
        assert [v for v, f in files.items() if f.exists()] == [6]

    asyncio.run(main())

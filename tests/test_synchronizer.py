"""SynchronizerActor (used in-process here): exact versions, failure wake-up, timeouts."""

import asyncio

import pytest

from trinity.sync.synchronizer import SynchronizerActor


def test_explorer_gets_exactly_the_version_it_asks_for():
    async def main():
        s = SynchronizerActor("memory")
        for v in (1, 2, 3):
            await s.publish(v, [f"weights-{v}"])
        # the trainer is ahead (offset > 0), but the schedule asks for v1, then v2
        assert await s.wait_for(1, timeout=1) == (1, ["weights-1"])
        assert await s.wait_for(2, timeout=1) == (2, ["weights-2"])
        assert sorted(s._payloads) == [2, 3]  # older versions released

    asyncio.run(main())


def test_wait_blocks_until_published():
    async def main():
        s = SynchronizerActor("memory")
        waiter = asyncio.create_task(s.wait_for(2, timeout=5))
        await s.publish(1, ["w1"])
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await s.publish(2, ["w2"])
        assert await waiter == (2, ["w2"])

    asyncio.run(main())


def test_trainer_failure_wakes_waiters_and_timeout_names_versions():
    async def main():
        s = SynchronizerActor("memory")
        waiter = asyncio.create_task(s.wait_for(1, timeout=5))
        await asyncio.sleep(0.01)
        await s.fail("RuntimeError: out of memory")
        with pytest.raises(RuntimeError, match="out of memory"):
            await waiter
        s2 = SynchronizerActor("memory")
        with pytest.raises(TimeoutError, match="v3; latest is v0"):
            await s2.wait_for(3, timeout=0.05)
        with pytest.raises(ValueError, match="went back"):
            await s2.publish(2, ["a"])
            await s2.publish(1, ["b"])

    asyncio.run(main())


def test_checkpoint_files_of_skipped_versions_are_deleted(tmp_path):
    async def main():
        s = SynchronizerActor("checkpoint")
        paths = []
        for v in (1, 2):
            p = tmp_path / f"weights_v{v}.safetensors"
            p.write_bytes(b"x")
            paths.append(p)
            await s.publish(v, [str(p)])
        await s.wait_for(2, timeout=1)
        assert not paths[0].exists() and paths[1].exists()

    asyncio.run(main())

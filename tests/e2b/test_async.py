"""The core calls again through AsyncSandbox. All tests share one event
loop, as an application does (the SDK keeps connection pools bound to the
loop that made them), and need no pytest plugin."""

import asyncio

import pytest

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileType,
    FilesystemEventType,
    NotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

WRONG_KEY = "e2b_" + "0" * 40

LOOP = asyncio.new_event_loop()


def run(coroutine):
    return LOOP.run_until_complete(coroutine)


def test_create_info_kill(make_async_sandbox, tag):
    async def body():
        sbx = await make_async_sandbox(template="base", metadata={"suite": tag})
        info = await sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata.get("suite") == tag
        assert info.state == SandboxState.RUNNING
        assert await sbx.is_running()
        await sbx.set_timeout(90)
        await sbx.kill()
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info(sbx.sandbox_id)

    run(body())


def test_list_and_pages(make_async_sandbox, tag):
    async def body():
        ours = set()
        for _ in range(3):
            ours.add((await make_async_sandbox(metadata={"suite": tag})).sandbox_id)
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=2)
        seen = []
        while paginator.has_next:
            seen.extend(await paginator.next_items())
        ids = [s.sandbox_id for s in seen]
        assert len(ids) == len(set(ids)) and set(ids) == ours

    run(body())


def test_connect(make_async_sandbox):
    async def body():
        sbx = await make_async_sandbox()
        connected = await AsyncSandbox.connect(sbx.sandbox_id)
        assert connected.sandbox_id == sbx.sandbox_id
        assert (await connected.commands.run("echo hi")).stdout == "hi\n"

    run(body())


def test_commands(make_async_sandbox):
    async def body():
        sbx = await make_async_sandbox()
        result = await sbx.commands.run("echo out; echo err >&2")
        assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
        with pytest.raises(CommandExitException) as raised:
            await sbx.commands.run("exit 4")
        assert raised.value.exit_code == 4
        result = await sbx.commands.run("echo $X; pwd; whoami", envs={"X": "y"}, cwd="/tmp", user="root")
        assert result.stdout == "y\n/tmp\nroot\n"

        handle = await sbx.commands.run("sleep 1; echo bg", background=True)
        assert (await handle.wait()).stdout == "bg\n"

        handle = await sbx.commands.run("head -n 1", background=True, stdin=True)
        await sbx.commands.send_stdin(handle.pid, "line\n")
        assert (await handle.wait()).stdout == "line\n"

        handle = await sbx.commands.run("sleep 600", background=True)
        assert handle.pid in [p.pid for p in await sbx.commands.list()]
        assert await sbx.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            await handle.wait()

        with pytest.raises(TimeoutException):
            await sbx.commands.run("sleep 60", timeout=2)

    run(body())


def test_files(make_async_sandbox):
    async def body():
        sbx = await make_async_sandbox()
        await sbx.files.write("/home/user/d/a.txt", "text")
        await sbx.files.write("/home/user/d/b.bin", b"\x00\x01\x02")
        assert await sbx.files.read("/home/user/d/a.txt") == "text"
        assert await sbx.files.read("/home/user/d/b.bin", format="bytes") == b"\x00\x01\x02"
        await sbx.files.write_files(
            [{"path": "/home/user/d/c.txt", "data": "c"}, {"path": "/home/user/d/e/f.txt", "data": "f"}]
        )
        names = sorted(e.name for e in await sbx.files.list("/home/user/d"))
        assert names == ["a.txt", "b.bin", "c.txt", "e"]
        deep = sorted(e.path for e in await sbx.files.list("/home/user/d", depth=2))
        assert "/home/user/d/e/f.txt" in deep
        assert await sbx.files.exists("/home/user/d/a.txt")
        assert not await sbx.files.exists("/home/user/d/zzz")
        info = await sbx.files.get_info("/home/user/d/a.txt")
        assert info.type == FileType.FILE and info.size == 4
        assert await sbx.files.make_dir("/home/user/d/new") is True
        await sbx.files.rename("/home/user/d/a.txt", "/home/user/d/a2.txt")
        assert await sbx.files.read("/home/user/d/a2.txt") == "text"
        await sbx.files.remove("/home/user/d/a2.txt")
        assert not await sbx.files.exists("/home/user/d/a2.txt")
        with pytest.raises(NotFoundException):
            await sbx.files.read("/home/user/d/a2.txt")

    run(body())


@pytest.mark.deadline(60)
def test_watch_dir(make_async_sandbox):
    async def body():
        sbx = await make_async_sandbox()
        await sbx.files.make_dir("/home/user/w")
        events = []
        handle = await sbx.files.watch_dir("/home/user/w", on_event=events.append)
        try:
            await sbx.commands.run("echo x > /home/user/w/n.txt")

            def created():
                return any(e.name == "n.txt" and e.type == FilesystemEventType.CREATE for e in events)

            for _ in range(50):
                if created():
                    break
                await asyncio.sleep(0.2)
            assert created(), events
        finally:
            await handle.stop()

    run(body())


def test_errors(make_async_sandbox):
    async def body():
        with pytest.raises(AuthenticationException):
            await AsyncSandbox.create(api_key=WRONG_KEY, timeout=30)
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info("sbx-0000000000000000")
        with pytest.raises(NotFoundException):
            await AsyncSandbox.connect("sbx-0000000000000000")
        assert await AsyncSandbox.kill("sbx-0000000000000000") is False

    run(body())


@pytest.mark.deadline(60)
def test_kill_mid_command_ends_with_an_error(make_async_sandbox):
    async def body():
        sbx = await make_async_sandbox()

        async def kill_soon():
            await asyncio.sleep(1)
            await AsyncSandbox.kill(sbx.sandbox_id)

        killer = asyncio.create_task(kill_soon())
        try:
            result = await asyncio.wait_for(sbx.commands.run("sleep 600"), timeout=30)
        except asyncio.TimeoutError:
            pytest.fail("the command in a killed sandbox hangs")
        except Exception:
            pass
        else:
            pytest.fail(f"the command 'succeeded' in a killed sandbox: {result}")
        await killer

    run(body())


def _async_watch_has(parameter):
    import inspect

    from e2b.sandbox_async.filesystem.filesystem import Filesystem

    return parameter in inspect.signature(Filesystem.watch_dir).parameters


@pytest.mark.skipif(not _async_watch_has("include_entry"), reason="this SDK release has no entries in watch events")
@pytest.mark.deadline(60)
def test_streamed_watch_events_carry_entries_with_metadata(make_async_sandbox):
    import os

    on_gvisor = os.environ.get("AIRLOCK_TEST_TIER") == "gvisor"

    async def body():
        sbx = await make_async_sandbox()
        await sbx.files.make_dir("/home/user/aw")
        events = []
        handle = await sbx.files.watch_dir(
            "/home/user/aw", on_event=events.append, include_entry=True, allow_network_mounts=True
        )
        try:
            metadata = None if on_gvisor else {"by": "async"}
            info = await sbx.files.write("/home/user/aw/n.txt", "12345", metadata=metadata)
            assert info.metadata == metadata
            await sbx.commands.run("rm /home/user/aw/n.txt")

            def seen(kind):
                return [e for e in events if e.name == "n.txt" and e.type == kind]

            for _ in range(50):
                if seen(FilesystemEventType.WRITE) and seen(FilesystemEventType.REMOVE):
                    break
                await asyncio.sleep(0.2)
            writes = seen(FilesystemEventType.WRITE)
            assert any(e.entry is not None and e.entry.name == "n.txt" for e in writes), events
            if metadata:
                assert any(e.entry is not None and e.entry.metadata == metadata for e in writes), events
            assert seen(FilesystemEventType.REMOVE) and all(e.entry is None for e in seen(FilesystemEventType.REMOVE))
        finally:
            await handle.stop()

    run(body())

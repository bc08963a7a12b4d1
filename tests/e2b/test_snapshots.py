"""Snapshots and forks through the e2b SDK, unmodified.

`sbx.create_snapshot(name=...)`, `Sandbox.list_snapshots`,
`Sandbox.create(snapshot_id)`, `Sandbox.delete_snapshot`, `sbx.fork(count=)`
and `Sandbox.fork(sandbox_id)`. A snapshot is of a sandbox's files (no tier
here captures memory): the harness (crates/airlock/tests/e2b_sdk.rs) runs
this file against a daemon that has the layered `base` template imported,
since the host's system cannot be snapshotted.
"""

import inspect
import os
import time
import uuid

import pytest

from e2b import Sandbox, SandboxException, SandboxQuery, SandboxState

from conftest import has_lifecycle, list_all, pause, wait_state


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_a_snapshot_gives_new_sandboxes_its_files_and_fresh_identities(make_sandbox):
    sbx = make_sandbox(template="base")
    sbx.files.write("/home/user/notes.txt", "from the source")
    sbx.commands.run("mkdir -p /home/user/proj && echo built > /home/user/proj/out")
    name = unique("shot")
    info = sbx.create_snapshot(name=name)
    assert info.snapshot_id.split(":")[0] == name, info
    assert any(n.startswith(name) for n in info.names), info
    # The source runs on, untouched.
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert sbx.files.read("/home/user/notes.txt") == "from the source"

    listed = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
    assert [s.snapshot_id for s in listed] == [info.snapshot_id]
    by_name = Sandbox.list_snapshots(name=name).next_items()
    assert [s.snapshot_id for s in by_name] == [info.snapshot_id]

    children = [make_sandbox(template=info.snapshot_id) for _ in range(2)]
    for child in children:
        assert child.files.read("/home/user/notes.txt") == "from the source"
        assert child.commands.run("cat /home/user/proj/out").stdout == "built\n"
    ids = {sbx.sandbox_id} | {c.sandbox_id for c in children}
    assert len(ids) == 3
    hostnames = {c.commands.run("hostname").stdout for c in children + [sbx]}
    assert len(hostnames) == 3, hostnames
    assert children[0]._envd_access_token != children[1]._envd_access_token

    assert Sandbox.delete_snapshot(info.snapshot_id) is True
    assert Sandbox.delete_snapshot(info.snapshot_id) is False
    assert Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items() == []
    # Sandboxes made from it keep their files.
    assert children[1].files.read("/home/user/notes.txt") == "from the source"


def test_snapshots_page_through_next_token(make_sandbox):
    sbx = make_sandbox(template="base")
    taken = [sbx.create_snapshot().snapshot_id for _ in range(3)]
    paginator = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=2)
    seen = []
    while paginator.has_next:
        page = paginator.next_items()
        assert len(page) <= 2
        seen.extend(s.snapshot_id for s in page)
    assert seen == taken
    for snapshot_id in taken:
        assert Sandbox.delete_snapshot(snapshot_id)


def test_a_fork_gives_children_the_parents_files_and_the_parent_runs_on(make_sandbox):
    parent = make_sandbox(template="base")
    parent.files.write("/home/user/state", "parent")
    parent.commands.run(
        # Written aside and renamed: a reader (or a pause) never meets the
        # file truncated and not yet written.
        "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.part; mv -f /tmp/n.part /tmp/n; sleep 0.05; done",
        background=True,
    )
    time.sleep(0.3)
    children = parent.fork(count=2, timeout=120)
    assert len(children) == 2
    try:
        for i, child in enumerate(children):
            assert isinstance(child, Sandbox), child
            assert child.sandbox_id != parent.sandbox_id
            assert child.files.read("/home/user/state") == "parent"
            child.files.write("/home/user/state", f"child {i}")
        assert children[0].files.read("/home/user/state") == "child 0"
        assert children[1].files.read("/home/user/state") == "child 1"
        assert parent.files.read("/home/user/state") == "parent"
        before = int(parent.commands.run("cat /tmp/n").stdout)
        time.sleep(0.3)
        assert int(parent.commands.run("cat /tmp/n").stdout) > before
        # By id, too.
        again = Sandbox.fork(parent.sandbox_id, timeout=60)
        assert len(again) == 1 and isinstance(again[0], Sandbox), again
        assert again[0].files.read("/home/user/state") == "parent"
        children.extend(again)
    finally:
        for child in children:
            if isinstance(child, Sandbox):
                child.kill()


def test_a_paused_sandbox_can_be_snapshotted_and_stays_paused(make_sandbox):
    sbx = make_sandbox(template="base")
    sbx.files.write("/tmp/while-paused", "yes")
    pause(sbx)
    info = Sandbox.create_snapshot(sbx.sandbox_id)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    child = make_sandbox(template=info.snapshot_id)
    assert child.files.read("/tmp/while-paused") == "yes"
    assert Sandbox.delete_snapshot(info.snapshot_id)


def pause_files_only(sbx):
    """A pause keeping only the filesystem: `mode="filesystem"` (latest
    SDKs) or `keep_memory=False` (2.4x). False on SDKs that cannot ask."""
    params = inspect.signature(sbx.pause).parameters if hasattr(sbx, "pause") else {}
    if "mode" in params:
        sbx.pause(mode="filesystem")
    elif "keep_memory" in params:
        sbx.pause(keep_memory=False)
    else:
        return False
    return True


def sleepers(sbx):
    return sbx.commands.run("ps -eo args | grep -c '^sleep 1000' || true").stdout.strip()


def test_a_filesystem_pause_keeps_files_and_connect_boots_fresh_processes(make_sandbox, tag):
    sbx = make_sandbox(template="base", metadata={"suite": tag})
    for word in ["first", "second"]:
        sbx.files.write(f"/home/user/{word}", word)
        sbx.commands.run(f"echo {word} >> /tmp/log")
        sbx.commands.run("sleep 1000", background=True)
        assert sleepers(sbx) == "1"
        if not pause_files_only(sbx):
            # The oldest SDKs have only beta_pause(), which keeps memory.
            assert not hasattr(sbx, "pause")
            return
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        paused, _ = list_all(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]))
        assert [i.sandbox_id for i in paused] == [sbx.sandbox_id]
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
        # Booted again: the files are there, the process is not.
        assert sleepers(sbx) == "0"
    assert sbx.files.read("/home/user/first") == "first"
    assert sbx.files.read("/home/user/second") == "second"
    assert sbx.commands.run("cat /tmp/log").stdout == "first\nsecond\n"


def test_connect_with_a_reboot_starts_a_memory_paused_sandbox_afresh(make_sandbox):
    if "on_resume" not in inspect.signature(Sandbox.connect).parameters:
        return  # older SDKs cannot ask for it
    sbx = make_sandbox(template="base")
    sbx.files.write("/home/user/kept", "kept")
    sbx.commands.run("sleep 1000", background=True)
    pause(sbx)
    rebooted = Sandbox.connect(sbx.sandbox_id, timeout=60, on_resume="reboot")
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert rebooted.files.read("/home/user/kept") == "kept"
    assert sleepers(rebooted) == "0"


def files_only_on_timeout():
    """The `on_timeout` that pauses keeping only the filesystem, as this
    SDK spells it; None when it cannot."""
    if not has_lifecycle():
        return None
    from e2b.sandbox import sandbox_api

    fields = getattr(getattr(sandbox_api, "SandboxOnTimeoutPause", None), "__annotations__", {})
    if "mode" in fields:
        return {"action": "pause", "mode": "filesystem"}
    if "keep_memory" in fields:
        return {"action": "pause", "keep_memory": False}
    return None


def test_a_timeout_that_pauses_keeping_files_only_is_resumed_by_connect(make_sandbox):
    on_timeout = files_only_on_timeout()
    if on_timeout is None:
        return  # this SDK cannot ask for it
    sbx = make_sandbox(template="base", timeout=3, lifecycle={"on_timeout": on_timeout})
    sbx.files.write("/home/user/kept", "kept")
    sbx.commands.run("sleep 1000", background=True)
    wait_state(sbx.sandbox_id, SandboxState.PAUSED)
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert resumed.files.read("/home/user/kept") == "kept"
    assert sleepers(resumed) == "0"


def test_file_metadata_survives_snapshots_forks_and_filesystem_pauses(make_sandbox):
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem

    if "metadata" not in inspect.signature(Filesystem.write).parameters:
        pytest.skip("this SDK release has no file metadata")
    meta = {"author": "airlock", "stage": "one"}
    sbx = make_sandbox(template="base")
    if os.environ.get("AIRLOCK_TEST_TIER") == "gvisor":
        # gVisor's gofer keeps no user extended attributes: the write is
        # refused (test_files.py checks how), so there is nothing to carry.
        with pytest.raises(SandboxException, match="extended attributes"):
            sbx.files.write("/home/user/tagged.txt", "kept", metadata=meta)
        return
    sbx.files.write("/home/user/tagged.txt", "kept", metadata=meta)
    info = sbx.create_snapshot()
    child = make_sandbox(template=info.snapshot_id)
    assert child.files.get_info("/home/user/tagged.txt").metadata == meta
    assert child.files.read("/home/user/tagged.txt") == "kept"
    # An overwrite in the child replaces it there only.
    child.files.write("/home/user/tagged.txt", "changed", metadata={"stage": "two"})
    assert child.files.get_info("/home/user/tagged.txt").metadata == {"stage": "two"}
    assert sbx.files.get_info("/home/user/tagged.txt").metadata == meta
    forks = sbx.fork(count=1, timeout=60)
    try:
        assert forks[0].files.get_info("/home/user/tagged.txt").metadata == meta
    finally:
        forks[0].kill()
    if pause_files_only(sbx):
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert sbx.files.get_info("/home/user/tagged.txt").metadata == meta
    assert Sandbox.delete_snapshot(info.snapshot_id)

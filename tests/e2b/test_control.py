"""The control plane: create, get_info, list (filters, pages), connect,
set_timeout, kill, metrics, pause and resume, and its errors."""

import datetime
import inspect
import time

import pytest

from conftest import has_lifecycle, list_all, pause, wait_state
from e2b import (
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

UNKNOWN_ID = "sbx-0000000000000000"
# A well-formed key (some SDK versions reject other shapes before sending)
# that the daemon does not know.
WRONG_KEY = "e2b_" + "0" * 40


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def test_create_base_with_metadata_and_timeout(make_sandbox, tag):
    sbx = make_sandbox(template="base", timeout=60, metadata={"suite": tag, "k": "v"})
    assert sbx.sandbox_id
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata.get("suite") == tag
    assert info.metadata.get("k") == "v"
    assert info.state == SandboxState.RUNNING
    assert info.template_id
    left = (info.end_at - now()).total_seconds()
    assert 40 <= left <= 65, f"end_at is {left:.0f}s away, asked for 60"
    assert info.started_at <= now() + datetime.timedelta(seconds=5)
    assert sbx.is_running()


def test_create_default_template(make_sandbox):
    sbx = make_sandbox()
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING


def test_create_envs_reach_commands(make_sandbox):
    sbx = make_sandbox(template="base", envs={"AIRLOCK_GREETING": "hello e2b"})
    result = sbx.commands.run("echo $AIRLOCK_GREETING")
    assert result.stdout == "hello e2b\n"


def test_get_info_class_method(sandbox):
    info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.state == SandboxState.RUNNING


def test_list_metadata_filter(make_sandbox, tag):
    ours = {make_sandbox(metadata={"suite": tag, "n": str(i)}).sandbox_id for i in range(3)}
    make_sandbox(metadata={"suite": "someone-else-" + tag})
    items, _ = list_all(SandboxQuery(metadata={"suite": tag}))
    assert {i.sandbox_id for i in items} == ours
    for item in items:
        assert item.metadata["suite"] == tag
    one, _ = list_all(SandboxQuery(metadata={"suite": tag, "n": "1"}))
    assert len(one) == 1 and one[0].metadata["n"] == "1"


def test_list_pagination(make_sandbox, tag):
    ours = {make_sandbox(metadata={"suite": tag}).sandbox_id for _ in range(3)}
    items, pages = list_all(SandboxQuery(metadata={"suite": tag}), limit=1)
    ids = [i.sandbox_id for i in items]
    assert len(ids) == len(set(ids)), f"a sandbox on two pages: {ids}"
    assert set(ids) == ours
    assert pages >= 3

    paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=2)
    first = paginator.next_items()
    assert len(first) == 2
    assert paginator.has_next and paginator.next_token
    second = paginator.next_items()
    assert len(second) == 1
    assert {i.sandbox_id for i in first + second} == ours
    assert not paginator.has_next


def test_list_state_filter(make_sandbox, tag):
    live = make_sandbox(metadata={"suite": tag})
    dead = make_sandbox(metadata={"suite": tag})
    dead.kill()
    running, _ = list_all(
        SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING])
    )
    assert [i.sandbox_id for i in running] == [live.sandbox_id]
    assert running[0].state == SandboxState.RUNNING
    paused, _ = list_all(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]))
    assert paused == []


def test_connect(sandbox):
    connected = Sandbox.connect(sandbox.sandbox_id)
    assert connected.sandbox_id == sandbox.sandbox_id
    assert connected.get_info().state == SandboxState.RUNNING
    # The connected handle reaches the sandbox's envd.
    assert connected.commands.run("echo connected").stdout == "connected\n"
    # connect() on an instance works as well.
    again = sandbox.connect()
    assert again.sandbox_id == sandbox.sandbox_id


def test_set_timeout(sandbox):
    sandbox.set_timeout(200)
    left = (sandbox.get_info().end_at - now()).total_seconds()
    assert 180 <= left <= 205, f"end_at is {left:.0f}s away, asked for 200"
    Sandbox.set_timeout(sandbox.sandbox_id, 30)
    left = (Sandbox.get_info(sandbox.sandbox_id).end_at - now()).total_seconds()
    assert 10 <= left <= 35, f"end_at is {left:.0f}s away, asked for 30"


def test_get_metrics(sandbox):
    metrics = sandbox.get_metrics()
    assert isinstance(metrics, list)
    for m in metrics:
        assert m.cpu_count >= 1
        assert m.mem_total > 0


def test_kill(make_sandbox):
    sbx = make_sandbox()
    sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    assert not sbx.is_running()
    # Killing it again is not an error: the SDK reports False.
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_kill_class_method(make_sandbox):
    sbx = make_sandbox()
    assert Sandbox.kill(sbx.sandbox_id) is True
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_unknown_sandbox_is_not_found():
    # The SDK turns a 404 on kill into False, and raises its not-found
    # error for the rest.
    assert Sandbox.kill(UNKNOWN_ID) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(UNKNOWN_ID)
    with pytest.raises(NotFoundException):
        Sandbox.connect(UNKNOWN_ID)
    with pytest.raises(NotFoundException):
        Sandbox.set_timeout(UNKNOWN_ID, 30)


def test_wrong_api_key_is_an_authentication_error():
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key=WRONG_KEY, timeout=30)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=WRONG_KEY).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.get_info(UNKNOWN_ID, api_key=WRONG_KEY)


def test_wrong_api_key_cannot_touch_a_sandbox(sandbox):
    with pytest.raises(AuthenticationException):
        Sandbox.kill(sandbox.sandbox_id, api_key=WRONG_KEY)
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING


def test_pause_keeps_files_and_processes_and_connect_resumes(make_sandbox, tag):
    sbx = make_sandbox(metadata={"suite": tag})
    sbx.files.write("/tmp/kept.txt", "before the pause")
    sbx.commands.run(
        # Written aside and renamed: a reader (or a pause) never meets the
        # file truncated and not yet written.
        "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.part; mv -f /tmp/n.part /tmp/n; sleep 0.05; done",
        background=True,
    )
    time.sleep(0.3)
    pause(sbx)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    paused, _ = list_all(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]))
    assert [i.sandbox_id for i in paused] == [sbx.sandbox_id]
    running, _ = list_all(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING]))
    assert running == []
    # Paused again: the SDK's "already paused", not an error.
    pause(sbx)
    time.sleep(0.5)
    # connect() resumes it: its files and its counting process as they were.
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert resumed.files.read("/tmp/kept.txt") == "before the pause"
    frozen_at = int(resumed.commands.run("cat /tmp/n").stdout)
    assert frozen_at < 6 + 10, f"it counted while paused: {frozen_at}"
    time.sleep(0.3)
    assert int(resumed.commands.run("cat /tmp/n").stdout) > frozen_at

def test_pause_and_connect_twice_in_a_row_keep_every_change(make_sandbox):
    """E2B's most reported resume bug: file changes lost across resumes."""
    sbx = make_sandbox()
    for word in ["first", "second"]:
        sbx.files.write(f"/home/user/{word}", word)
        sbx.commands.run(f"echo {word} >> /tmp/log")
        pause(sbx)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert sbx.files.read("/home/user/first") == "first"
    assert sbx.files.read("/home/user/second") == "second"
    assert sbx.commands.run("cat /tmp/log").stdout == "first\nsecond\n"


def pausing_at_timeout(make_sandbox, timeout, auto_resume=False):
    """A sandbox its timeout pauses: `lifecycle` on newer SDKs,
    `beta_create(auto_pause=True)` on older ones."""
    if has_lifecycle():
        lifecycle = {"on_timeout": "pause"}
        if auto_resume:
            lifecycle["auto_resume"] = True
        return make_sandbox(timeout=timeout, lifecycle=lifecycle)
    assert not auto_resume, "this SDK cannot ask for auto_resume"
    sbx = Sandbox.beta_create(timeout=timeout, auto_pause=True)
    make_sandbox.created.append(sbx.sandbox_id)
    return sbx


def test_a_timeout_that_pauses_keeps_the_sandbox_and_connect_resumes_it(make_sandbox):
    sbx = pausing_at_timeout(make_sandbox, timeout=3)
    sbx.files.write("/home/user/kept", "kept")
    sbx.commands.run("sleep 1000", background=True)
    wait_state(sbx.sandbox_id, SandboxState.PAUSED)
    paused, _ = list_all(SandboxQuery(state=[SandboxState.PAUSED]))
    assert sbx.sandbox_id in [i.sandbox_id for i in paused]
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert resumed.files.read("/home/user/kept") == "kept"
    # Its process slept through the pause.
    assert resumed.commands.run("ps -eo args | grep -c '^sleep 1000'").stdout.strip() == "1"
    # The resumed sandbox has the timeout connect gave it, not the 3 s.
    time.sleep(4)
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING


def test_auto_resume_wakes_a_sandbox_its_timeout_paused(make_sandbox):
    if not has_lifecycle():
        # Older SDKs have no way to ask for it: what they can ask for is
        # the test above.
        assert "auto_resume" not in inspect.signature(Sandbox.beta_create).parameters
        return
    sbx = pausing_at_timeout(make_sandbox, timeout=3, auto_resume=True)
    sbx.files.write("/home/user/kept", "kept")
    wait_state(sbx.sandbox_id, SandboxState.PAUSED)
    # A call into it resumes it.
    assert sbx.files.read("/home/user/kept") == "kept"
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING



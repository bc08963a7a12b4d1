"""files: write/read (text, bytes), write_files, list with depth, exists,
get_info, make_dir, rename, remove, watch_dir, signed upload/download URLs;
and, in SDK releases that have them (the sandbox reports envd 0.6.4), file
metadata, entries in watch events and watches that allow network mounts."""

import inspect
import os
import time
import urllib.request

import pytest

from e2b import FileType, FilesystemEventType, NotFoundException, SandboxException
from e2b.sandbox_sync.filesystem.filesystem import Filesystem

# gVisor's gofer keeps no user extended attributes, so no file metadata.
ON_GVISOR = os.environ.get("AIRLOCK_TEST_TIER") == "gvisor"

needs_metadata = pytest.mark.skipif(
    "metadata" not in inspect.signature(Filesystem.write).parameters,
    reason="this SDK release has no file metadata",
)
needs_entries = pytest.mark.skipif(
    "include_entry" not in inspect.signature(Filesystem.watch_dir).parameters,
    reason="this SDK release has no entries in watch events",
)


def test_write_read_text(sandbox):
    info = sandbox.files.write("/home/user/hello.txt", "hello\nworld\n")
    assert info.path == "/home/user/hello.txt"
    assert sandbox.files.read("/home/user/hello.txt") == "hello\nworld\n"
    # The file is really there, owned by user.
    assert sandbox.commands.run("cat /home/user/hello.txt").stdout == "hello\nworld\n"
    assert sandbox.commands.run("stat -c %U /home/user/hello.txt").stdout == "user\n"


def test_write_read_bytes(sandbox):
    data = bytes(range(256)) * 1000
    sandbox.files.write("/tmp/blob.bin", data)
    assert sandbox.files.read("/tmp/blob.bin", format="bytes") == data


def test_write_creates_parent_dirs(sandbox):
    sandbox.files.write("/home/user/a/b/c.txt", "deep")
    assert sandbox.files.read("/home/user/a/b/c.txt") == "deep"


def test_write_files_multiple(sandbox):
    infos = sandbox.files.write_files(
        [
            {"path": "/home/user/m/one.txt", "data": "1"},
            {"path": "/home/user/m/two.bin", "data": b"\x00\x02"},
        ]
    )
    assert sorted(i.path for i in infos) == ["/home/user/m/one.txt", "/home/user/m/two.bin"]
    assert sandbox.files.read("/home/user/m/one.txt") == "1"
    assert sandbox.files.read("/home/user/m/two.bin", format="bytes") == b"\x00\x02"


def test_write_as_root(sandbox):
    sandbox.files.write("/tmp/root-file.txt", "root", user="root")
    assert sandbox.commands.run("stat -c %U /tmp/root-file.txt").stdout == "root\n"
    assert sandbox.files.read("/tmp/root-file.txt", user="root") == "root"


def test_read_missing_is_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.files.read("/home/user/does-not-exist")


def test_list_with_depth(sandbox):
    sandbox.files.write("/home/user/tree/a.txt", "a")
    sandbox.files.write("/home/user/tree/sub/b.txt", "bb")
    top = sandbox.files.list("/home/user/tree")
    assert sorted(e.name for e in top) == ["a.txt", "sub"]
    by_name = {e.name: e for e in top}
    assert by_name["a.txt"].type == FileType.FILE
    assert by_name["sub"].type == FileType.DIR
    assert by_name["a.txt"].path == "/home/user/tree/a.txt"
    deep = sandbox.files.list("/home/user/tree", depth=2)
    assert sorted(e.path for e in deep) == [
        "/home/user/tree/a.txt",
        "/home/user/tree/sub",
        "/home/user/tree/sub/b.txt",
    ]


def test_exists(sandbox):
    sandbox.files.write("/home/user/here.txt", "x")
    assert sandbox.files.exists("/home/user/here.txt")
    assert sandbox.files.exists("/home/user")
    assert not sandbox.files.exists("/home/user/not-here.txt")


def test_get_info(sandbox):
    sandbox.files.write("/home/user/info.txt", "12345")
    info = sandbox.files.get_info("/home/user/info.txt")
    assert info.name == "info.txt"
    assert info.path == "/home/user/info.txt"
    assert info.type == FileType.FILE
    assert info.size == 5
    assert info.owner == "user"
    d = sandbox.files.get_info("/home/user")
    assert d.type == FileType.DIR
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("/home/user/nope")


def test_make_dir(sandbox):
    assert sandbox.files.make_dir("/home/user/newdir/nested") is True
    assert sandbox.files.get_info("/home/user/newdir/nested").type == FileType.DIR
    # It exists already: False.
    assert sandbox.files.make_dir("/home/user/newdir/nested") is False


def test_rename(sandbox):
    sandbox.files.write("/home/user/old.txt", "moved")
    info = sandbox.files.rename("/home/user/old.txt", "/home/user/new.txt")
    assert info.path == "/home/user/new.txt"
    assert sandbox.files.read("/home/user/new.txt") == "moved"
    assert not sandbox.files.exists("/home/user/old.txt")


def test_remove(sandbox):
    sandbox.files.write("/home/user/gone/file.txt", "x")
    sandbox.files.remove("/home/user/gone/file.txt")
    assert not sandbox.files.exists("/home/user/gone/file.txt")
    sandbox.files.remove("/home/user/gone")
    assert not sandbox.files.exists("/home/user/gone")


def _watch_for(handle, name, wanted, seconds=10):
    """The events of `handle` until `name` has had every type in `wanted`."""
    events = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        events.extend(handle.get_new_events())
        if wanted <= {e.type for e in events if e.name == name}:
            break
        time.sleep(0.2)
    return events


@pytest.mark.deadline(60)
def test_watch_dir(sandbox):
    sandbox.files.make_dir("/home/user/watched")
    handle = sandbox.files.watch_dir("/home/user/watched")
    try:
        sandbox.commands.run("echo x > /home/user/watched/new.txt")
        sandbox.commands.run("rm /home/user/watched/new.txt")
        wanted = {FilesystemEventType.CREATE, FilesystemEventType.REMOVE}
        events = _watch_for(handle, "new.txt", wanted)
        assert wanted <= {e.type for e in events if e.name == "new.txt"}, events
    finally:
        handle.stop()


@pytest.mark.deadline(60)
def test_watch_dir_sees_files_write_as_create(sandbox):
    # e2b's envd writes in place: a watcher sees CREATE (and WRITE) for the
    # name written, not a temporary file renamed over it.
    sandbox.files.make_dir("/home/user/watched2")
    handle = sandbox.files.watch_dir("/home/user/watched2")
    try:
        sandbox.files.write("/home/user/watched2/new.txt", "x")
        events = _watch_for(handle, "new.txt", {FilesystemEventType.CREATE})
        assert FilesystemEventType.CREATE in {e.type for e in events if e.name == "new.txt"}, events
    finally:
        handle.stop()


def test_signed_download_url(sandbox):
    sandbox.files.write("/home/user/dl.txt", "downloaded")
    url = sandbox.download_url("/home/user/dl.txt")
    assert "signature=" in url, url
    with urllib.request.urlopen(_request(sandbox, url), timeout=30) as response:
        assert response.read() == b"downloaded"
    # A tampered signature is refused.
    bad = url.replace("signature=", "signature=x")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(_request(sandbox, bad), timeout=30)
    assert raised.value.code in (401, 403)


def test_signed_upload_url(sandbox):
    url = sandbox.upload_url("/home/user/up.txt")
    assert "signature=" in url, url
    boundary = "airlockboundary"
    body = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="up.txt"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
        "uploaded\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    request = _request(sandbox, url, data=body, method="POST")
    request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert sandbox.files.read("/home/user/up.txt") == "uploaded"


def _request(sandbox, url, data=None, method="GET"):
    """A plain HTTP request to a signed URL, with only the routing headers a
    proxy in front of e2b would add (no access token: the signature is the
    credential)."""
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("E2b-Sandbox-Id", sandbox.sandbox_id)
    request.add_header("E2b-Sandbox-Port", "49983")
    return request


def test_gzip_upload(sandbox):
    import gzip
    import inspect

    data = bytes(range(256)) * 4096
    url = sandbox.upload_url("/home/user/packed.bin")
    request = _request(sandbox, url, data=gzip.compress(data), method="POST")
    request.add_header("Content-Type", "application/octet-stream")
    request.add_header("Content-Encoding", "gzip")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert sandbox.files.read("/home/user/packed.bin", format="bytes") == bytes(data)

    # A body that says gzip but is not is refused with a 4xx.
    request = _request(sandbox, url, data=b"not gzip at all", method="POST")
    request.add_header("Content-Type", "application/octet-stream")
    request.add_header("Content-Encoding", "gzip")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=30)
    assert 400 <= raised.value.code < 500
    assert sandbox.files.read("/home/user/packed.bin", format="bytes") == bytes(data)

    if "gzip" in inspect.signature(sandbox.files.write).parameters:
        # SDK releases that know gzip (e2b 2.7.0 does not).
        sandbox.files.write("/home/user/sdk-packed.txt", "x" * 100_000, gzip=True)
        assert sandbox.files.read("/home/user/sdk-packed.txt") == "x" * 100_000
        assert sandbox.files.read("/home/user/sdk-packed.txt", gzip=True) == "x" * 100_000


def test_signed_urls_work_with_nothing_but_the_url(sandbox):
    """A signed URL handed to a browser or curl carries no e2b headers: the
    signature alone must open it (and only it)."""
    sandbox.files.write("/home/user/bare.txt", "from a bare URL")
    url = sandbox.download_url("/home/user/bare.txt")
    with urllib.request.urlopen(urllib.request.Request(url), timeout=30) as response:
        assert response.read() == b"from a bare URL"
    bad = url.replace("signature=", "signature=x")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(urllib.request.Request(bad), timeout=30)
    assert raised.value.code in (401, 403, 404)
    # Uploads too.
    url = sandbox.upload_url("/home/user/bare-up.txt")
    request = urllib.request.Request(url, data=b"bare upload", method="POST")
    request.add_header("Content-Type", "application/octet-stream")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert sandbox.files.read("/home/user/bare-up.txt") == "bare upload"


@needs_metadata
def test_metadata_is_kept_shown_replaced_and_renamed_with_the_file(sandbox):
    meta = {"author": "airlock", "Purpose": "a test"}
    if ON_GVISOR:
        # gVisor's gofer keeps no user extended attributes: refused, and
        # the file is not written.
        with pytest.raises(SandboxException, match="extended attributes"):
            sandbox.files.write("/home/user/meta.txt", "tagged", metadata=meta)
        assert not sandbox.files.exists("/home/user/meta.txt")
        return
    # Keys are lowercased by the sandbox, as envd does.
    expected = {"author": "airlock", "purpose": "a test"}
    info = sandbox.files.write("/home/user/meta.txt", "tagged", metadata=meta)
    assert info.metadata == expected
    assert sandbox.files.get_info("/home/user/meta.txt").metadata == expected
    listed = {e.name: e for e in sandbox.files.list("/home/user")}
    assert listed["meta.txt"].metadata == expected
    assert listed.get("hello.txt") is None or listed["hello.txt"].metadata is None
    # Kept where envd keeps it: user.e2b.* extended attributes.
    out = sandbox.commands.run(
        "python3 -c 'import os; print(os.getxattr(\"/home/user/meta.txt\", \"user.e2b.author\").decode())'"
    ).stdout
    assert out == "airlock\n"

    # A rename keeps it.
    renamed = sandbox.files.rename("/home/user/meta.txt", "/home/user/moved.txt")
    assert renamed.metadata == expected
    assert sandbox.files.get_info("/home/user/moved.txt").metadata == expected
    # An overwrite replaces the whole set; one without metadata clears it.
    again = sandbox.files.write("/home/user/moved.txt", "again", metadata={"only": "1"})
    assert again.metadata == {"only": "1"}
    assert sandbox.files.get_info("/home/user/moved.txt").metadata == {"only": "1"}
    plain = sandbox.files.write("/home/user/moved.txt", "plain")
    assert plain.metadata is None
    assert sandbox.files.get_info("/home/user/moved.txt").metadata is None
    assert sandbox.files.read("/home/user/moved.txt") == "plain"

    # One map for every file of a write_files, multipart or octet-stream.
    for octet in (False, True):
        infos = sandbox.files.write_files(
            [
                {"path": f"/home/user/many{octet}/a.txt", "data": "a"},
                {"path": f"/home/user/many{octet}/b.txt", "data": "b"},
            ],
            metadata={"batch": "yes"},
            use_octet_stream=octet,
        )
        assert [i.metadata for i in infos] == [{"batch": "yes"}] * 2
        for entry in sandbox.files.list(f"/home/user/many{octet}"):
            assert entry.metadata == {"batch": "yes"}, entry


def _entries_for(events, name):
    return [e for e in events if e.name == name]


@needs_entries
@pytest.mark.deadline(60)
def test_watch_events_carry_entries_when_asked(sandbox):
    sandbox.files.make_dir("/home/user/we")
    handle = sandbox.files.watch_dir("/home/user/we", include_entry=True)
    try:
        sandbox.commands.run("printf 12345 > /home/user/we/kept.txt")
        sandbox.commands.run("touch /home/user/we/gone.txt && rm /home/user/we/gone.txt")
        events = _watch_for(handle, "gone.txt", {FilesystemEventType.REMOVE})
        events += _watch_for(handle, "kept.txt", {FilesystemEventType.CREATE}, seconds=2)
        kept = _entries_for(events, "kept.txt")
        assert any(
            e.entry is not None and e.entry.path == "/home/user/we/kept.txt" and e.entry.type == FileType.FILE
            for e in kept
        ), events
        for event in events:
            if event.type in (FilesystemEventType.REMOVE, FilesystemEventType.RENAME):
                assert event.entry is None, event
    finally:
        handle.stop()
    # Without include_entry, none.
    handle = sandbox.files.watch_dir("/home/user/we")
    try:
        sandbox.commands.run("touch /home/user/we/bare.txt")
        events = _watch_for(handle, "bare.txt", {FilesystemEventType.CREATE})
        assert _entries_for(events, "bare.txt") and all(e.entry is None for e in events), events
    finally:
        handle.stop()


@needs_entries
@pytest.mark.deadline(60)
def test_watch_entries_show_metadata_and_mounts_may_be_watched(sandbox):
    # Nothing in a sandbox is a network mount; allowing them changes nothing.
    # (`sub` exists before the watch, so every change in it is seen.)
    sandbox.files.make_dir("/mnt/user-data/workspace/wm/sub")
    handle = sandbox.files.watch_dir(
        "/mnt/user-data/workspace/wm", include_entry=True, allow_network_mounts=True, recursive=True
    )
    try:
        if ON_GVISOR:
            sandbox.files.write("/mnt/user-data/workspace/wm/sub/t.txt", "x")
        else:
            sandbox.files.write("/mnt/user-data/workspace/wm/sub/t.txt", "x", metadata={"k": "v"})
        events = _watch_for(handle, "sub/t.txt", {FilesystemEventType.CREATE, FilesystemEventType.WRITE})
        entries = [e.entry for e in events if e.name == "sub/t.txt" and e.entry is not None]
        assert entries, events
        assert all(e.path == "/mnt/user-data/workspace/wm/sub/t.txt" for e in entries)
        if not ON_GVISOR:
            # The attributes are set before the content is written.
            writes = [e for e in events if e.name == "sub/t.txt" and e.type == FilesystemEventType.WRITE]
            assert any(e.entry is not None and e.entry.metadata == {"k": "v"} for e in writes), events
    finally:
        handle.stop()

"""e2b volumes against airlock: Volume.create/list/get_info/connect/destroy,
the volume content API (read, write, list, make_dir, get_info,
update_metadata, remove, exists), and Sandbox.create(volume_mounts=...)
carrying files from one sandbox to the next."""

import pytest

from e2b import Sandbox, Volume, VolumeException
from e2b.exceptions import NotFoundException


@pytest.fixture
def volume(tag):
    vol = Volume.create(f"data_{tag}")
    yield vol
    try:
        Volume.destroy(vol.volume_id)
    except Exception:
        pass


def test_a_volume_is_listed_found_by_id_and_destroyed_once(volume, tag):
    assert volume.volume_id.startswith("vol-")
    assert volume.name == f"data_{tag}"
    assert any(v.volume_id == volume.volume_id for v in Volume.list())
    info = Volume.get_info(volume.volume_id)
    assert info.name == volume.name and info.token
    with pytest.raises(VolumeException):
        Volume.create(f"data_{tag}")
    with pytest.raises(NotFoundException):
        Volume.get_info("vol-0000000000000000")
    assert Volume.destroy(volume.volume_id) is True
    assert Volume.destroy(volume.volume_id) is False


def test_files_written_in_one_sandbox_are_read_in_the_next_and_from_the_host(
    volume, make_sandbox
):
    first = make_sandbox(template="base", volume_mounts={"/mnt/data": volume})
    first.files.write("/mnt/data/hello.txt", "hi from one")
    owner = first.commands.run("stat -c '%U %u' /mnt/data/hello.txt").stdout
    assert owner.strip() == "user 1000"
    # Mounted: it cannot be destroyed.
    with pytest.raises(VolumeException):
        Volume.destroy(volume.volume_id)
    first.kill()

    second = make_sandbox(template="base", volume_mounts={"/mnt/data": volume.name})
    assert second.files.read("/mnt/data/hello.txt") == "hi from one"

    # The content API, with the volume's own token.
    vol = Volume.connect(volume.volume_id)
    assert vol.read_file("/hello.txt") == "hi from one"
    info = vol.get_info("/hello.txt")
    assert info.size == len("hi from one") and info.uid == 1000 and info.name == "hello.txt"
    assert str(info.type.value) == "file"
    vol.make_dir("/a/b", force=True)
    vol.write_file("/a/b/c.txt", "from the host", mode=0o600)
    assert vol.get_info("/a/b/c.txt").mode == 0o600
    assert second.files.read("/mnt/data/a/b/c.txt") == "from the host"
    with pytest.raises(VolumeException):
        vol.write_file("/a/b/c.txt", "again")
    vol.write_file("/a/b/c.txt", "replaced", force=True)
    assert second.files.read("/mnt/data/a/b/c.txt") == "replaced"
    with pytest.raises(VolumeException):
        vol.make_dir("/a")
    names = sorted(e.name for e in vol.list("/"))
    assert names == ["a", "hello.txt"], names
    assert vol.update_metadata("/a/b/c.txt", mode=0o644).mode == 0o644
    assert vol.exists("/a/b") and not vol.exists("/nope")
    # A link the sandbox plants is not followed out of the volume.
    second.commands.run("ln -s /etc/passwd /mnt/data/passwd")
    assert str(vol.get_info("/passwd").type.value) == "symlink"
    with pytest.raises(NotFoundException):
        vol.read_file("/passwd")
    vol.remove("/a")
    assert not vol.exists("/a/b/c.txt")
    assert second.commands.run("ls /mnt/data").stdout.split() == ["hello.txt", "passwd"]


@pytest.mark.deadline(60)
def test_a_mounted_volume_is_watched_with_entries(volume, make_sandbox):
    """A volume is a bind mount of a local directory (no network mount, as
    e2b's NFS volumes are): watched like any directory, entries and all,
    with or without allow_network_mounts; what the host writes into it is
    seen too, except on gVisor, whose kernel sees only its own changes."""
    import os
    import time

    from e2b import FilesystemEventType

    sbx = make_sandbox(template="base", volume_mounts={"/mnt/vol": volume})
    vol = Volume.connect(volume.volume_id)
    for allow in (False, True):
        handle = sbx.files.watch_dir("/mnt/vol", include_entry=True, allow_network_mounts=allow)
        try:
            sbx.commands.run(f"echo in > /mnt/vol/inside-{allow}.txt")
            vol.write_file(f"/host-{allow}.txt", "from the host")
            wanted = {f"inside-{allow}.txt"}
            if os.environ.get("AIRLOCK_TEST_TIER") != "gvisor":
                wanted.add(f"host-{allow}.txt")
            events = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                events.extend(handle.get_new_events())
                created = {
                    e.name
                    for e in events
                    if e.type == FilesystemEventType.CREATE and e.entry is not None and e.entry.name == e.name
                }
                if wanted <= created:
                    break
                time.sleep(0.2)
            assert wanted <= created, events
        finally:
            handle.stop()

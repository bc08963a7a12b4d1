//! OCI layer blobs (tar, gzip, zstd) unpacked into a fresh directory as
//! root: whatever the bytes, no panic, nothing made outside the layer's
//! directory (a canary beside it stays empty and nothing else appears
//! beside it), and after a success only the nodes a layer may leave:
//! files, directories, symlinks, FIFOs and whiteouts (character devices
//! 0:0), with no set-id bit and ids a sandbox can map.
#![no_main]

use airlock_layers::unpack::{unpack_layer, UnpackLimits};
use libfuzzer_sys::fuzz_target;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

fuzz_target!(|input: &[u8]| {
    let work = tempfile::tempdir().expect("a temp dir");
    let into = work.path().join("into");
    let canary = work.path().join("canary");
    fs::create_dir(&into).expect("into");
    fs::create_dir(&canary).expect("canary");
    let limits = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 10_000,
    };
    let result = unpack_layer(input, &into, &limits);

    assert_eq!(
        fs::read_dir(&canary).expect("canary").count(),
        0,
        "made in the canary"
    );
    let mut beside: Vec<_> = fs::read_dir(work.path())
        .expect("work dir")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    beside.sort();
    assert_eq!(beside, ["canary", "into"], "made beside the layer");
    if let Ok(unpacked) = result {
        assert!(unpacked.bytes <= limits.max_bytes && unpacked.entries <= limits.max_entries);
        check_tree(&into);
    }
});

/// Every node below `root`, never following a symlink, is one a layer may
/// leave.
fn check_tree(root: &Path) {
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).expect("read a layer directory") {
            let path = entry.expect("an entry").path();
            let meta = fs::symlink_metadata(&path).expect("metadata");
            let kind = meta.file_type();
            if kind.is_dir() {
                todo.push(path.clone());
            } else if kind.is_char_device() {
                assert_eq!(meta.rdev(), 0, "a device that is not a whiteout: {path:?}");
            } else {
                assert!(
                    kind.is_file() || kind.is_symlink() || kind.is_fifo(),
                    "a node a layer may not leave: {path:?}"
                );
            }
            assert_eq!(meta.mode() & 0o6000, 0, "a set-id bit: {path:?}");
            assert!(
                meta.uid() < 65536 && meta.gid() < 65536,
                "an unmappable id: {path:?}"
            );
        }
    }
}

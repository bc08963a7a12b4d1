//! Builds the gvisor tier's statx shim (compat/statx-shim.c, see its
//! header) as a shared object with the system's C compiler, for
//! `container` to embed. A host that is not x86_64 gets none.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=compat/statx-shim.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("statx-shim.so");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" {
        let _ = std::fs::write(&out, b"");
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-nostdlib",
            "-fno-stack-protector",
            "-Wl,-z,now",
            "-Wl,--hash-style=both",
            "-o",
        ])
        .arg(&out)
        .arg("compat/statx-shim.c")
        .status();
    match status {
        Ok(status) if status.success() => {}
        _ => panic!("{cc} could not build compat/statx-shim.c (the gvisor tier's statx shim): install a C compiler (gcc)"),
    }
}

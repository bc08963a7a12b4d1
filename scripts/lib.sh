# Shared by the scripts (sourced, not run). The Debian packages each job
# needs, and running a step as root: directly when we are root (a fresh
# Debian machine has no sudo), else through sudo.

# What `airlock run` and `airlock serve` use at run time: ip and nft prepare
# the network namespace of a sandbox with network; python3 is what the
# README's first sandbox runs; btrfs-progs makes the disk store that holds
# sandboxes' writable layers under quotas (crates/jail/src/disk.rs);
# mmdebstrap (with uidmap for its user namespaces) builds the `base`
# template from the host's apt sources (crates/layers/src/bootstrap.rs).
RUNTIME_PACKAGES=(iproute2 nftables python3 btrfs-progs mmdebstrap uidmap runsc runc)
# What building needs beside Rust: a C compiler and a static libc (the binary
# is linked statically; SQLite is compiled from source).
BUILD_PACKAGES=(gcc libc6-dev)

# Runs "$@" as root.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    echo "$(basename "$0"): this step needs root: run it as root, or install sudo" >&2
    exit 2
  fi
}

# Fails with a clear message unless cargo is on PATH.
require_cargo() {
  if ! command -v cargo >/dev/null; then
    echo "$(basename "$0"): cargo is not on PATH: install Rust (https://rustup.rs), then run this again" >&2
    exit 2
  fi
}

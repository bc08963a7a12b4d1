//! A Debian root filesystem made from the host's own package sources, as
//! one layer: what the `base` template is.
//!
//! `mmdebstrap` (Debian's successor of debootstrap) builds the system in
//! unshare mode — inside user and mount namespaces of its own, so the
//! packages' maintainer scripts run as an unprivileged uid on the host,
//! not as host root — and writes it as a tar to its standard output,
//! which goes straight into the unpacker ([`crate::unpack`]): no copy of
//! the tree is kept beside the layer. The apt sources are the host's
//! (`/etc/apt/sources.list` and `/etc/apt/sources.list.d/`), so a machine
//! that can `apt-get install` can build it, offline from the internet if
//! its mirror is local. A customize hook adds the `user` account (uid
//! 1000, home `/home/user`, bash) and its passwordless sudo rule.

use crate::archive::{ImportedImage, ImportedLayer};
use crate::store::LayerStore;
use crate::unpack::{unpack_layer, UnpackError, UnpackLimits};
use crate::ImageConfig;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// What the `base` template holds besides Debian's essential packages:
/// what agents expect of e2b's `base` (a shell, Python with pip and venv,
/// Node.js with npm, git, curl and TLS roots, ps/top, sudo).
pub const BASE_PACKAGES: &[&str] = &[
    "bash",
    "coreutils",
    "python3",
    "python3-pip",
    "python3-venv",
    "git",
    "curl",
    "ca-certificates",
    "procps",
    "sudo",
    "nodejs",
    "npm",
];

/// The account sandboxes run as by default.
pub const USER: &str = "user";
/// Its uid and gid.
pub const USER_ID: u32 = 1000;
/// The most packages a recipe may name.
pub const MAX_PACKAGES: usize = 256;
/// Lines of mmdebstrap's output kept for an error.
const TAIL_LINES: usize = 30;
/// How often the unpacking reports its bytes.
const PROGRESS_EVERY: u64 = 8 << 20;

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The Debian suite (e.g. `bookworm`); the host's when `None`.
    pub suite: Option<String>,
    /// Packages beyond the essential ones.
    pub packages: Vec<String>,
    /// apt source files (one-line or deb822); the host's when empty.
    pub sources: Vec<PathBuf>,
}

impl Default for Recipe {
    /// The `base` template: the host's suite and sources, [`BASE_PACKAGES`].
    fn default() -> Self {
        Recipe {
            suite: None,
            packages: BASE_PACKAGES.iter().map(|p| (*p).to_owned()).collect(),
            sources: Vec::new(),
        }
    }
}

/// Why a root filesystem could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("mmdebstrap is not installed: install the Debian package mmdebstrap (`apt-get install mmdebstrap`)")]
    NotInstalled,
    #[error(
        "the host's Debian suite is unknown (no VERSION_CODENAME in /etc/os-release): name one"
    )]
    NoSuite,
    #[error("the host has no apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/)")]
    NoSources,
    #[error("{0:?} is not a Debian package or suite name")]
    BadName(String),
    #[error("a recipe names at most {MAX_PACKAGES} packages")]
    TooManyPackages,
    #[error("cannot run mmdebstrap")]
    Spawn(#[source] std::io::Error),
    #[error("mmdebstrap failed ({status}); its last words:\n{tail}")]
    Failed { status: String, tail: String },
    #[error("the root filesystem mmdebstrap wrote is not a valid layer")]
    Layer(#[source] UnpackError),
    #[error("the layer store failed")]
    Store(#[source] std::io::Error),
}

/// What a bootstrap reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootstrapProgress {
    /// What mmdebstrap is doing (its `I:` lines: "downloading packages
    /// with apt...", "installing remaining packages inside the chroot...").
    Step(String),
    /// Bytes of the root filesystem unpacked so far.
    Unpacking { bytes: u64 },
}

/// Whether `name` is a Debian package (or suite) name: lowercase letters,
/// digits and `+-.`, starting alphanumeric; nothing a shell or apt would
/// read as an option or pattern.
pub fn is_package_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
}

/// The host's Debian suite, from `/etc/os-release`.
pub fn host_suite() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| is_package_name(v))
}

/// The host's apt source files.
pub fn host_sources() -> Vec<PathBuf> {
    let mut sources = Vec::new();
    let list = PathBuf::from("/etc/apt/sources.list");
    let has_entries = std::fs::read_to_string(&list).is_ok_and(|text| {
        text.lines()
            .any(|l| l.trim_start().starts_with("deb ") || l.trim_start().starts_with("deb-src "))
    });
    if has_entries {
        sources.push(list);
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut found: Vec<PathBuf> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
            .collect();
        found.sort();
        sources.extend(found);
    }
    sources
}

/// The configuration of the image made: a login as `user` in its home.
pub fn base_config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        workdir: Some(format!("/home/{USER}")),
        user: Some(USER.into()),
        entrypoint: Vec::new(),
        cmd: vec!["/bin/bash".into()],
        ..ImageConfig::default()
    }
}

/// The OCI image configuration document of a one-layer image, and its
/// digest (what names the template).
fn config_document(config: &ImageConfig, diff_id: &str, recipe: &str) -> (Vec<u8>, String) {
    let document = serde_json::json!({
        "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        "os": "linux",
        "config": {
            "Env": config.env,
            "WorkingDir": config.workdir,
            "User": config.user,
            "Cmd": config.cmd,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": recipe}],
    });
    let bytes = serde_json::to_vec(&document).unwrap_or_default();
    let digest = format!("sha256:{:x}", Sha256::digest(&bytes));
    (bytes, digest)
}

/// Kills mmdebstrap unless it was waited for.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// mmdebstrap's standard output, reporting its own progress and passing
/// on mmdebstrap's as it is read.
struct Reporting<'a, R> {
    inner: Option<R>,
    lines: mpsc::Receiver<String>,
    tail: &'a mut VecDeque<String>,
    bytes: u64,
    reported: u64,
    progress: &'a mut dyn FnMut(BootstrapProgress),
}

impl<R> Reporting<'_, R> {
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            if let Some(step) = line.strip_prefix("I: ") {
                (self.progress)(BootstrapProgress::Step(step.to_owned()));
            }
            if self.tail.len() == TAIL_LINES {
                self.tail.pop_front();
            }
            self.tail.push_back(line);
        }
    }
}

impl<R: Read> Read for Reporting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.drain();
        let Some(inner) = self.inner.as_mut() else {
            return Ok(0);
        };
        let n = inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes - self.reported >= PROGRESS_EVERY {
            self.reported = self.bytes;
            (self.progress)(BootstrapProgress::Unpacking { bytes: self.bytes });
        }
        Ok(n)
    }
}

/// The mmdebstrap command line of `recipe` for `suite` from `sources`.
fn command(recipe: &Recipe, suite: &str, sources: &[PathBuf]) -> Command {
    let mut command = Command::new("mmdebstrap");
    command
        .args(["--mode=unshare", "--variant=apt", "--format=tar"])
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(format!(
            "--customize-hook=chroot \"$1\" useradd --create-home --uid {USER_ID} --user-group --shell /bin/bash {USER}"
        ))
        .arg(format!(
            "--customize-hook=if [ -d \"$1/etc/sudoers.d\" ]; then printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\\n' {USER} > \"$1/etc/sudoers.d/{USER}\" && chmod 0440 \"$1/etc/sudoers.d/{USER}\"; fi"
        ))
        // The build host's resolver and name are not the sandboxes'.
        .arg("--customize-hook=rm -f \"$1/etc/resolv.conf\" \"$1/etc/hostname\"")
        .arg(suite)
        .arg("-")
        .args(sources)
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The suite and sources `recipe` builds from, checked.
/// Refuses a package list a recipe cannot have: more than
/// [`MAX_PACKAGES`], or a name that is not a Debian package name.
pub fn check_packages(packages: &[String]) -> Result<(), BootstrapError> {
    if packages.len() > MAX_PACKAGES {
        return Err(BootstrapError::TooManyPackages);
    }
    if let Some(bad) = packages.iter().find(|p| !is_package_name(p)) {
        return Err(BootstrapError::BadName(bad.clone()));
    }
    Ok(())
}

fn resolve(recipe: &Recipe) -> Result<(String, Vec<PathBuf>), BootstrapError> {
    check_packages(&recipe.packages)?;
    let suite = match &recipe.suite {
        Some(suite) if is_package_name(suite) => suite.clone(),
        Some(suite) => return Err(BootstrapError::BadName(suite.clone())),
        None => host_suite().ok_or(BootstrapError::NoSuite)?,
    };
    let sources = if recipe.sources.is_empty() {
        host_sources()
    } else {
        recipe.sources.clone()
    };
    if sources.is_empty() {
        return Err(BootstrapError::NoSources);
    }
    Ok((suite, sources))
}

/// Runs mmdebstrap for `recipe`, handing the tar it writes to `consume`;
/// `consume`'s result once mmdebstrap has succeeded, and the suite.
fn run<T, E>(
    recipe: &Recipe,
    progress: &mut dyn FnMut(BootstrapProgress),
    consume: impl FnOnce(&mut dyn Read) -> Result<T, E>,
    consume_error: impl FnOnce(E) -> BootstrapError,
) -> Result<(T, String), BootstrapError> {
    let (suite, sources) = resolve(recipe)?;
    let mut child = match command(recipe, &suite, &sources).spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BootstrapError::NotInstalled)
        }
        Err(e) => return Err(BootstrapError::Spawn(e)),
    };
    let (stdout, stderr) = match (child.stdout.take(), child.stderr.take()) {
        (Some(stdout), Some(stderr)) => (stdout, stderr),
        _ => {
            return Err(BootstrapError::Spawn(std::io::Error::other(
                "mmdebstrap's output is not piped",
            )))
        }
    };
    let mut running = Running(Some(child));
    let (lines_in, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_in.send(line).is_err() {
                break;
            }
        }
    });
    let mut tail = VecDeque::new();
    let mut reporting = Reporting {
        inner: Some(stdout),
        lines,
        tail: &mut tail,
        bytes: 0,
        reported: 0,
        progress,
    };
    let consumed = consume(&mut reporting);
    // mmdebstrap must not be left blocked on a pipe nobody reads.
    reporting.inner = None;
    if consumed.is_err() {
        if let Some(child) = running.0.as_mut() {
            let _ = child.kill();
        }
    }
    // What it said after its last byte of output.
    let _ = reader.join();
    reporting.drain();
    drop(reporting);
    let status = match running.0.take() {
        Some(mut child) => child.wait().map_err(BootstrapError::Spawn)?,
        None => return Err(BootstrapError::Spawn(std::io::Error::other("no child"))),
    };
    if !status.success() {
        return Err(BootstrapError::Failed {
            status: status.to_string(),
            tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok((consumed.map_err(consume_error)?, suite))
}

fn recipe_text(recipe: &Recipe, suite: &str) -> String {
    format!(
        "mmdebstrap --variant=apt {suite} --include={}",
        recipe.packages.join(",")
    )
}

/// Builds `recipe` into `store` as one layer. Blocking (minutes: it
/// downloads and installs the packages).
pub fn bootstrap(
    recipe: &Recipe,
    store: &LayerStore,
    limits: &UnpackLimits,
    progress: &mut dyn FnMut(BootstrapProgress),
) -> Result<ImportedImage, BootstrapError> {
    let staging = store.stage().map_err(BootstrapError::Store)?;
    let (unpacked, suite) = run(
        recipe,
        progress,
        |tar| unpack_layer(tar, staging.path(), limits),
        BootstrapError::Layer,
    )?;
    let diff_id = unpacked.diff_id.clone();
    store
        .commit(staging, &diff_id)
        .map_err(BootstrapError::Store)?;
    let config = base_config();
    let (_, digest) = config_document(&config, &diff_id, &recipe_text(recipe, &suite));
    Ok(ImportedImage {
        digest,
        config,
        layers: vec![ImportedLayer {
            diff_id,
            unpacked: Some(unpacked),
        }],
        tags: vec![format!("debian {suite}")],
    })
}

/// Builds `recipe` into an OCI image layout packed in a tar at `output`
/// (what `template import` takes), tagged `tag`, without a daemon: to
/// build once and import on many machines. `scratch` (a directory on the
/// same filesystem, ideally) holds the layer while the archive is
/// written. Blocking.
pub fn export(
    recipe: &Recipe,
    output: &std::path::Path,
    tag: &str,
    progress: &mut dyn FnMut(BootstrapProgress),
) -> Result<(), BootstrapError> {
    let scratch = output.parent().unwrap_or(std::path::Path::new("."));
    let io = BootstrapError::Store;
    let mut layer = tempfile::NamedTempFile::new_in(scratch).map_err(io)?;
    let ((digest, size), suite) = run(
        recipe,
        progress,
        |tar| -> std::io::Result<(String, u64)> {
            let mut hasher = Sha256::new();
            let mut buffer = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                let n = tar.read(&mut buffer)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buffer[..n]);
                std::io::Write::write_all(layer.as_file_mut(), &buffer[..n])?;
                size += n as u64;
            }
            Ok((format!("sha256:{:x}", hasher.finalize()), size))
        },
        io,
    )?;
    let config = base_config();
    let (config_bytes, config_digest) =
        config_document(&config, &digest, &recipe_text(recipe, &suite));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_bytes.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size}],
    }))
    .unwrap_or_default();
    let manifest_digest = format!("sha256:{:x}", Sha256::digest(&manifest));
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    }))
    .unwrap_or_default();
    let partial = output.with_extension("partial");
    let file = std::fs::File::create(&partial).map_err(io)?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(file));
    let mut add = |name: &str, size: u64, data: &mut dyn Read| {
        let mut header = tar::Header::new_ustar();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        archive.append_data(&mut header, name, data)
    };
    let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    add(
        "oci-layout",
        30,
        &mut &br#"{"imageLayoutVersion":"1.0.0"}"#[..],
    )
    .map_err(io)?;
    add("index.json", index.len() as u64, &mut index.as_slice()).map_err(io)?;
    add(
        &blob(&manifest_digest),
        manifest.len() as u64,
        &mut manifest.as_slice(),
    )
    .map_err(io)?;
    add(
        &blob(&config_digest),
        config_bytes.len() as u64,
        &mut config_bytes.as_slice(),
    )
    .map_err(io)?;
    let mut layer_file = layer.reopen().map_err(io)?;
    add(&blob(&digest), size, &mut layer_file).map_err(io)?;
    archive
        .into_inner()
        .and_then(|mut w| std::io::Write::flush(&mut w))
        .map_err(io)?;
    std::fs::rename(&partial, output).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_debians_and_nothing_else() {
        for ok in ["python3", "g++", "libc6-dev", "nodejs", "bookworm", "0ad"] {
            assert!(is_package_name(ok), "{ok}");
        }
        for bad in [
            "", "-x", "Python", "a b", "a,b", "a;b", "?exact", "a/b", "$(x)",
        ] {
            assert!(!is_package_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_command_carries_the_recipe_and_the_user() {
        let recipe = Recipe::default();
        let command = command(&recipe, "bookworm", &[PathBuf::from("/etc/apt/x.sources")]);
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.contains(&"--mode=unshare".to_owned()), "{args:?}");
        assert!(args
            .iter()
            .any(|a| a.starts_with("--include=bash,coreutils,python3,")));
        assert!(args
            .iter()
            .any(|a| a.contains("useradd --create-home --uid 1000")));
        assert_eq!(
            &args[args.len() - 3..],
            ["bookworm", "-", "/etc/apt/x.sources"]
        );
    }

    #[test]
    fn the_config_digest_names_the_layer_and_the_recipe() {
        let config = base_config();
        let a = config_document(&config, "sha256:aa", "r1").1;
        assert_eq!(a, config_document(&config, "sha256:aa", "r1").1);
        assert_ne!(a, config_document(&config, "sha256:bb", "r1").1);
        assert_ne!(a, config_document(&config, "sha256:aa", "r2").1);
    }
}

//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF
//! distribution registry) on a loopback port, optionally behind htpasswd
//! authentication, with images pushed into it by `skopeo copy`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A registry process and its storage; killed when dropped.
pub struct Registry {
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// `(user, password)` when it requires them.
    pub credentials: Option<(String, String)>,
    dir: tempfile::TempDir,
}

fn require(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "the registry tests need `{program}` (Debian package {package}; scripts/deps installs it)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// A registry anyone may pull from and push to.
    pub fn start() -> Registry {
        Registry::launch(None)
    }

    /// A registry that requires `user` and `password` for everything.
    pub fn start_with_auth(user: &str, password: &str) -> Registry {
        Registry::launch(Some((user.to_owned(), password.to_owned())))
    }

    fn launch(credentials: Option<(String, String)>) -> Registry {
        require("docker-registry", "docker-registry");
        require("skopeo", "skopeo");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: airlock-test\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = &credentials {
            require("htpasswd", "apache2-utils");
            let htpasswd = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(&htpasswd)
                .args([user, password])
                .output()
                .unwrap();
            assert!(out.status.success(), "htpasswd: {out:?}");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: airlock-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Registry {
            child: Some(child),
            addr,
            credentials,
            dir,
        };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(&self.addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "docker-registry did not listen on {} within 30 s",
            self.addr
        );
    }

    /// Pushes the image tagged `tag` of the OCI-layout archive `archive`
    /// as `REPOSITORY:TAG` (`what`), returning `ADDR/what`.
    pub fn push(&self, archive: &Path, tag: &str, what: &str) -> String {
        let reference = format!("{}/{what}", self.addr);
        let mut command = Command::new("skopeo");
        command.args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ]);
        if let Some((user, password)) = &self.credentials {
            command.arg(format!("--dest-creds={user}:{password}"));
        }
        let out = command
            .arg(format!("oci-archive:{}:{tag}", archive.display()))
            .arg(format!("docker://{reference}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy to {reference}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        reference
    }

    /// A scratch directory that lives as long as the registry.
    pub fn scratch(&self) -> PathBuf {
        let path = self.dir.path().join("scratch");
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// Stops the registry (it is "down" from now on).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

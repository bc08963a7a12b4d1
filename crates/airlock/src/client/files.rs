//! `airlock cp` and `airlock files`: files in a sandbox.
//!
//! Transfers are streamed both ways: an upload reads the local file (or
//! stdin) as the request body goes out; a download is written to a temporary
//! file beside the destination and renamed into place once complete, so a
//! broken transfer never leaves half a file under the destination's name.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::fs::{File, Permissions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use ureq::SendBody;

use super::format::{cell, format_utc, parse_rfc3339, Table};
use super::http::{sandbox_path, Api, ClientError, Connection};

/// Options of `airlock cp`.
#[derive(Args)]
pub struct CpArgs {
    /// What to copy: a local file, `-` for stdin, or `ID:/path` in a sandbox.
    #[arg(value_name = "SRC")]
    src: String,
    /// Where to: a local path, `-` for stdout, or `ID:/path` in a sandbox. An
    /// existing directory (or a path ending in `/`) gets the source's name.
    #[arg(value_name = "DST")]
    dst: String,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock files`.
#[derive(Args)]
pub struct FilesArgs {
    /// The sandbox.
    id: String,
    #[command(subcommand)]
    op: FilesOp,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// What `airlock files ID` does. Paths are absolute paths in the sandbox.
#[derive(Subcommand)]
enum FilesOp {
    /// List a directory: KIND MODE SIZE MTIME PATH.
    Ls {
        /// The directory.
        #[arg(default_value = "/home/user")]
        path: String,
        /// How many levels to descend.
        #[arg(long, default_value_t = 1, value_name = "N")]
        depth: u32,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the metadata of one path.
    Stat {
        /// The path.
        path: String,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Create a directory.
    Mkdir {
        /// The directory.
        path: String,
        /// Create missing parents too.
        #[arg(short = 'p', long)]
        parents: bool,
    },
    /// Move or rename a path.
    Mv {
        /// The path to move.
        from: String,
        /// Its new path.
        to: String,
    },
    /// Remove a file, or a directory and everything under it with -r.
    Rm {
        /// The path.
        path: String,
        /// Remove directories and their contents.
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Print a file's content.
    Cat {
        /// The file.
        path: String,
    },
    /// Print changes under a path as they happen (`KIND PATH`), until
    /// interrupted.
    Watch {
        /// The file or directory.
        path: String,
        /// Watch the whole tree under a directory.
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Print the daemon's events as JSON, one object a line.
        #[arg(long)]
        json: bool,
    },
}

/// One side of `cp`.
#[derive(Debug, PartialEq)]
enum Location {
    /// `-`: stdin or stdout.
    Stdio,
    /// A path on this machine.
    Local(PathBuf),
    /// `ID:/path`.
    Sandbox { id: String, path: String },
}

/// Reads one side of `cp` as `docker cp` does: `ID:/path` is in a sandbox
/// unless the text starts like a local path (`/`, `.`), which is how a local
/// name with a colon in it is written.
fn parse_location(text: &str) -> Result<Location, ClientError> {
    if text == "-" {
        return Ok(Location::Stdio);
    }
    if text.starts_with('/') || text.starts_with('.') {
        return Ok(Location::Local(PathBuf::from(text)));
    }
    match text.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') => {
            if !path.starts_with('/') {
                return Err(ClientError::Usage(format!(
                    "`{text}`: the path in a sandbox must be absolute (ID:/path)"
                )));
            }
            Ok(Location::Sandbox {
                id: id.to_owned(),
                path: path.to_owned(),
            })
        }
        _ => Ok(Location::Local(PathBuf::from(text))),
    }
}

/// `dir/name`, for a directory path in a sandbox.
fn join_remote(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The last component of a path in a sandbox.
fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// `airlock cp SRC DST`.
pub fn cp(args: &CpArgs) -> Result<ExitCode> {
    let src = parse_location(&args.src)?;
    let dst = parse_location(&args.dst)?;
    let api = args.conn.api()?;
    match (src, dst) {
        (Location::Sandbox { .. }, Location::Sandbox { .. }) => {
            return Err(ClientError::Usage(
                "cp copies between this machine and a sandbox, not between two sandboxes"
                    .to_owned(),
            )
            .into())
        }
        (Location::Sandbox { id, path }, local) => download(&api, &id, &path, &local, &args.dst)?,
        (local, Location::Sandbox { id, path }) => upload(&api, &local, &id, &path)?,
        _ => {
            return Err(ClientError::Usage(
                "one side of cp must be in a sandbox: ID:/path".to_owned(),
            )
            .into())
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn upload(api: &Api, local: &Location, id: &str, path: &str) -> Result<()> {
    let files = sandbox_path(id, "/files");
    match local {
        Location::Local(local) => {
            let file =
                File::open(local).with_context(|| format!("cannot open {}", local.display()))?;
            let meta = file
                .metadata()
                .with_context(|| format!("cannot read {}", local.display()))?;
            if meta.is_dir() {
                bail!("{} is a directory; cp copies one file", local.display());
            }
            let name = local
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            let target = remote_target(api, id, path, &name)?;
            let mode = format!("{:o}", meta.permissions().mode() & 0o777);
            // A `File` body goes out streamed, with its length.
            api.put(&files, &[("path", &target), ("mode", &mode)], file)?;
        }
        _ => {
            if path.ends_with('/') {
                return Err(ClientError::Usage(format!(
                    "`{id}:{path}` is a directory; from stdin, cp needs a file name"
                ))
                .into());
            }
            let mut stdin = std::io::stdin().lock();
            api.put(&files, &[("path", path)], SendBody::from_reader(&mut stdin))?;
        }
    }
    Ok(())
}

/// Where an upload named `name` goes: into `path` when it is a directory
/// (or ends in `/`), else to `path` itself.
fn remote_target(api: &Api, id: &str, path: &str, name: &str) -> Result<String> {
    if path.ends_with('/') {
        return Ok(join_remote(path, name));
    }
    match api.get_json(&sandbox_path(id, "/files/stat"), &[("path", path)]) {
        Ok(stat) if stat.get("kind").and_then(Value::as_str) == Some("dir") => {
            Ok(join_remote(path, name))
        }
        Ok(_) => Ok(path.to_owned()),
        Err(error) if error.api_code() == Some("not_found") => Ok(path.to_owned()),
        Err(error) => Err(error.into()),
    }
}

fn download(api: &Api, id: &str, path: &str, local: &Location, shown: &str) -> Result<()> {
    let stat = api.get_json(&sandbox_path(id, "/files/stat"), &[("path", path)])?;
    if stat.get("kind").and_then(Value::as_str) == Some("dir") {
        bail!("{id}:{path} is a directory; cp copies one file");
    }
    let files = sandbox_path(id, "/files");
    let Location::Local(local) = local else {
        let mut body = api.get_stream(&files, &[("path", path)])?;
        let mut out = std::io::stdout().lock();
        std::io::copy(&mut body, &mut out)?;
        out.flush()?;
        return Ok(());
    };
    let name = match stat.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() && !name.contains('/') => name,
        _ => remote_name(path),
    };
    let target = if shown.ends_with('/') || local.is_dir() {
        local.join(name)
    } else {
        local.clone()
    };
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // The sandbox file's permission bits, less our umask (the kernel applies
    // it at creation), as `cp` does for a new file.
    let mode = mode_bits(stat.get("mode")).unwrap_or(0o644) & 0o777;
    let mut part = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".part")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    let mut body = api.get_stream(&files, &[("path", path)])?;
    std::io::copy(&mut body, part.as_file_mut())
        .with_context(|| format!("cannot copy {id}:{path} to {}", target.display()))?;
    part.persist(&target)
        .with_context(|| format!("cannot write {}", target.display()))?;
    Ok(())
}

/// Permission bits from a stat's `mode`: a number, or an octal string.
fn mode_bits(value: Option<&Value>) -> Option<u32> {
    let bits = match value? {
        Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
        Value::String(text) => u32::from_str_radix(text.trim_start_matches("0o"), 8).ok()?,
        _ => return None,
    };
    Some(bits & 0o7777)
}

/// A stat's modification time in Unix milliseconds: `mtime` as RFC 3339 or
/// a number (seconds, milliseconds or nanoseconds, told apart by size), or
/// `mtime_ns`.
fn mtime_millis(stat: &Value) -> Option<i64> {
    if let Some(ns) = stat.get("mtime_ns").and_then(Value::as_i64) {
        return Some(ns.div_euclid(1_000_000));
    }
    match stat.get("mtime")? {
        Value::String(text) => parse_rfc3339(text),
        Value::Number(n) => {
            let n = n.as_i64()?;
            Some(match n.unsigned_abs() {
                0..100_000_000_000 => n * 1000,
                100_000_000_000..100_000_000_000_000 => n,
                100_000_000_000_000..100_000_000_000_000_000 => n / 1000,
                _ => n / 1_000_000,
            })
        }
        _ => None,
    }
}

fn mode_cell(stat: &Value) -> String {
    mode_bits(stat.get("mode")).map_or_else(|| "-".to_owned(), |bits| format!("{bits:04o}"))
}

fn mtime_cell(stat: &Value) -> String {
    mtime_millis(stat).map_or_else(|| "-".to_owned(), format_utc)
}

/// `PATH`, or `PATH -> TARGET` for a symlink.
fn path_cell(stat: &Value) -> String {
    let path = cell(stat.get("path"));
    match stat.get("symlink_target").and_then(Value::as_str) {
        Some(target) => format!("{path} -> {target}"),
        None => path,
    }
}

fn ls_header() -> Table {
    Table::new(&["KIND", "MODE", "SIZE", "MTIME", "PATH"])
}

fn ls_row(entry: &Value) -> Vec<String> {
    vec![
        cell(entry.get("kind")),
        mode_cell(entry),
        cell(entry.get("size")),
        mtime_cell(entry),
        path_cell(entry),
    ]
}

fn stat_text(stat: &Value) -> String {
    let mut lines = vec![
        ("path", cell(stat.get("path"))),
        ("kind", cell(stat.get("kind"))),
        ("size", cell(stat.get("size"))),
        ("mode", mode_cell(stat)),
        ("uid", cell(stat.get("uid"))),
        ("gid", cell(stat.get("gid"))),
        ("mtime", format!("{} UTC", mtime_cell(stat))),
    ];
    if let Some(target) = stat.get("symlink_target").and_then(Value::as_str) {
        lines.push(("target", target.to_owned()));
    }
    lines
        .iter()
        .map(|(key, value)| format!("{:<7}{value}\n", format!("{key}:")))
        .collect()
}

/// A watch event as `KIND PATH`.
fn watch_line(event: &Value) -> String {
    format!("{} {}", cell(event.get("type")), cell(event.get("path")))
}

/// Entries of a listing's pages the CLI asks for at once (the API's most).
const LIST_PAGE: &str = "10000";

/// Hands every page of the listing of `path` to `each`, in order.
fn list_pages(
    api: &Api,
    id: &str,
    path: &str,
    depth: u32,
    mut each: impl FnMut(Vec<Value>) -> Result<()>,
) -> Result<()> {
    let depth = depth.to_string();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("path", path), ("depth", &depth), ("limit", LIST_PAGE)];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor));
        }
        let mut page = api.get_json(&sandbox_path(id, "/files/list"), &query)?;
        let next = match page.get("next_cursor") {
            Some(Value::String(next)) if !next.is_empty() => Some(next.clone()),
            _ => None,
        };
        if let Some(Value::Array(entries)) = page.get_mut("entries").map(Value::take) {
            each(entries)?;
        }
        // A cursor that does not move would never end.
        if next.is_none() || next == cursor {
            return Ok(());
        }
        cursor = next;
    }
}

/// `airlock files ID ...`.
pub fn files(args: &FilesArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let id = &args.id;
    let mut out = std::io::stdout().lock();
    match &args.op {
        FilesOp::Ls { path, depth, json } => {
            // Pages come sorted by path: the JSON is written as they come,
            // the table (which needs every width) keeps only its cells.
            if *json {
                write!(out, "{{\"entries\":[")?;
                let mut first = true;
                list_pages(&api, id, path, *depth, |entries| {
                    for entry in entries {
                        if !first {
                            write!(out, ",")?;
                        }
                        first = false;
                        write!(out, "{entry}")?;
                    }
                    Ok(())
                })?;
                writeln!(out, "]}}")?;
            } else {
                let mut table = ls_header();
                list_pages(&api, id, path, *depth, |entries| {
                    entries.iter().for_each(|entry| table.push(ls_row(entry)));
                    Ok(())
                })?;
                out.write_all(table.render().as_bytes())?;
            }
        }
        FilesOp::Stat { path, json } => {
            let stat = api.get_json(&sandbox_path(id, "/files/stat"), &[("path", path)])?;
            if *json {
                writeln!(out, "{stat}")?;
            } else {
                out.write_all(stat_text(&stat).as_bytes())?;
            }
        }
        FilesOp::Mkdir { path, parents } => {
            api.post_json(
                &sandbox_path(id, "/files/mkdir"),
                &json!({ "path": path, "parents": parents }),
            )?;
        }
        FilesOp::Mv { from, to } => {
            api.post_json(
                &sandbox_path(id, "/files/move"),
                &json!({ "from": from, "to": to }),
            )?;
        }
        FilesOp::Rm { path, recursive } => {
            let mut query = vec![("path", path.as_str())];
            if *recursive {
                query.push(("recursive", "true"));
            }
            api.delete(&sandbox_path(id, "/files"), &query)?;
        }
        FilesOp::Cat { path } => {
            let mut body = api.get_stream(&sandbox_path(id, "/files"), &[("path", path)])?;
            std::io::copy(&mut body, &mut out)?;
        }
        FilesOp::Watch {
            path,
            recursive,
            json,
        } => {
            let mut query = vec![("path", path.as_str())];
            if *recursive {
                query.push(("recursive", "true"));
            }
            let body = api.get_stream(&sandbox_path(id, "/files/watch"), &query)?;
            watch(BufReader::new(body), &mut out, *json)?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Copies watch events to `out` as they come, one line each.
fn watch(mut events: impl BufRead, out: &mut dyn Write, json: bool) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if events
            .read_line(&mut line)
            .context("the watch stream broke off")?
            == 0
        {
            return Ok(());
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if json {
            writeln!(out, "{text}")?;
        } else {
            let event: Value = serde_json::from_str(text).with_context(|| {
                format!("the watch stream sent a line that is not JSON: {text}")
            })?;
            writeln!(out, "{}", watch_line(&event))?;
        }
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{respond, FakeServer};
    use super::*;

    #[test]
    fn cp_locations() {
        let sandbox = |id: &str, path: &str| Location::Sandbox {
            id: id.into(),
            path: path.into(),
        };
        let local = |path: &str| Location::Local(PathBuf::from(path));
        assert_eq!(parse_location("-").unwrap(), Location::Stdio);
        assert_eq!(
            parse_location("sbx-1:/a/b").unwrap(),
            sandbox("sbx-1", "/a/b")
        );
        assert_eq!(parse_location("sbx-1:/").unwrap(), sandbox("sbx-1", "/"));
        assert_eq!(parse_location("file.txt").unwrap(), local("file.txt"));
        assert_eq!(parse_location("./a:b").unwrap(), local("./a:b"));
        assert_eq!(parse_location("/tmp/a:b").unwrap(), local("/tmp/a:b"));
        assert_eq!(parse_location("dir/a:b").unwrap(), local("dir/a:b"));
        assert_eq!(parse_location(":/x").unwrap(), local(":/x"));
        assert!(matches!(
            parse_location("sbx-1:relative"),
            Err(ClientError::Usage(_))
        ));
        assert!(matches!(
            parse_location("sbx-1:"),
            Err(ClientError::Usage(_))
        ));
    }

    #[test]
    fn remote_names() {
        assert_eq!(join_remote("/tmp/", "a"), "/tmp/a");
        assert_eq!(join_remote("/", "a"), "/a");
        assert_eq!(remote_name("/tmp/a.txt"), "a.txt");
        assert_eq!(remote_name("/tmp/dir/"), "dir");
    }

    #[test]
    fn modes_and_mtimes() {
        assert_eq!(mode_bits(Some(&json!(420))), Some(0o644));
        assert_eq!(mode_bits(Some(&json!(0o100755))), Some(0o755));
        assert_eq!(mode_bits(Some(&json!("644"))), Some(0o644));
        assert_eq!(mode_bits(Some(&json!("0o750"))), Some(0o750));
        assert_eq!(mode_bits(Some(&json!("rw"))), None);
        let at = 1_700_000_000_000i64;
        assert_eq!(mtime_millis(&json!({"mtime": 1_700_000_000})), Some(at));
        assert_eq!(mtime_millis(&json!({"mtime": at})), Some(at));
        assert_eq!(mtime_millis(&json!({"mtime": at * 1_000_000})), Some(at));
        assert_eq!(mtime_millis(&json!({"mtime_ns": at * 1_000_000})), Some(at));
        assert_eq!(
            mtime_millis(&json!({"mtime": "2023-11-14T22:13:20Z"})),
            Some(at)
        );
    }

    #[test]
    fn ls_rows_show_links() {
        let entries = [
            json!({"path": "/h/a", "name": "a", "kind": "symlink", "size": 1, "mode": 511,
                   "mtime": "2023-11-14T22:13:20Z", "symlink_target": "z"}),
            json!({"path": "/h/z", "name": "z", "kind": "file", "size": 5, "mode": 420,
                   "mtime": "2023-11-14T22:13:20Z", "symlink_target": null}),
        ];
        let mut table = ls_header();
        entries.iter().for_each(|entry| table.push(ls_row(entry)));
        assert_eq!(
            table.render(),
            "KIND     MODE  SIZE  MTIME                PATH\n\
             symlink  0777  1     2023-11-14 22:13:20  /h/a -> z\n\
             file     0644  5     2023-11-14 22:13:20  /h/z\n"
        );
    }

    #[test]
    fn watch_lines() {
        let stream = "{\"type\":\"create\",\"path\":\"/tmp/a\"}\n\n{\"type\":\"write\",\"path\":\"/tmp/a\"}\n";
        let mut out = Vec::new();
        watch(stream.as_bytes(), &mut out, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "create /tmp/a\nwrite /tmp/a\n"
        );
        let mut out = Vec::new();
        watch(stream.as_bytes(), &mut out, true).unwrap();
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 2);
    }

    #[test]
    fn upload_streams_the_file_into_a_remote_directory() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("data.bin");
        std::fs::write(&local, vec![7u8; 100_000]).unwrap();
        std::fs::set_permissions(&local, Permissions::from_mode(0o750)).unwrap();
        let server = FakeServer::start(2, |request, stream| {
            if request.target.contains("/files/stat") {
                respond(
                    stream,
                    200,
                    "application/json",
                    br#"{"path":"/tmp","name":"tmp","kind":"dir","size":0,"mode":1023}"#,
                );
            } else {
                let answer = json!({"path": "/tmp/data.bin", "bytes": request.body.len()});
                respond(
                    stream,
                    201,
                    "application/json",
                    answer.to_string().as_bytes(),
                );
            }
        });
        let api = Api::new(&server.url, None).unwrap();
        upload(&api, &Location::Local(local), "sbx-1", "/tmp").unwrap();
        let requests = server.finish();
        assert_eq!(
            requests[0].target,
            "/v1/sandboxes/sbx-1/files/stat?path=%2Ftmp"
        );
        assert_eq!(requests[1].method, "PUT");
        assert_eq!(
            requests[1].target,
            "/v1/sandboxes/sbx-1/files?path=%2Ftmp%2Fdata.bin&mode=750"
        );
        assert_eq!(requests[1].header("content-length"), Some("100000"));
        assert_eq!(requests[1].body, vec![7u8; 100_000]);
    }

    #[test]
    fn download_lands_whole_under_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::start(2, |request, stream| {
            if request.target.contains("/files/stat") {
                respond(
                    stream,
                    200,
                    "application/json",
                    br#"{"path":"/out/r.txt","name":"r.txt","kind":"file","size":5,"mode":493}"#,
                );
            } else {
                respond(stream, 200, "application/octet-stream", b"hello");
            }
        });
        let api = Api::new(&server.url, None).unwrap();
        let local = Location::Local(dir.path().to_path_buf());
        download(&api, "sbx-1", "/out/r.txt", &local, "dir").unwrap();
        let target = dir.path().join("r.txt");
        assert_eq!(std::fs::read(&target).unwrap(), b"hello");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o100, 0o100, "executable bit kept: {mode:o}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left behind");
        server.finish();
    }

    #[test]
    fn a_failed_download_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::start(2, |request, stream| {
            if request.target.contains("/files/stat") {
                respond(
                    stream,
                    200,
                    "application/json",
                    br#"{"path":"/r","name":"r","kind":"file","size":5,"mode":420}"#,
                );
            } else {
                // Promise 100 bytes, send 5, hang up.
                use std::io::Write as _;
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
                    .unwrap();
            }
        });
        let api = Api::new(&server.url, None).unwrap();
        let target = dir.path().join("r");
        let result = download(&api, "sbx-1", "/r", &Location::Local(target.clone()), "r");
        assert!(result.is_err());
        server.finish();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

//! `airlock template import | pull | bootstrap | build | ls | inspect | rm |
//! sbom | tier` and `airlock gc`:
//! the daemon's templates and its layer store.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::io::{BufRead, BufReader, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;

use super::format::{
    format_size, format_utc, parse_rfc3339, percent_encode as percent_path, Table,
};
use super::http::Connection;

/// `airlock template ...`.
#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Import an image archive (`docker save` output, or an OCI image
    /// layout packed in a tar) as a template.
    Import(ImportArgs),
    /// Pull an image from a registry the daemon is configured to pull from
    /// (`airlock serve --registry`) as a template.
    Pull(PullArgs),
    /// Build a Debian system from this machine's apt sources as a
    /// template: the `base` template (Python, Node.js, git, curl, sudo,
    /// user `user`), or NAME with the packages given.
    Bootstrap(BootstrapArgs),
    /// Build a template from a Dockerfile: FROM a template or an image,
    /// each RUN in a sandbox of the build, each RUN and COPY a cached
    /// layer.
    Build(BuildArgs),
    /// List templates.
    Ls(LsArgs),
    /// Show one template: its digest, layers and start configuration.
    Inspect(InspectArgs),
    /// Remove a template (its layers go once nothing uses them).
    Rm(RmArgs),
    /// Print a template's software bill of materials (CycloneDX JSON: the
    /// dpkg, apk, Python and npm packages its layers hold).
    Sbom(SbomArgs),
    /// Set the tier a template's sandboxes run on when a create names
    /// none (`--clear`: the daemon's default again).
    Tier(TierArgs),
}

/// `--tier` of the commands that make a template.
#[derive(Args)]
pub struct NewTierArg {
    /// The tier its sandboxes run on when a create names none (process,
    /// oci, gvisor), recorded with it [default: the one a template of
    /// that name had, else the daemon's].
    #[arg(long, value_name = "TIER")]
    tier: Option<String>,
}

#[derive(Args)]
pub struct TierArgs {
    name: String,
    /// process, oci or gvisor (`airlock tiers` tells which run here).
    #[arg(required_unless_present = "clear", conflicts_with = "clear")]
    tier: Option<String>,
    /// Forget the template's own tier.
    #[arg(long)]
    clear: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct ImportArgs {
    /// The archive.
    file: PathBuf,
    /// The template's name [default: the archive's file name without
    /// `.tar`].
    #[arg(long, short = 't', value_name = "NAME")]
    name: Option<String>,
    /// Which image of an archive holding several (a tag it lists).
    #[arg(long, value_name = "TAG")]
    image: Option<String>,
    /// Print the progress events and the template as JSON lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    new_tier: NewTierArg,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct PullArgs {
    /// `HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]`.
    image: String,
    /// The template's name [default: the repository's last component, and
    /// the tag unless it is `latest`].
    #[arg(long, short = 't', value_name = "NAME")]
    name: Option<String>,
    /// Print the progress events and the template as JSON lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    new_tier: NewTierArg,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct BootstrapArgs {
    /// The template's name.
    #[arg(default_value = "base")]
    name: String,
    /// A Debian package beyond the essential ones (repeatable); the base
    /// template's packages when none is given.
    #[arg(long = "package", short = 'p', value_name = "PACKAGE")]
    packages: Vec<String>,
    /// Build here, without a daemon, into an OCI image archive at FILE
    /// (tagged NAME) that `airlock template import` takes: build once,
    /// import on many machines.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the progress events and the template as JSON lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    new_tier: NewTierArg,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct BuildArgs {
    /// The build context: the directory COPY sources are relative to
    /// (its `.dockerignore` leaves files out).
    context: PathBuf,
    /// The Dockerfile [default: CONTEXT/Dockerfile].
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// The template's name.
    #[arg(long = "tag", short = 't', value_name = "NAME")]
    name: String,
    /// An `ARG` value (repeatable).
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    build_args: Vec<String>,
    /// Run every step, even those the build cache holds.
    #[arg(long)]
    no_cache: bool,
    /// Print the build's events and the template as JSON lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    new_tier: NewTierArg,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct LsArgs {
    /// Print the daemon's template views as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct InspectArgs {
    name: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct SbomArgs {
    name: String,
    /// Write the document to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    pub(super) conn: Connection,
}

#[derive(Args)]
pub struct RmArgs {
    #[arg(required = true)]
    names: Vec<String>,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// `airlock gc`.
#[derive(Args)]
pub struct GcArgs {
    /// Empty the build cache too (by default only entries unused for
    /// longer than the daemon's --build-cache-ttl go), so the layers only
    /// it holds are removed.
    #[arg(long)]
    build_cache: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

pub fn main(command: &TemplateCommand) -> Result<ExitCode> {
    match command {
        TemplateCommand::Import(args) => import(args),
        TemplateCommand::Pull(args) => pull(args),
        TemplateCommand::Bootstrap(args) if args.output.is_some() => export(args),
        TemplateCommand::Bootstrap(args) => {
            let api = args.conn.api()?;
            let packages = (!args.packages.is_empty()).then_some(args.packages.as_slice());
            let tier = args.new_tier.tier.as_deref();
            let template = bootstrap(&api, &args.name, packages, tier, args.json)?;
            print_template(&template, args.json);
            Ok(ExitCode::SUCCESS)
        }
        TemplateCommand::Build(args) => build(args),
        TemplateCommand::Ls(args) => ls(args),
        TemplateCommand::Inspect(args) => inspect(args),
        TemplateCommand::Rm(args) => rm(args),
        TemplateCommand::Sbom(args) => sbom(args),
        TemplateCommand::Tier(args) => {
            let api = args.conn.api()?;
            let template = set_tier(&api, &args.name, args.tier.as_deref())?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&template)?);
            } else {
                println!(
                    "{}: {}",
                    args.name,
                    template["tier"].as_str().unwrap_or("the daemon's default")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Sets (or with `None`, clears) template `name`'s tier → its view.
fn set_tier(api: &super::http::Api, name: &str, tier: Option<&str>) -> Result<Value> {
    Ok(api.patch_json(
        &format!("/v1/templates/{}", percent_path(name)),
        &serde_json::json!({ "tier": tier }),
    )?)
}

fn import(args: &ImportArgs) -> Result<ExitCode> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .file
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".tar").to_owned())
            .filter(|n| !n.is_empty())
            .context("name the template with --name")?,
    };
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("cannot open {}", args.file.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let api = args.conn.api()?;
    let people = !args.json && std::io::stderr().is_terminal();
    let bar = if people {
        let bar = ProgressBar::new(size);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:20} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message("uploading");
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut query = Vec::new();
    if let Some(image) = &args.image {
        query.push(("image", image.as_str()));
    }
    if let Some(tier) = &args.new_tier.tier {
        query.push(("tier", tier.as_str()));
    }
    let body = bar.wrap_read(file);
    let answer = api.post_stream(
        &format!("/v1/templates/{}/import", percent_path(&name)),
        &query,
        ureq::SendBody::from_owned_reader(body),
    )?;
    let template = follow(answer, &bar, args.json, "import")?;
    print_template(&template, args.json);
    Ok(ExitCode::SUCCESS)
}

fn pull(args: &PullArgs) -> Result<ExitCode> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => default_name(&args.image).context("name the template with --name")?,
    };
    let api = args.conn.api()?;
    let bar = spinner(!args.json, format!("resolving {}", args.image));
    let answer = api
        .post_json_response(
            &format!("/v1/templates/{}/pull", percent_path(&name)),
            &serde_json::json!({ "image": args.image, "tier": args.new_tier.tier }),
        )?
        .into_body()
        .into_reader();
    let template = follow(answer, &bar, args.json, "pull")?;
    print_template(&template, args.json);
    Ok(ExitCode::SUCCESS)
}

fn build(args: &BuildArgs) -> Result<ExitCode> {
    let mut build_args = serde_json::Map::new();
    for arg in &args.build_args {
        let (name, value) = arg
            .split_once('=')
            .with_context(|| format!("--build-arg {arg}: write NAME=VALUE"))?;
        build_args.insert(name.to_owned(), Value::String(value.to_owned()));
    }
    let context = args.context.clone();
    if !context.is_dir() {
        bail!("{} is not a directory", context.display());
    }
    // A Dockerfile inside the context is sent where it is; one outside
    // travels under a name the daemon removes once read.
    let default = context.join("Dockerfile");
    let file = args.file.clone().unwrap_or(default);
    let inside = std::fs::canonicalize(&file)
        .ok()
        .zip(std::fs::canonicalize(&context).ok())
        .and_then(|(file, dir)| {
            file.strip_prefix(&dir)
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        });
    let (dockerfile, extra) = match inside {
        Some(path) => (path, None),
        None => {
            let text =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            (".airlock-dockerfile".to_owned(), Some(text))
        }
    };
    let ignore = match std::fs::read_to_string(context.join(".dockerignore")) {
        Ok(text) => airlock_build::context::pattern::Ignore::parse(&text)
            .map_err(|e| anyhow::anyhow!(".dockerignore: {e}"))?,
        Err(_) => airlock_build::context::pattern::Ignore::parse("")
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    let (reader, writer) = std::io::pipe().context("cannot make a pipe")?;
    let keep = dockerfile.clone();
    let packing = std::thread::spawn(move || pack_context(&context, &ignore, &keep, extra, writer));
    let api = args.conn.api()?;
    let bar = spinner(
        !args.json,
        format!("sending the build context of {}", args.name),
    );
    let mut query = vec![("dockerfile", dockerfile)];
    if !build_args.is_empty() {
        query.push(("build_args", Value::Object(build_args).to_string()));
    }
    if args.no_cache {
        query.push(("no_cache", "true".to_owned()));
    }
    if let Some(tier) = &args.new_tier.tier {
        query.push(("tier", tier.clone()));
    }
    let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = api.post_stream(
        &format!("/v1/templates/{}/build", percent_path(&args.name)),
        &query,
        ureq::SendBody::from_owned_reader(reader),
    );
    match packing.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("cannot pack the build context")),
        Err(_) => bail!("packing the build context failed"),
    }
    let template = follow(answer?, &bar, args.json, "build")?;
    print_template(&template, args.json);
    Ok(ExitCode::SUCCESS)
}

/// Writes the build context `dir` as a tar to `out`: what `.dockerignore`
/// excludes left out (but the Dockerfile `keep` and `.dockerignore`
/// itself), symlinks as symlinks, and `extra` as `.airlock-dockerfile`.
fn pack_context(
    dir: &std::path::Path,
    ignore: &airlock_build::context::pattern::Ignore,
    keep: &str,
    extra: Option<Vec<u8>>,
    out: impl std::io::Write,
) -> Result<()> {
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let path = dir.join(&relative);
        let mut names: Vec<_> = std::fs::read_dir(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for name in names {
            let entry = relative.join(&name);
            let shown = entry.to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(dir.join(&entry))
                .with_context(|| format!("cannot read {}", entry.display()))?;
            let kept = shown == keep || shown == ".dockerignore";
            if meta.is_dir() {
                if !ignore.is_excluded(shown.as_bytes())
                    || ignore.may_include_beneath(shown.as_bytes())
                {
                    tar.append_dir(&entry, dir.join(&entry))?;
                    pending.push(entry);
                }
            } else if (kept || !ignore.is_excluded(shown.as_bytes()))
                && (meta.is_file() || meta.file_type().is_symlink())
            {
                tar.append_path_with_name(dir.join(&entry), &entry)?;
            }
        }
    }
    if let Some(text) = extra {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, ".airlock-dockerfile", text.as_slice())?;
    }
    tar.into_inner()?.flush()?;
    Ok(())
}

/// A spinner showing `message` on a terminal when `shown`, else a hidden
/// bar.
fn spinner(shown: bool, message: String) -> ProgressBar {
    if !shown || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// Builds template `name` from the daemon's apt sources with a progress
/// spinner (or JSON lines), to the template view.
pub fn bootstrap(
    api: &super::http::Api,
    name: &str,
    packages: Option<&[String]>,
    tier: Option<&str>,
    json: bool,
) -> Result<Value> {
    let bar = spinner(
        !json,
        format!("building template {name} from the apt sources"),
    );
    let mut body = serde_json::json!({});
    if let Some(packages) = packages {
        body["packages"] = serde_json::json!(packages);
    }
    if let Some(tier) = tier {
        body["tier"] = serde_json::json!(tier);
    }
    let answer = api
        .post_json_response(
            &format!("/v1/templates/{}/bootstrap", percent_path(name)),
            &body,
        )?
        .into_body()
        .into_reader();
    follow(answer, &bar, json, "bootstrap")
}

/// `template bootstrap --output FILE`: the build here, into an archive.
fn export(args: &BootstrapArgs) -> Result<ExitCode> {
    use airlock_layers::bootstrap::{BootstrapProgress, Recipe};
    let Some(output) = &args.output else {
        bail!("--output names no file");
    };
    if args.new_tier.tier.is_some() {
        bail!("--tier is recorded with a template in a daemon; an archive (--output) carries none");
    }
    let mut recipe = Recipe::default();
    if !args.packages.is_empty() {
        recipe.packages = args.packages.clone();
    }
    let bar = spinner(!args.json, format!("building {}", output.display()));
    let json = args.json;
    let mut progress = |p: BootstrapProgress| match p {
        BootstrapProgress::Step(message) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"type": "step", "message": message})
                );
            }
            bar.set_message(message);
        }
        BootstrapProgress::Unpacking { bytes } => {
            bar.set_message(format!("writing the system ({})", format_size(bytes)))
        }
    };
    airlock_layers::bootstrap::export(&recipe, output, &args.name, &mut progress)
        .map_err(|e| anyhow::anyhow!(airlock::error_chain(&e)))?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::json!({"type": "done", "archive": output}));
    } else {
        println!("{}", output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the `base` template if the daemon has none (its first use),
/// telling the user why they wait.
pub fn ensure_base(api: &super::http::Api) -> Result<()> {
    match api.get_json("/v1/templates/base", &[]) {
        Ok(_) => Ok(()),
        Err(e) if e.api_code() == Some("not_found") => {
            eprintln!("airlock: building the base template (first use; it is kept for the next)");
            bootstrap(api, "base", None, None, false).map(drop)
        }
        Err(e) => Err(e.into()),
    }
}

/// What `template pull` names a template by default: the repository's
/// last component, with the tag unless it is `latest` (the daemon checks
/// the reference itself).
fn default_name(image: &str) -> Option<String> {
    let bare = image.split('@').next()?;
    let last = bare.rsplit('/').next()?;
    let name = match last.split_once(':') {
        Some((repo, "latest")) => repo.to_owned(),
        _ => last.to_owned(),
    };
    (!name.is_empty()).then_some(name)
}

/// Reads an import's or a pull's NDJSON events, showing them on `bar`
/// (and printing them with `json`), to the template it ends with.
fn follow(answer: impl std::io::Read, bar: &ProgressBar, json: bool, what: &str) -> Result<Value> {
    let bytes_style =
        ProgressStyle::with_template("{msg:28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    let spinner_style = ProgressStyle::with_template("{spinner} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    // Bytes each layer of a pull has brought so far.
    let mut arrived: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut template = None;
    for line in BufReader::new(answer).lines() {
        let line = line.context("the daemon's answer was cut off")?;
        if line.trim().is_empty() {
            continue;
        }
        if json {
            println!("{line}");
        }
        let event: Value =
            serde_json::from_str(&line).context("the daemon's answer is not JSON")?;
        let count = |key: &str| event[key].as_u64().unwrap_or(0);
        match event["type"].as_str() {
            Some("received") => {
                bar.set_style(spinner_style.clone());
                bar.set_message("received; reading the archive");
                bar.enable_steady_tick(std::time::Duration::from_millis(120));
            }
            Some("resolved") => {
                bar.set_style(bytes_style.clone());
                bar.set_length(count("bytes"));
                bar.set_position(0);
                bar.set_message(format!("pulling {} layers", count("layers")));
            }
            Some("downloading") => {
                arrived.insert(count("layer"), count("bytes"));
                bar.set_position(arrived.values().sum());
                bar.set_message(format!("layer {}/{}", count("layer"), count("of")));
            }
            Some("unpacked") => {
                bar.set_message(format!("layer {}/{} unpacked", count("layer"), count("of")))
            }
            Some("unpacking") => bar.set_message(format!(
                "unpacking layer {}/{} ({})",
                count("layer"),
                count("of"),
                format_size(count("bytes"))
            )),
            Some("step") if event["index"].is_u64() => {
                let cached = if event["cached"].as_bool() == Some(true) {
                    " (cached)"
                } else {
                    ""
                };
                let line = format!(
                    "[{}/{}] {}{cached}",
                    count("index"),
                    count("total"),
                    event["instruction"].as_str().unwrap_or_default()
                );
                if json {
                } else if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(&line);
                }
                bar.set_message(line);
            }
            Some("step") => bar.set_message(event["message"].as_str().unwrap_or("").to_owned()),
            Some("written") => bar.set_message(format!(
                "unpacking the system ({})",
                format_size(count("bytes"))
            )),
            Some("cached") => bar.set_message(format!(
                "layer {}/{} is in the store already",
                count("layer"),
                count("of")
            )),
            Some("warning") => {
                let message = event["message"].as_str().unwrap_or_default();
                if !json {
                    bar.suspend(|| eprintln!("warning: {message}"));
                }
            }
            Some("base") => {
                bar.set_message(format!("on {}", event["base"].as_str().unwrap_or_default()))
            }
            Some("output") if !json => {
                let text = event["text"].as_str().unwrap_or_default();
                if bar.is_hidden() {
                    eprint!("{text}");
                } else {
                    for line in text.lines() {
                        bar.println(format!("  {line}"));
                    }
                }
            }
            Some("layer") => bar.set_message(format!(
                "step {}: layer of {}",
                count("index"),
                format_size(count("bytes"))
            )),
            Some("done") => template = Some(event["template"].clone()),
            Some("error") => {
                bar.finish_and_clear();
                bail!(
                    "the {what} failed: {}",
                    event["message"].as_str().unwrap_or("(no message)")
                );
            }
            _ => {}
        }
    }
    bar.finish_and_clear();
    template.with_context(|| format!("the daemon's answer ended before the {what} did"))
}

fn print_template(template: &Value, json: bool) {
    if !json {
        println!(
            "{} {} ({} layers, {})",
            template["name"].as_str().unwrap_or_default(),
            template["digest"].as_str().unwrap_or_default(),
            template["layers"].as_array().map_or(0, Vec::len),
            format_size(template["bytes"].as_u64().unwrap_or(0))
        );
    }
}

fn ls(args: &LsArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let answer = api.get_json("/v1/templates", &[])?;
    let items = answer["items"].as_array().cloned().unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Array(items))?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&[
        "NAME", "DIGEST", "TIER", "LAYERS", "SIZE", "CREATED", "SOURCE",
    ]);
    for t in &items {
        let digest = t["digest"].as_str().unwrap_or_default();
        table.push(vec![
            t["name"].as_str().unwrap_or_default().to_owned(),
            digest.chars().take(19).collect(),
            t["tier"].as_str().unwrap_or("-").to_owned(),
            t["layers"].as_array().map_or(0, Vec::len).to_string(),
            format_size(t["bytes"].as_u64().unwrap_or(0)),
            t["created_at"]
                .as_str()
                .and_then(parse_rfc3339)
                .map_or_else(String::new, format_utc),
            t["source"].as_str().unwrap_or_default().to_owned(),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

fn inspect(args: &InspectArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let t = api.get_json(&format!("/v1/templates/{}", percent_path(&args.name)), &[])?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("name:     {}", t["name"].as_str().unwrap_or_default());
    println!("digest:   {}", t["digest"].as_str().unwrap_or_default());
    println!("source:   {}", t["source"].as_str().unwrap_or_default());
    println!(
        "tier:     {}",
        t["tier"].as_str().unwrap_or("(the daemon's default)")
    );
    println!("created:  {}", t["created_at"].as_str().unwrap_or_default());
    println!(
        "size:     {}",
        format_size(t["bytes"].as_u64().unwrap_or(0))
    );
    let config = &t["config"];
    for (label, key) in [("workdir", "workdir"), ("user", "user")] {
        if let Some(value) = config[key].as_str() {
            println!("{label}:  {value}");
        }
    }
    for (label, key) in [("entrypoint", "entrypoint"), ("cmd", "cmd"), ("env", "env")] {
        if let Some(values) = config[key].as_array().filter(|v| !v.is_empty()) {
            let words: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
            println!("{label}: {}", words.join(" "));
        }
    }
    println!("layers (bottom first):");
    for layer in t["layers"].as_array().into_iter().flatten() {
        println!(
            "  {}  {}",
            layer["diff_id"].as_str().unwrap_or_default(),
            format_size(layer["bytes"].as_u64().unwrap_or(0))
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn sbom(args: &SbomArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let document = api.get_json(
        &format!("/v1/templates/{}/sbom", percent_path(&args.name)),
        &[],
    )?;
    let text = serde_json::to_string_pretty(&document)?;
    match &args.output {
        Some(path) => std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn rm(args: &RmArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    for name in &args.names {
        api.delete(&format!("/v1/templates/{}", percent_path(name)), &[])?;
        println!("{name}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn gc(args: &GcArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let path = if args.build_cache {
        "/v1/gc?build_cache=true"
    } else {
        "/v1/gc"
    };
    let answer = api.post_json(path, &Value::Null)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    let layers = answer["layers"].as_array().map_or(0, Vec::len);
    println!(
        "removed {layers} unreferenced layers, {} abandoned imports, {} strays, {} build cache entries, {} stray snapshot archives",
        answer["abandoned"], answer["strays"], answer["build_steps"], answer["archives"]
    );
    Ok(ExitCode::SUCCESS)
}

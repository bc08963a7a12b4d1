//! The Dockerfile parser: every instruction and form it takes, Docker's
//! substitution and ARG scoping, and a line-numbered refusal of everything
//! it does not build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_build::dockerfile::{parse, parse_over, DockerfileError, Parsed, Warning};
use airlock_build::spec::{RunConfig, MAX_STEPS};
use airlock_build::{Base, Command, Step};
use std::collections::BTreeMap;

fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ok(text: &str) -> Parsed {
    ok_with(text, &[])
}

fn ok_with(text: &str, build_args: &[(&str, &str)]) -> Parsed {
    match parse(text, &args(build_args)) {
        Ok(parsed) => {
            parsed.spec.validate().expect("a parsed spec validates");
            parsed
        }
        Err(e) => panic!("{text:?} did not parse: {e}"),
    }
}

fn err(text: &str) -> DockerfileError {
    match parse(text, &BTreeMap::new()) {
        Ok(parsed) => panic!("{text:?} parsed: {parsed:?}"),
        Err(e) => e,
    }
}

fn shell(s: &str) -> Command {
    Command::Shell(s.to_owned())
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn run_env(step: &Step) -> &BTreeMap<String, String> {
    match step {
        Step::Run { env, .. } => env,
        other => panic!("not a RUN: {other:?}"),
    }
}

fn env_step(step: &Step) -> Vec<(&str, &str)> {
    match step {
        Step::Env { vars } => vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        other => panic!("not an ENV: {other:?}"),
    }
}

#[test]
fn a_whole_dockerfile() {
    let parsed = ok(r#"# syntax=docker/dockerfile:1
# a comment
from python:3.12-slim
ENV PIP_NO_CACHE_DIR=1 APP="/srv/my app"
WORKDIR /srv
RUN pip install flask
COPY --chown=1000:1000 --chmod=0644 requirements.txt app/*.py ./
ADD static/ /srv/static/
workdir app
USER 1000
EXPOSE 8080
LABEL a=b
CMD ["python3", "app.py"]
"#);
    let spec = parsed.spec;
    assert_eq!(
        spec.from,
        Base::Image {
            reference: "python:3.12-slim".into()
        }
    );
    assert_eq!(
        spec.steps,
        vec![
            Step::Env {
                vars: vec![
                    ("PIP_NO_CACHE_DIR".into(), "1".into()),
                    ("APP".into(), "/srv/my app".into())
                ]
            },
            Step::Workdir {
                path: "/srv".into()
            },
            Step::Run {
                command: shell("pip install flask"),
                user: None,
                env: BTreeMap::new()
            },
            Step::Copy {
                sources: strings(&["requirements.txt", "app/*.py"]),
                dest: "/srv/".into(),
                chown: Some("1000:1000".into()),
                chmod: Some(0o644)
            },
            Step::Copy {
                sources: strings(&["static/"]),
                dest: "/srv/static/".into(),
                chown: None,
                chmod: None
            },
            Step::Workdir {
                path: "/srv/app".into()
            },
            Step::User {
                user: "1000".into()
            },
        ]
    );
    assert_eq!(spec.start.cmd, Some(strings(&["python3", "app.py"])));
    assert_eq!(spec.start.entrypoint, None);
    assert_eq!(spec.start.workdir.as_deref(), Some("/srv/app"));
    assert_eq!(spec.start.user.as_deref(), Some("1000"));
    assert_eq!(
        spec.start.env,
        vec![
            ("PIP_NO_CACHE_DIR".to_owned(), "1".to_owned()),
            ("APP".to_owned(), "/srv/my app".to_owned())
        ]
    );
    let ignored: Vec<(usize, &str)> = parsed
        .warnings
        .iter()
        .map(|w| match w {
            Warning::Ignored { line, what, .. } => (*line, *what),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        ignored,
        vec![(1, "the syntax directive"), (11, "EXPOSE"), (12, "LABEL")]
    );
    assert_eq!(
        parsed.warnings[1].to_string(),
        "line 11: EXPOSE is ignored: a sandbox's ports are reachable without it"
    );
}

#[test]
fn bases() {
    let from = |text: &str| ok(text).spec.from;
    assert_eq!(from("FROM scratch"), Base::Scratch {});
    assert_eq!(from("FROM py"), Base::Template { name: "py".into() });
    let pinned = format!("py@sha256:{}", "0".repeat(64));
    assert_eq!(
        from(&format!("FROM {pinned}")),
        Base::Template { name: pinned }
    );
    for image in [
        "ubuntu:24.04",
        "docker.io/library/ubuntu",
        "ghcr.io/org/img:tag",
        "localhost:5000/x",
        "localhost/x",
        "org/app",
    ] {
        assert_eq!(
            from(&format!("FROM {image}")),
            Base::Image {
                reference: image.into()
            },
            "{image}"
        );
    }
    assert!(matches!(
        err("FROM bad@sha256:xyz"),
        DockerfileError::Spec { line: 1, .. }
    ));
}

#[test]
fn exec_and_shell_forms() {
    let spec = ok(r#"FROM scratch
RUN ["/bin/echo", "a b", "$HOME"]
RUN echo "$HOME" && [ -d / ]
RUN [not json
ENTRYPOINT python3 -m app
"#)
    .spec;
    let commands: Vec<&Command> = spec
        .steps
        .iter()
        .map(|s| match s {
            Step::Run { command, .. } => command,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        commands,
        vec![
            &Command::Exec(strings(&["/bin/echo", "a b", "$HOME"])),
            &shell("echo \"$HOME\" && [ -d / ]"),
            &shell("[not json"),
        ]
    );
    assert_eq!(
        spec.start.entrypoint,
        Some(strings(&["/bin/sh", "-c", "python3 -m app"]))
    );
    // ENTRYPOINT without a CMD of the Dockerfile's clears the base's.
    assert_eq!(spec.start.cmd, Some(vec![]));

    let spec = ok("FROM scratch\nCMD [\"x\"]\nENTRYPOINT [\"/e\"]\n").spec;
    assert_eq!(spec.start.cmd, Some(strings(&["x"])));
    let spec = ok("FROM scratch\nENTRYPOINT [\"/e\"]\nCMD x y\n").spec;
    assert_eq!(spec.start.cmd, Some(strings(&["/bin/sh", "-c", "x y"])));
    let spec = ok("FROM scratch\nCMD []\n").spec;
    assert_eq!(spec.start.cmd, Some(vec![]));
}

#[test]
fn continuations_comments_and_case() {
    let spec = ok("FROM scratch\nrun apt-get update && \\\n    apt-get install -y \\\n# a comment inside\n\n      curl\nCmd echo \\\n  done\n")
        .spec;
    assert_eq!(
        spec.steps,
        vec![Step::Run {
            command: shell("apt-get update &&     apt-get install -y       curl"),
            user: None,
            env: BTreeMap::new(),
        }]
    );
    assert_eq!(
        spec.start.cmd,
        Some(strings(&["/bin/sh", "-c", "echo   done"]))
    );
    // CRLF line ends, a byte order mark, a continuation at the end.
    let spec = ok("\u{feff}FROM scratch\r\nRUN a \\\r\n b\r\nRUN c \\").spec;
    assert_eq!(spec.steps.len(), 2);
    assert_eq!(
        spec.steps[0],
        Step::Run {
            command: shell("a  b"),
            user: None,
            env: BTreeMap::new()
        }
    );
    // The line of an error is the one its instruction starts on.
    assert_eq!(
        err("FROM scratch\nRUN a \\\n b \\\n c\nBOGUS x").line(),
        Some(5)
    );
}

#[test]
fn escape_directive() {
    let spec =
        ok("# escape=`\nFROM scratch\nRUN dir C:\\ `\n  && echo x\nWORKDIR C:\\dir\nENV A=x`$B\n")
            .spec;
    assert_eq!(
        spec.steps,
        vec![
            Step::Run {
                command: shell("dir C:\\   && echo x"),
                user: None,
                env: BTreeMap::new()
            },
            Step::Workdir {
                path: "/C:\\dir".into()
            },
            Step::Env {
                vars: vec![("A".into(), "x$B".into())]
            },
        ]
    );
    // A directive after anything else is a comment.
    let spec = ok("# hello\n# escape=`\nFROM scratch\nRUN a \\\n b\n").spec;
    assert_eq!(spec.steps.len(), 1);
    let spec = ok("\n# escape=`\nFROM scratch\nRUN a \\\n b\n").spec;
    assert_eq!(spec.steps.len(), 1);
    assert_eq!(
        err("# escape=x\nFROM scratch"),
        DockerfileError::Escape {
            line: 1,
            value: "x".into()
        }
    );
    assert_eq!(
        err("# escape=`\n# escape=\\\nFROM scratch"),
        DockerfileError::DuplicateDirective {
            line: 2,
            name: "escape"
        }
    );
}

#[test]
fn env_forms() {
    let spec = ok(r#"FROM scratch
ENV A=1 B="two words" C='single $A' D=\"q\"
ENV E=$A F=${B}! G=${NOPE:-dflt} H=${A:+alt} I=${NOPE:+alt}
ENV A=2 J=$A
ENV LEGACY value with  spaces
ENV K="$LEGACY"
"#)
    .spec;
    assert_eq!(
        env_step(&spec.steps[0]),
        vec![
            ("A", "1"),
            ("B", "two words"),
            ("C", "single $A"),
            ("D", "\"q\"")
        ]
    );
    assert_eq!(
        env_step(&spec.steps[1]),
        vec![
            ("E", "1"),
            ("F", "two words!"),
            ("G", "dflt"),
            ("H", "alt"),
            ("I", "")
        ]
    );
    // Every value of an ENV sees the variables as they were before it.
    assert_eq!(env_step(&spec.steps[2]), vec![("A", "2"), ("J", "1")]);
    assert_eq!(
        env_step(&spec.steps[3]),
        vec![("LEGACY", "value with  spaces")]
    );
    assert_eq!(env_step(&spec.steps[4]), vec![("K", "value with  spaces")]);
    // The start configuration keeps each name once, the last value.
    assert_eq!(spec.start.env[0], ("A".to_owned(), "2".to_owned()));
    assert_eq!(spec.start.env.len(), 12);
    for (text, line) in [
        ("FROM scratch\nENV", 2),
        ("FROM scratch\nENV A", 2),
        ("FROM scratch\nENV A=1 B", 2),
        ("FROM scratch\nENV =x", 2),
    ] {
        assert!(
            matches!(err(text), DockerfileError::Arguments { line: l, instruction: "ENV", .. } if l == line),
            "{text}"
        );
    }
    assert!(matches!(
        err("FROM scratch\nENV A=${B:?B must be set}"),
        DockerfileError::Substitution { line: 2, .. }
    ));
    assert!(matches!(
        err("FROM scratch\nENV A=\"open"),
        DockerfileError::Substitution { line: 2, .. }
    ));
}

#[test]
fn the_base_environment_is_substituted() {
    let base = RunConfig::of_base(&["PATH=/usr/bin:/bin".into()], Some("/home/user"), None);
    let parsed = parse_over(
        "FROM py\nENV PATH=/opt/venv/bin:$PATH\nWORKDIR app\nCOPY a .\n",
        &BTreeMap::new(),
        &base,
    )
    .unwrap();
    assert_eq!(
        parsed.spec.steps,
        vec![
            Step::Env {
                vars: vec![("PATH".into(), "/opt/venv/bin:/usr/bin:/bin".into())]
            },
            Step::Workdir {
                path: "/home/user/app".into()
            },
            Step::Copy {
                sources: strings(&["a"]),
                dest: "/home/user/app/".into(),
                chown: None,
                chmod: None
            }
        ]
    );
}

#[test]
fn arg_scoping_follows_docker() {
    let text = r#"ARG VERSION=3.12
ARG FLAVOR
ARG UNSEEN=x
FROM python:${VERSION}-${FLAVOR:-slim}
RUN echo one
ARG VERSION
ARG OTHER=o-$VERSION
ENV FROM_ARG=$OTHER UNSEEN_HERE="${UNSEEN:-not visible}"
RUN echo two
ENV OTHER=env-wins
RUN echo three
"#;
    let parsed = ok(text);
    let spec = &parsed.spec;
    assert_eq!(
        spec.from,
        Base::Image {
            reference: "python:3.12-slim".into()
        }
    );
    // Before the stage declares them, the meta ARGs are not in effect.
    assert!(run_env(&spec.steps[0]).is_empty());
    assert_eq!(
        env_step(&spec.steps[1]),
        vec![("FROM_ARG", "o-3.12"), ("UNSEEN_HERE", "not visible")]
    );
    assert_eq!(
        run_env(&spec.steps[2]),
        &args(&[("VERSION", "3.12"), ("OTHER", "o-3.12")])
    );
    // An ENV of the same name wins over the ARG.
    assert_eq!(run_env(&spec.steps[4]), &args(&[("VERSION", "3.12")]));

    // Build arguments override defaults, before and after FROM.
    let parsed = ok_with(
        text,
        &[
            ("VERSION", "3.13"),
            ("FLAVOR", "bookworm"),
            ("OTHER", "given"),
        ],
    );
    assert_eq!(
        parsed.spec.from,
        Base::Image {
            reference: "python:3.13-bookworm".into()
        }
    );
    assert_eq!(
        run_env(&parsed.spec.steps[2]),
        &args(&[("VERSION", "3.13"), ("OTHER", "given")])
    );
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);

    // An ARG declared without a value is not set; a build argument no ARG
    // declares is reported; proxy arguments reach RUN without an ARG.
    let parsed = ok_with(
        "FROM scratch\nARG EMPTY\nRUN x\n",
        &[("UNDECLARED", "1"), ("HTTP_PROXY", "http://proxy:3128")],
    );
    assert_eq!(
        run_env(&parsed.spec.steps[0]),
        &args(&[("HTTP_PROXY", "http://proxy:3128")])
    );
    assert_eq!(
        parsed.warnings,
        vec![Warning::UnusedBuildArg {
            name: "UNDECLARED".into()
        }]
    );
    // Several in one ARG, and a default from an earlier one.
    let spec = ok("FROM scratch\nARG A=1 B=${A}2\nRUN x\n").spec;
    assert_eq!(run_env(&spec.steps[0]), &args(&[("A", "1"), ("B", "12")]));
    // Docker's platform arguments.
    let spec = ok("ARG TARGETARCH\nFROM img:${TARGETARCH}\nARG TARGETOS\nRUN x\n").spec;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(
        spec.from,
        Base::Image {
            reference: format!("img:{arch}")
        }
    );
    assert_eq!(run_env(&spec.steps[0]), &args(&[("TARGETOS", "linux")]));
}

#[test]
fn run_is_not_substituted() {
    let spec = ok("FROM scratch\nARG A=1\nRUN echo $A ${A:-x}\n").spec;
    assert_eq!(
        spec.steps[0],
        Step::Run {
            command: shell("echo $A ${A:-x}"),
            user: None,
            env: args(&[("A", "1")])
        }
    );
}

#[test]
fn copy_and_add() {
    let spec = ok(r#"FROM scratch
ARG SRC=src
ARG OWNER=app
WORKDIR /w
COPY ["${SRC}/a b.txt", "dir/"]
COPY --chown=${OWNER}:${OWNER} $SRC /opt/$SRC
COPY . .
ADD --chmod=755 tool /usr/local/bin/tool
COPY a b c/
"#)
    .spec;
    type Copy<'a> = (Vec<String>, &'a str, Option<&'a str>, Option<u32>);
    let copies: Vec<Copy> = spec
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
            } => Some((sources.clone(), dest.as_str(), chown.as_deref(), *chmod)),
            _ => None,
        })
        .collect();
    assert_eq!(
        copies,
        vec![
            (strings(&["src/a b.txt"]), "/w/dir/", None, None),
            (strings(&["src"]), "/opt/src", Some("app:app"), None),
            (strings(&["."]), "/w/", None, None),
            (strings(&["tool"]), "/usr/local/bin/tool", None, Some(0o755)),
            (strings(&["a", "b"]), "/w/c/", None, None),
        ]
    );
    let refused = [
        ("COPY a b c", "needs a destination ending"),
        ("COPY a", "needs a source and a destination"),
        ("COPY /etc/passwd /x", "is absolute"),
        ("COPY ../secret /x", "climbs out"),
        ("COPY --chmod=u+x a /x", "octal mode"),
        ("COPY --chown=a:b:c a /x", "user[:group]"),
        ("COPY --link a /x", "COPY --link is not supported"),
        ("COPY --parents a /x", "COPY --parents is not supported"),
        ("COPY <<EOF /x", "heredoc"),
        ("ADD https://example.com/x.tgz /x", "the URL"),
        ("ADD git@github.com:o/r.git /x", "the URL"),
        ("ADD app.tar.gz /x", "extract the archive"),
        (
            "ADD --checksum=sha256:00 a /x",
            "ADD --checksum is not supported",
        ),
    ];
    for (instruction, says) in refused {
        let e = err(&format!("FROM scratch\n\n{instruction}\n"));
        assert_eq!(e.line(), Some(3), "{instruction}: {e}");
        let message = e.to_string();
        assert!(message.starts_with("line 3: "), "{message}");
        assert!(message.contains(says), "{instruction}: {message}");
    }
}

#[test]
fn workdir_and_user() {
    let spec = ok("FROM scratch\nWORKDIR a\nWORKDIR b/../c\nWORKDIR /abs\nWORKDIR ./x/\nARG U=app\nUSER $U:staff\n").spec;
    let paths: Vec<&str> = spec
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Workdir { path } => Some(path.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(paths, vec!["/a", "/a/c", "/abs", "/abs/x"]);
    assert_eq!(spec.start.user.as_deref(), Some("app:staff"));
    assert!(matches!(
        err("FROM scratch\nUSER a b"),
        DockerfileError::Arguments {
            line: 2,
            instruction: "USER",
            ..
        }
    ));
    assert!(matches!(
        err("FROM scratch\nWORKDIR"),
        DockerfileError::Arguments {
            line: 2,
            instruction: "WORKDIR",
            ..
        }
    ));
    assert!(matches!(
        err("FROM scratch\nWORKDIR $NOTHING"),
        DockerfileError::Arguments { line: 2, .. }
    ));
}

#[test]
fn refused_instructions_name_their_line() {
    let cases: &[(&str, &str)] = &[
        ("ONBUILD RUN x", "line 3: ONBUILD is not supported"),
        ("VOLUME /data", "line 3: VOLUME is not supported"),
        (
            "SHELL [\"/bin/bash\", \"-c\"]",
            "line 3: SHELL is not supported",
        ),
        (
            "FROUM x",
            "line 3: \"FROUM\" is not a Dockerfile instruction",
        ),
        (
            "RUN --mount=type=cache,target=/c x",
            "line 3: RUN --mount is not supported",
        ),
        (
            "RUN --network=none x",
            "line 3: RUN --network is not supported",
        ),
        ("RUN <<EOF", "line 3: RUN with a heredoc"),
        ("RUN cat > /x <<-'END'", "line 3: RUN with a heredoc"),
        ("RUN", "line 3: RUN needs a command"),
        ("CMD", "line 3: CMD needs a command"),
        ("ARG", "line 3: ARG needs a name"),
    ];
    for (instruction, says) in cases {
        let message = err(&format!("FROM scratch\n# comment\n{instruction}\n")).to_string();
        assert!(message.starts_with(says), "{instruction}: {message}");
    }
    let message = err("FROM --platform=linux/arm64 x").to_string();
    assert_eq!(message, "line 1: FROM --platform is not supported");
}

#[test]
fn ignored_instructions_are_warnings() {
    let parsed = ok("FROM scratch\nEXPOSE 80\nLABEL a=b\nMAINTAINER me\nSTOPSIGNAL SIGTERM\nHEALTHCHECK CMD curl -f http://localhost/\n");
    assert!(parsed.spec.steps.is_empty());
    let what: Vec<(usize, &str)> = parsed
        .warnings
        .iter()
        .map(|w| match w {
            Warning::Ignored { line, what, .. } => (*line, *what),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        what,
        vec![
            (2, "EXPOSE"),
            (3, "LABEL"),
            (4, "MAINTAINER"),
            (5, "STOPSIGNAL"),
            (6, "HEALTHCHECK")
        ]
    );
}

#[test]
fn multi_stage_is_refused() {
    for (text, line) in [
        ("FROM a\nRUN x\nFROM b\n", 3),
        ("FROM golang:1.22 AS build\n", 1),
        ("FROM golang:1.22 as build\n", 1),
        ("FROM a\nCOPY --from=build /out /out\n", 2),
    ] {
        let e = err(text);
        assert!(
            matches!(e, DockerfileError::MultiStage { .. }),
            "{text}: {e}"
        );
        assert_eq!(e.line(), Some(line));
        assert!(
            e.to_string()
                .ends_with("multi-stage builds are not supported"),
            "{e}"
        );
    }
}

#[test]
fn from_rules() {
    assert_eq!(err(""), DockerfileError::NoFrom);
    assert_eq!(err("# only a comment\nARG A=1\n"), DockerfileError::NoFrom);
    assert_eq!(
        err("ARG A\nRUN x\nFROM scratch"),
        DockerfileError::BeforeFrom {
            line: 2,
            instruction: "RUN"
        }
    );
    assert_eq!(
        err("EXPOSE 1\nFROM scratch").to_string(),
        "line 1: EXPOSE comes before FROM, where only ARG may"
    );
    assert!(matches!(
        err("FROM"),
        DockerfileError::Arguments {
            line: 1,
            instruction: "FROM",
            ..
        }
    ));
    assert!(matches!(
        err("ARG B\nFROM $B"),
        DockerfileError::Arguments { line: 2, .. }
    ));
}

#[test]
fn bounds() {
    let many = format!("FROM scratch\n{}", "RUN x\n".repeat(MAX_STEPS + 1));
    assert_eq!(
        err(&many),
        DockerfileError::TooManySteps {
            line: MAX_STEPS + 2
        }
    );
    let exactly = format!("FROM scratch\n{}", "RUN x\n".repeat(MAX_STEPS));
    assert_eq!(ok(&exactly).spec.steps.len(), MAX_STEPS);
    let huge = "#".repeat(airlock_build::dockerfile::MAX_DOCKERFILE_BYTES + 1);
    assert!(matches!(err(&huge), DockerfileError::TooLarge { .. }));
    // Substitution cannot blow up: each doubling is bounded.
    let mut text = "FROM scratch\nARG A=xxxxxxxxxxxxxxxx\n".to_owned();
    for _ in 0..20 {
        text.push_str("ARG A=$A$A\n");
    }
    assert!(matches!(
        err(&text),
        DockerfileError::Substitution { line: 14, .. }
    ));
    let long_run = format!("FROM scratch\nRUN {}\n", "x".repeat(70 * 1024));
    assert!(matches!(
        err(&long_run),
        DockerfileError::Spec { line: 2, .. }
    ));
}

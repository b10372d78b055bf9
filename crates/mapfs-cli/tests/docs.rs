//! docs/cli.md is the complete reference of the command line: every
//! command and every long option `mapfs --help` knows of is in it, so a new
//! option cannot ship undocumented.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::mapfs_bin;

/// `mapfs ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(mapfs_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "mapfs {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists (its `Commands:` section).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// The long options (`--name`) a help text lists.
fn long_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("-h, ").unwrap_or(l);
            let l = l.split_once(", ").map_or(
                l,
                |(short, rest)| {
                    if short.len() == 2 {
                        rest
                    } else {
                        l
                    }
                },
            );
            l.strip_prefix("--")
                .map(|o| o.split([' ', '=']).next().unwrap().to_string())
        })
        .filter(|o| o != "help" && o != "version")
        .collect()
}

#[test]
fn cli_md_documents_every_command_and_option() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let mut missing = Vec::new();
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        seen += 1;
        if !path.is_empty() && !doc.contains(&format!("mapfs {}", args.join(" "))) {
            // A subcommand of a group may be listed as `mapfs pack compact|...`.
            let group = args[..args.len() - 1].join(" ");
            let listed = doc.lines().any(|l| {
                l.contains(&format!("mapfs {group} ")) && l.contains(args[args.len() - 1])
            });
            if !listed {
                missing.push(format!("command `mapfs {}`", args.join(" ")));
            }
        }
        for o in long_options(&text) {
            if !doc.contains(&format!("--{o}")) {
                missing.push(format!("option --{o} of `mapfs {}`", args.join(" ")));
            }
        }
        for c in commands(&text) {
            let mut p = path.clone();
            p.push(c);
            stack.push(p);
        }
    }
    assert!(seen > 15, "only {seen} help texts read: the parsing broke");
    assert!(
        missing.is_empty(),
        "not in docs/cli.md:\n{}",
        missing.join("\n")
    );
}

/// The man pages: a synopsis with option values, no page referred to that
/// is not written (clap's `help` subcommand had a `mapfs-help(1)`), and
/// the hand-written sections of mapfs(1) and mapfs-mount(1).
#[test]
fn man_pages_are_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(mapfs_bin())
        .arg("manpages")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pages: BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for want in [
        "mapfs.1",
        "mapfs-mount.1",
        "mapfs-pack-check.1",
        "mapfs-versions-diff.1",
    ] {
        assert!(pages.contains(want), "no {want} in {pages:?}");
    }
    let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
    for page in &pages {
        let text = read(page);
        // Every `mapfs-x(1)` named exists.
        for (i, _) in text.match_indices("(1)") {
            let start = text[..i]
                .rfind(|c: char| c.is_whitespace() || c == ',')
                .map_or(0, |s| s + 1);
            let name = text[start..i].replace("\\-", "-");
            if name.starts_with("mapfs") {
                assert!(
                    pages.contains(&format!("{name}.1")),
                    "{page} names {name}(1), not written"
                );
            }
        }
    }
    let mount = read("mapfs-mount.1");
    assert!(
        mount.contains("[\\-\\-data auto|daemon|passthrough]") && mount.contains("[\\-o OPTIONS"),
        "garbled synopsis:\n{}",
        &mount[..mount.find(".SH DESCRIPTION").unwrap_or(mount.len())]
    );
    for section in [
        "FSTAB OPTIONS",
        "EXAMPLES",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
    ] {
        assert!(
            mount.contains(&format!(".SH \"{section}\"")),
            "mapfs-mount(1) lacks {section}"
        );
    }
    assert!(
        mount.contains("writeback_cache=auto|on|off"),
        "no fstab options"
    );
    let main = read("mapfs.1");
    for section in ["EXAMPLES", "FILES", "ENVIRONMENT", "EXIT STATUS"] {
        assert!(
            main.contains(&format!(".SH \"{section}\"")),
            "mapfs(1) lacks {section}"
        );
    }
}

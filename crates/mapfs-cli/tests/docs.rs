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

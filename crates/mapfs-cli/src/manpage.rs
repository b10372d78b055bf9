//! Man pages: clap_mangen's rendering of each command, with a synopsis
//! written here (clap_mangen's drops option values: `[--data] [-o ]`) and
//! hand-written sections for `PROGRAM(1)` and `PROGRAM-mount(1)`: EXAMPLES,
//! FILES, ENVIRONMENT, EXIT STATUS, and the fstab options.

use anyhow::Result;
use clap::ArgAction;

/// The roff text of page `page` (`mapfs`, `mapfs-mount`, `mapfs-pack-check`)
/// of program `program`, for `cmd`.
pub(crate) fn render(program: &str, page: &str, cmd: clap::Command) -> Result<Vec<u8>> {
    // "mapfs-pack-check" is run as "mapfs pack check"; subcommand names
    // have no '-', a program's name may.
    let spoken = format!("{program}{}", page[program.len()..].replace('-', " "));
    let synopsis = synopsis(&spoken, &cmd);
    let mut cmd = cmd.override_usage(synopsis);
    cmd.build();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut out)?;
    let extra = if page == program {
        let has = |name: &str| cmd_has(&out, name, program);
        program_sections(program, has("versions"), has("pack"))
    } else if page == format!("{program}-mount") {
        mount_sections(program)
    } else {
        String::new()
    };
    out.extend_from_slice(extra.as_bytes());
    Ok(out)
}

/// One synopsis line per form, each option with its value
/// (`[--data auto|daemon|passthrough]`), positionals last.
fn synopsis(spoken: &str, cmd: &clap::Command) -> String {
    let subs: Vec<&str> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name())
        .collect();
    if !subs.is_empty() {
        // The program's own page names its commands in SUBCOMMANDS; a group
        // (`pack`, `versions`) has few enough to list.
        if cmd.get_version().is_some() {
            return format!("{spoken} COMMAND [ARGS...]\n{spoken} --help | --version");
        }
        return format!("{spoken} {} ...", subs.join("|"));
    }
    let mut line = vec![spoken.to_string()];
    for a in cmd.get_arguments() {
        if a.is_hide_set() || a.is_positional() {
            continue;
        }
        let id = a.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let flag = match (a.get_long(), a.get_short()) {
            (Some(l), _) => format!("--{l}"),
            (None, Some(s)) => format!("-{s}"),
            (None, None) => continue,
        };
        let takes_value = matches!(a.get_action(), ArgAction::Set | ArgAction::Append);
        let mut item = flag;
        if takes_value {
            let values: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            let value = if !values.is_empty() && values.len() <= 4 {
                values.join("|")
            } else {
                a.get_value_names()
                    .map(|n| n.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|| id.to_uppercase())
            };
            item = format!("{item} {value}");
        }
        if matches!(a.get_action(), ArgAction::Append) {
            item.push_str("...");
        }
        line.push(if a.is_required_set() {
            item
        } else {
            format!("[{item}]")
        });
    }
    for a in cmd.get_positionals() {
        if a.is_hide_set() {
            continue;
        }
        let name = a
            .get_value_names()
            .and_then(|n| n.first().map(|s| s.as_str().to_string()))
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        let many = matches!(a.get_action(), ArgAction::Append)
            || a.get_num_args().is_some_and(|n| n.max_values() > 1);
        let mut item = if many { format!("{name}...") } else { name };
        if a.is_last_set() {
            item = format!("-- {item}");
        }
        line.push(if a.is_required_set() {
            item
        } else {
            format!("[{item}]")
        });
    }
    line.join(" ")
}

/// Text for roff: backslashes and hyphens escaped, and a line that would
/// start with a control character made literal.
fn esc(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    s.lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A section: a heading and its items, each a term (bold, `None` for a
/// paragraph) and its text.
fn section(title: &str, items: &[(Option<&str>, &str)]) -> String {
    let mut s = format!(".SH \"{title}\"\n");
    for (term, text) in items {
        match term {
            Some(t) => s.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", esc(t), esc(text))),
            None => s.push_str(&format!(".PP\n{}\n", esc(text))),
        }
    }
    s
}

/// ENVIRONMENT of the daemon, shared by both pages.
const DAEMON_ENV: &[(Option<&str>, &str)] = &[
    (
        Some("MAPFS_LOG"),
        "Log filter of the daemon (info by default; debug, or mapfs_fuse=trace), in its log file or on stderr with --foreground.",
    ),
    (
        Some("MAPFS_RUNTIME_DIR"),
        "Directory of control sockets, pid, info and log files (default /run/mapfs for root, else $XDG_RUNTIME_DIR/mapfs).",
    ),
    (
        Some("MAPFS_STATS"),
        "off turns the request counters of the stats command off (to measure what they cost).",
    ),
    (
        Some("MAPFS_CONTROL_IDLE_SECS"),
        "Seconds after which an idle control connection is closed.",
    ),
    (
        Some("MAPFS_HOUSEKEEPING_MS"),
        "Period of the file system's housekeeping.",
    ),
    (
        Some("MAPFS_JOURNAL_RING"),
        "0: the supervisor offers its daemons no shared ring; failover records go through its socket.",
    ),
];

/// FILES, shared by both pages.
const FILES: &[(Option<&str>, &str)] = &[
    (
        Some("/run/mapfs/ (root), $XDG_RUNTIME_DIR/mapfs/ (other users)"),
        "Per mount, named after the mountpoint: .sock (the control socket), .pid, .json (what list shows), .log (the daemon's log; the previous one is kept as .log.1).",
    ),
    (
        Some("PREFIX/lib/mapfs/libmapfs_preload.so"),
        "The shim the run command preloads (also found next to the binary in a build directory).",
    ),
    (Some("/etc/fstab"), "fuse.PROGRAM lines; see mapfs-mount(1)."),
];

/// Whether the rendered page of `program` lists its command `name`.
fn cmd_has(page: &[u8], name: &str, program: &str) -> bool {
    let needle = format!("{}\\-{name}(1)", program.replace('-', "\\-"));
    String::from_utf8_lossy(page).contains(&needle)
}

/// EXAMPLES, FILES, ENVIRONMENT, EXIT STATUS and SEE ALSO of `PROGRAM(1)`;
/// the `versions` and `pack` lines only where the program has them.
fn program_sections(p: &str, versions: bool, pack: bool) -> String {
    let examples = [
        format!("{p} mount passthrough /srv/data /mnt/data"),
        format!("{p} list"),
        format!("{p} run -- cp /mnt/data/big /mnt/data/big.copy"),
        format!("{p} run --embed passthrough:/srv/data:/data -- python3 train.py"),
        format!("{p} umount /mnt/data"),
        format!("{p} versions diff /mnt/work /notes.txt"),
    ];
    let what = [
        "Mount the passthrough file system of /srv/data on /mnt/data (in the background; returns once it is ready).",
        "Show every mount, its executor, and whether its daemon is live or dead.",
        "Run a program whose reads and writes of files on the mount go to the backing files directly.",
        "Run a program with the file system inside its processes: no mount, daemon or privilege.",
        "Unmount, and wait until the daemon has written everything.",
        "Compare the newest kept version of /notes.txt with the current file (exit status 1 when they differ).",
    ];
    let shown = if versions {
        examples.len()
    } else {
        examples.len() - 1
    };
    let ex: Vec<(Option<&str>, &str)> = examples
        .iter()
        .zip(what)
        .take(shown)
        .map(|(e, w)| (Some(e.as_str()), w))
        .collect();
    let mut env = DAEMON_ENV.to_vec();
    env.extend_from_slice(&[
        (
            Some("MAPFS_PRELOAD_REPORT"),
            "Under run: a file to append one JSON summary line per process to, at exit.",
        ),
        (Some("MAPFS_PRELOAD_LOG"), "Under run: 1 prints the shim's diagnostics on stderr."),
        (
            Some("MAPFS_PRELOAD_MAP_CACHE"),
            "Under run: files in the per-process map cache (default 256; 0 turns it off).",
        ),
        (
            Some("MAPFS_PRELOAD_ADOPT_CALLS, MAPFS_PRELOAD_ADOPT_BYTES, MAPFS_PRELOAD_ADOPT_MOUNT_US"),
            "Under run: when the shim adopts a file (at its 16th data call, a call of 1 MiB, or once its calls through the mount took 200 microseconds).",
        ),
        (
            None,
            "Every variable, those set by mapfs for its own processes included, is listed in docs/cli.md of the source.",
        ),
    ]);
    let one = format!(
        "Any error, after one line {p}: error: ... on stderr; nothing is mounted when mount \
         fails.{}",
        if pack {
            " pack check also exits 1 when it finds a problem."
        } else {
            ""
        }
    );
    let mut status = vec![(Some("0"), "Success."), (Some("1"), one.as_str())];
    if versions {
        status.push((
            Some("versions diff"),
            "Exits as diff(1): 0 when the same, 1 when different, 2 on trouble.",
        ));
    }
    status.push((Some("run"), "Exits with the program's status."));
    [
        section("EXAMPLES", &ex),
        section("ENVIRONMENT", &env),
        section("FILES", FILES).replace("fuse.PROGRAM", &format!("fuse.{p}")),
        section("EXIT STATUS", &status),
        section(
            "SEE ALSO",
            &[(
                None,
                &format!(
                    "{p}-mount(1), {p}-run(1), {p}-list(1), mount(8), fstab(5), fusermount3(1)"
                ),
            )],
        ),
    ]
    .concat()
}

/// FSTAB OPTIONS, EXAMPLES, FILES, ENVIRONMENT and EXIT STATUS of
/// `PROGRAM-mount(1)`.
fn mount_sections(p: &str) -> String {
    let fstab_intro = format!(
        "mount -t fuse.{p} BACKING MOUNTPOINT -o OPTIONS and /etc/fstab lines of type fuse.{p} \
         run {p} BACKING MOUNTPOINT -o OPTIONS through mount.fuse3, which finds {p} on root's \
         default PATH only. Besides the mount options above, -o takes:"
    );
    let fstab = [
        (None, fstab_intro.as_str()),
        (
            Some("fs=NAME"),
            "The file system (default: the program's first, passthrough for mapfs).",
        ),
        (Some("data=auto|daemon|passthrough"), "As --data."),
        (Some("ttl=SECS"), "As --ttl."),
        (Some("exclusive"), "As --exclusive."),
        (Some("writeback_cache=auto|on|off"), "As --writeback-cache."),
        (
            Some("defaults, auto, noauto, nofail, _netdev, user, users, nouser, owner, group, x-*, comment=*"),
            "For mount(8) and systemd; ignored.",
        ),
    ];
    let line1 = format!("{p} mount passthrough /srv/data /mnt/data");
    let line2 = format!("{p} mount plfs /srv/ckpt /mnt/ckpt --data daemon -o allow_other");
    let line3 = format!("{p} mount versions /srv/work /mnt/work -o keep=20");
    let line4 = format!(
        "/srv/data  /mnt/data  fuse.{p}  fs=passthrough,data=auto,allow_other,nofail  0  0"
    );
    let line5 = format!("mount -t fuse.{p} /srv/data /mnt/data -o fs=passthrough");
    let ex = [
        (
            Some(line1.as_str()),
            "A 1-to-1 mirror, kernel passthrough where the kernel grants it.",
        ),
        (
            Some(line2.as_str()),
            "plfs, every byte through the daemon, usable by other users.",
        ),
        (
            Some(line3.as_str()),
            "Keep the 20 newest versions of every file.",
        ),
        (Some(line4.as_str()), "An /etc/fstab line."),
        (Some(line5.as_str()), "The same by hand."),
    ];
    let status = [
        (Some("0"), "Mounted and ready."),
        (
            Some("1"),
            "Not mounted, after one line naming the cause: a bad argument or option, a mountpoint that is mounted, busy or not empty (without -o nonempty), no /dev/fuse or no permission to open it, --data passthrough where the kernel does not grant it, or a file system that cannot start on BACKING.",
        ),
    ];
    [
        section("FSTAB OPTIONS", &fstab),
        section("EXAMPLES", &ex),
        section("ENVIRONMENT", DAEMON_ENV),
        section("FILES", FILES).replace("fuse.PROGRAM", &format!("fuse.{p}")),
        section("EXIT STATUS", &status),
        section(
            "SEE ALSO",
            &[(
                None,
                &format!("{p}(1), {p}-umount(1), {p}-list(1), mount(8), fstab(5), mount.fuse3(8)"),
            )],
        ),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    #[test]
    fn roff_escapes_hyphens_and_leading_dots() {
        assert_eq!(super::esc("--data a\\b"), "\\-\\-data a\\eb");
        assert_eq!(super::esc(".x\n'y"), "\\&.x\n\\&'y");
    }
}

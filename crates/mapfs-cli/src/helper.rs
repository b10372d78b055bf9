//! The `PROGRAM BACKING MOUNTPOINT -o OPTIONS` form that `mount.fuse3` runs
//! for `mount -t fuse.PROGRAM` and `/etc/fstab` lines.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};

use crate::mount_cmd::{parse_ttl, MountArgs};
use crate::registry::Registry;

/// fstab options that are for mount(8) itself, not for the file system.
const FSTAB_ONLY: &[&str] = &[
    "defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner", "group",
];

/// The `PROGRAM BACKING MOUNTPOINT [-o OPTIONS]` form that `mount.fuse3`
/// uses for `mount -t fuse.PROGRAM` and fstab lines, as `mount` arguments.
/// `-o` carries `fs=NAME` (default: the first registered file system),
/// `data=`, `ttl=`, `exclusive`, `writeback_cache=`, and mount options.
pub fn helper_args(reg: &Registry, args: &[OsString]) -> Result<MountArgs> {
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => match it.next() {
                Some(o) => opts.push(o.to_string_lossy().into_owned()),
                None => bail!("-o needs a value"),
            },
            Some(o) if o.starts_with("-o") => opts.push(o[2..].to_string()),
            // mount(8)'s "sloppy", "no mtab", "verbose", "fake" flags.
            Some("-s" | "-n" | "-v" | "-f") => {}
            Some(o) if o.starts_with('-') => bail!("unknown option {o:?}"),
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [backing, mountpoint] = <[PathBuf; 2]>::try_from(positional).map_err(|p| {
        anyhow!(
            "expected a subcommand, or BACKING MOUNTPOINT -o fs=NAME,... (got {} paths; see `{} --help`)",
            p.len(),
            reg.program()
        )
    })?;
    let mut m = MountArgs {
        fs: reg.names().first().map_or("", |n| n).to_string(),
        backing,
        mountpoint,
        data: "auto".into(),
        options: Vec::new(),
        foreground: false,
        ttl: None,
        exclusive: false,
        writeback_cache: "auto".into(),
        no_supervisor: false,
        daemonized: false,
    };
    let mut kept = Vec::new();
    for o in opts
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (k, v) = o.split_once('=').unwrap_or((o, ""));
        match k {
            "fs" => m.fs = v.to_string(),
            "data" if ["auto", "daemon", "passthrough"].contains(&v) => m.data = v.to_string(),
            "data" => bail!("invalid data={v:?} (auto, daemon or passthrough)"),
            "exclusive" if v.is_empty() => m.exclusive = true,
            "ttl" => m.ttl = Some(parse_ttl(v).map_err(|e| anyhow!("invalid ttl={v:?}: {e}"))?),
            "writeback_cache" if ["auto", "on", "off"].contains(&v) => {
                m.writeback_cache = v.to_string()
            }
            "writeback_cache" => bail!("invalid writeback_cache={v:?} (auto, on or off)"),
            _ if FSTAB_ONLY.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => kept.push(o.to_string()),
        }
    }
    if !kept.is_empty() {
        m.options.push(kept.join(","));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn helper_form_maps_to_mount_args() {
        let reg = crate::builtins();
        let m = helper_args(
            &reg,
            &os(&[
                "/b",
                "/m",
                "-o",
                "rw,fs=plfs,data=daemon,allow_other,noauto,x-systemd.automount,ttl=2",
            ]),
        )
        .unwrap();
        assert_eq!(m.fs, "plfs");
        assert_eq!(m.data, "daemon");
        assert_eq!(m.ttl, Some(2.0));
        assert_eq!(m.options, ["rw,allow_other"]);
        assert_eq!(m.backing, PathBuf::from("/b"));
        assert_eq!(
            helper_args(&reg, &os(&["/b", "/m"])).unwrap().fs,
            "passthrough"
        );
        assert!(helper_args(&reg, &os(&["/b"])).is_err());
        assert!(helper_args(&reg, &os(&["/b", "/m", "-o", "data=fast"])).is_err());
    }
}

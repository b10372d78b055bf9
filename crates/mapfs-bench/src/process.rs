//! Running child processes with a time limit and captured output.

use std::io::{Read, Seek};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What a finished child printed.
pub struct Captured {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Captured {
    /// The line that best explains a failure: the first line of stderr (else
    /// stdout) mentioning an error, else the last non-empty one.
    pub fn error_line(&self) -> &str {
        [&self.stderr, &self.stdout]
            .iter()
            .find_map(|s| {
                s.lines()
                    .map(str::trim)
                    .find(|l| l.to_ascii_lowercase().contains("error"))
            })
            .unwrap_or_else(|| self.last_line())
    }

    /// The last non-empty line of stderr (else stdout): usually the error.
    pub fn last_line(&self) -> &str {
        [&self.stderr, &self.stdout]
            .iter()
            .find_map(|s| s.lines().rev().map(str::trim).find(|l| !l.is_empty()))
            .unwrap_or("")
    }
}

/// Runs `cmd` to completion, killing it after `timeout`.
///
/// Output goes to temporary files rather than pipes: a mount command leaves
/// a daemon behind that may keep inherited pipes open, and waiting for EOF
/// on them would block forever.
pub fn run(mut cmd: Command, timeout: Duration) -> Result<Captured> {
    let mut out = tempfile::tempfile().context("temporary file for child output")?;
    let mut err = tempfile::tempfile().context("temporary file for child output")?;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(err.try_clone()?)
        .spawn()
        .with_context(|| format!("cannot run {shown}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{shown} did not finish within {}s; killed",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |f: &mut std::fs::File| -> Result<String> {
        let mut s = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut s)?;
        Ok(String::from_utf8_lossy(&s).into_owned())
    };
    Ok(Captured {
        status,
        stdout: read(&mut out)?,
        stderr: read(&mut err)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_and_times_out() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let r = run(c, Duration::from_secs(10)).unwrap();
        assert_eq!(r.status.code(), Some(3));
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
        assert_eq!(r.last_line(), "err");
        assert_eq!(r.error_line(), "err");
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo 'error: bad flag' >&2; echo 'try --help' >&2; exit 2",
        ]);
        let r = run(c, Duration::from_secs(10)).unwrap();
        assert_eq!(r.error_line(), "error: bad flag");
        let mut c = Command::new("sleep");
        c.arg("10");
        assert!(run(c, Duration::from_millis(100)).is_err());
    }
}

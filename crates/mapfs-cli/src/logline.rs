//! The daemon's log lines, one per event whatever the paths and names in
//! them hold: a file name with a newline (a user may make one) written
//! into the log as it is would start a line of its own, which reads as
//! the daemon's (a forged warning, or another mount's path).

use std::io::Write;

/// A [`tracing_subscriber::fmt::MakeWriter`] for standard error (the
/// daemon's log file) that escapes every control character of an event but
/// the newline ending it: `\n`, `\r`, `\t` as themselves escaped, the rest
/// (C0, DEL, C1, such as a terminal's escape sequences) as `\u{..}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogLines;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogLines {
    type Writer = EscapedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        EscapedStderr
    }
}

/// Standard error, escaped as [`LogLines`] says; the formatter hands it one
/// whole event per `write`.
#[derive(Debug)]
pub struct EscapedStderr;

impl Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write_all(escape(buf).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `buf` with its control characters escaped, but a final newline.
pub fn escape(buf: &[u8]) -> String {
    let (body, end) = match buf.strip_suffix(b"\n") {
        Some(b) => (b, "\n"),
        None => (buf, ""),
    };
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push_str(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_one_line() {
        assert_eq!(escape(b"plain line\n"), "plain line\n");
        assert_eq!(
            escape(b"WARN path=/d/a\nERROR forged\n"),
            "WARN path=/d/a\\nERROR forged\n"
        );
        assert_eq!(
            escape(b"a\r\tb\x1b[31m\xc2\x85c"),
            "a\\r\\tb\\u{1b}[31m\\u{85}c"
        );
        assert_eq!(escape("é ✓\n".as_bytes()), "é ✓\n");
    }
}

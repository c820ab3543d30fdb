//! Output of commands on machines (SSH, Docker exec): split into lines, bounded everywhere
//! and escaped before anyone logs it. A machine is outside input: a compromised one may send
//! a line without end, a flood of short lines, or terminal escape sequences.
//!
//! - [`LineStream`] keeps at most [`CAPTURE_CAP`] bytes per stream (the tail, which holds the
//!   script's result line) and at most [`LINE_CAP`] bytes of an unfinished line; a longer
//!   line is cut there and marked. Each chunk is scanned once (linear in the output).
//! - [`OutputSink`] is a bounded channel: when its reader (the log) falls behind, lines are
//!   dropped and counted, and the count is sent as a notice once there is room again. At
//!   most [`RUN_STREAM_CAP`] bytes are streamed per run; the rest is announced, not sent.
//!   Control characters (ESC, CR, DEL, C1, bidirectional overrides) are escaped as
//!   `\u{1b}` before a line is sent.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::mpsc;

/// A line longer than this is cut (and marked) when streamed.
pub const LINE_CAP: usize = 64 << 10;
/// Output kept per stream; beyond it the oldest bytes go (the tail holds the result JSON,
/// itself at most 64 KiB). Small, since every script run in flight holds two: the controller's
/// memory is what bounds the number of runs (see the controller's `MAX_SCRIPT_RUNS`).
pub const CAPTURE_CAP: usize = 128 << 10;
/// Bytes of lines streamed per run (per sink and its clones); the rest is not streamed.
pub const RUN_STREAM_CAP: u64 = 256 << 10;
/// A good capacity for the channel behind an [`OutputSink`].
pub const QUEUE_LINES: usize = 1024;
/// Lines the sink writes itself (drops, cuts, the byte cap) start with this. The script
/// runner (taskservs `runner.rs`, `is_gap_notice`) recognises "… lines dropped" and "… not
/// streamed" after it, and then builds the output tail from the returned output instead.
pub const NOTICE_PREFIX: &str = "[provisioning] ";

/// Where output lines go as they come: a bounded channel that never blocks the command's
/// reader. Clones share their counters (stdout and stderr of one run).
#[derive(Clone, Debug)]
pub struct OutputSink {
    tx: mpsc::Sender<String>,
    state: Arc<SinkState>,
}

#[derive(Debug)]
struct SinkState {
    /// Lines dropped because the channel was full and not yet reported.
    unreported: AtomicU64,
    /// Lines dropped in all.
    dropped: AtomicU64,
    /// Bytes streamed so far.
    streamed: AtomicU64,
    /// Bytes streamed at most.
    cap: u64,
    /// Whether the byte cap was reached (and announced, or tried to be).
    capped: AtomicBool,
    /// Lines not streamed after the byte cap.
    withheld: AtomicU64,
}

impl From<mpsc::Sender<String>> for OutputSink {
    fn from(tx: mpsc::Sender<String>) -> Self {
        OutputSink::new(tx)
    }
}

impl OutputSink {
    /// A sink sending to `tx`, with the default byte cap per run.
    pub fn new(tx: mpsc::Sender<String>) -> Self {
        Self::with_byte_cap(tx, RUN_STREAM_CAP)
    }

    /// A sink streaming at most `cap` bytes of lines.
    pub fn with_byte_cap(tx: mpsc::Sender<String>, cap: u64) -> Self {
        let state = SinkState {
            unreported: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
            cap,
            capped: AtomicBool::new(false),
            withheld: AtomicU64::new(0),
        };
        OutputSink { tx, state: Arc::new(state) }
    }

    /// A sink and its receiver, [`QUEUE_LINES`] lines deep.
    pub fn channel() -> (OutputSink, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel(QUEUE_LINES);
        (OutputSink::new(tx), rx)
    }

    /// Lines dropped so far because the reader fell behind.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// Sends one line (control characters escaped). Never waits: when the channel is full
    /// the line is dropped and counted. A closed channel drops silently (nobody listens).
    pub fn send(&self, line: &str) {
        let state = &self.state;
        if state.capped.load(Ordering::Relaxed) {
            state.withheld.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let line = escape_controls(line);
        let size = line.len() as u64 + 1;
        if state.streamed.fetch_add(size, Ordering::Relaxed) + size > state.cap {
            if !state.capped.swap(true, Ordering::Relaxed) {
                state.withheld.fetch_add(1, Ordering::Relaxed);
                let _ = self.tx.try_send(format!("{NOTICE_PREFIX}output beyond {} bytes is not streamed (the run continues)", state.cap));
            }
            return;
        }
        let unreported = state.unreported.swap(0, Ordering::Relaxed);
        if unreported > 0 && !self.offer(format!("{NOTICE_PREFIX}{unreported} output lines dropped: the log could not keep up")) {
            state.unreported.fetch_add(unreported, Ordering::Relaxed);
            self.count_drop();
            return;
        }
        if !self.offer(line.into_owned()) {
            self.count_drop();
        }
    }

    /// Sends whatever still needs saying at the end of a run (lines dropped at the end,
    /// lines withheld by the byte cap), best effort, and logs it once.
    pub fn finish(&self) {
        let state = &self.state;
        let unreported = state.unreported.swap(0, Ordering::Relaxed);
        if unreported > 0 {
            let _ = self.offer(format!("{NOTICE_PREFIX}{unreported} output lines dropped: the log could not keep up"));
        }
        let withheld = state.withheld.swap(0, Ordering::Relaxed);
        if withheld > 0 {
            let _ = self.offer(format!("{NOTICE_PREFIX}{withheld} output lines beyond the stream cap were not streamed"));
        }
        let dropped = state.dropped.load(Ordering::Relaxed);
        if dropped > 0 || withheld > 0 {
            tracing::warn!(dropped, withheld, "command output was not streamed in full");
        }
    }

    /// Whether the line went into the channel (or nobody listens any more).
    fn offer(&self, line: String) -> bool {
        match self.tx.try_send(line) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => true,
            Err(mpsc::error::TrySendError::Full(_)) => false,
        }
    }

    fn count_drop(&self) {
        self.state.unreported.fetch_add(1, Ordering::Relaxed);
        self.state.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// `text` with every control character (but tab), DEL, C1 control and bidirectional
/// formatting character written as `\u{..}`: output can never move a terminal's cursor,
/// recolour it or reorder what a log reader sees.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        (c.is_control() && c != '\t') || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One output stream of a command: split into lines for the sink, and a bounded copy
/// (the last [`CAPTURE_CAP`] bytes) for the result.
#[derive(Debug)]
pub struct LineStream {
    /// The unfinished line (at most `line_cap` bytes).
    pending: Vec<u8>,
    /// The current line was cut: the rest of it, up to its newline, is skipped.
    skipping: bool,
    captured: VecDeque<u8>,
    capture_cap: usize,
    line_cap: usize,
    /// Bytes looked at while splitting (each byte once: a test checks it).
    scanned: u64,
}

impl Default for LineStream {
    fn default() -> Self {
        Self::with_caps(CAPTURE_CAP, LINE_CAP)
    }
}

impl LineStream {
    /// A stream keeping `capture_cap` bytes and cutting lines at `line_cap` bytes.
    pub fn with_caps(capture_cap: usize, line_cap: usize) -> Self {
        LineStream { pending: Vec::new(), skipping: false, captured: VecDeque::new(), capture_cap, line_cap: line_cap.max(1), scanned: 0 }
    }

    /// Takes one chunk: keeps its tail, sends its complete lines.
    pub fn push(&mut self, chunk: &[u8], sink: Option<&OutputSink>) {
        self.capture(chunk);
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.scanned += end as u64 + 1;
            self.take_line_part(&rest[..end], sink);
            if self.skipping {
                self.skipping = false;
            } else {
                emit(&self.pending, false, sink);
            }
            self.pending.clear();
            rest = &rest[end + 1..];
        }
        self.scanned += rest.len() as u64;
        self.take_line_part(rest, sink);
    }

    /// Appends part of the current line, cutting it (and sending the cut line) at the cap.
    fn take_line_part(&mut self, part: &[u8], sink: Option<&OutputSink>) {
        if self.skipping {
            return;
        }
        let room = self.line_cap - self.pending.len();
        if part.len() <= room {
            self.pending.extend_from_slice(part);
            return;
        }
        self.pending.extend_from_slice(&part[..room]);
        emit(&self.pending, true, sink);
        self.pending.clear();
        self.skipping = true;
    }

    fn capture(&mut self, chunk: &[u8]) {
        let cap = self.capture_cap;
        if chunk.len() >= cap {
            self.captured.clear();
            self.captured.extend(&chunk[chunk.len() - cap..]);
            return;
        }
        let excess = (self.captured.len() + chunk.len()).saturating_sub(cap);
        self.captured.drain(..excess);
        self.captured.extend(chunk);
    }

    /// Sends the unfinished last line, if any, and returns the kept output.
    pub fn finish(&mut self, sink: Option<&OutputSink>) -> String {
        if !self.pending.is_empty() && !self.skipping {
            emit(&self.pending, false, sink);
        }
        self.pending.clear();
        self.skipping = false;
        let (front, back) = self.captured.as_slices();
        let mut bytes = Vec::with_capacity(self.captured.len());
        bytes.extend_from_slice(front);
        bytes.extend_from_slice(back);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Bytes held right now (the unfinished line and the kept output).
    pub fn held(&self) -> usize {
        self.pending.capacity() + self.captured.capacity()
    }

    /// Bytes looked at while splitting lines so far.
    pub fn scanned(&self) -> u64 {
        self.scanned
    }
}

fn emit(line: &[u8], cut: bool, sink: Option<&OutputSink>) {
    let Some(sink) = sink else { return };
    let text = String::from_utf8_lossy(line);
    let text = text.strip_suffix('\r').unwrap_or(&text);
    if cut {
        sink.send(&format!("{text} {NOTICE_PREFIX}(line cut at {} KiB)", line.len() >> 10));
    } else {
        sink.send(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<String>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn lines_are_split_across_chunks_and_the_tail_is_kept() {
        let (sink, mut rx) = OutputSink::channel();
        let mut s = LineStream::default();
        s.push(b"one\ntw", Some(&sink));
        s.push(b"o\r\nthree", Some(&sink));
        assert_eq!(s.finish(Some(&sink)), "one\ntwo\r\nthree");
        assert_eq!(drain(&mut rx), ["one", "two", "three"]);

        let mut s = LineStream::with_caps(16, 8);
        s.push(b"0123456789\n", None);
        s.push(b"{\"result\":true}\n", None);
        assert_eq!(s.finish(None), "{\"result\":true}\n", "the last 16 bytes");
    }

    #[test]
    fn a_line_without_end_stays_within_the_cap() {
        let (sink, mut rx) = OutputSink::channel();
        let mut s = LineStream::default();
        let chunk = vec![b'x'; 32 << 10];
        // 100 MB without a newline.
        for _ in 0..(100_000_000 / chunk.len()) {
            s.push(&chunk, Some(&sink));
            assert!(s.held() <= LINE_CAP + CAPTURE_CAP + (64 << 10), "held {}", s.held());
            assert!(s.pending.len() <= LINE_CAP);
        }
        s.push(b"\nnext\n", Some(&sink));
        let lines = drain(&mut rx);
        assert_eq!(lines.len(), 2, "the cut line and the next one");
        assert!(lines[0].len() < LINE_CAP + 100 && lines[0].ends_with("(line cut at 64 KiB)"), "{}", &lines[0][lines[0].len() - 40..]);
        assert_eq!(lines[1], "next");
        assert_eq!(s.finish(None).len(), CAPTURE_CAP);
    }

    #[test]
    fn splitting_scans_each_byte_once() {
        let mut s = LineStream::default();
        // A 60 KiB line arriving one byte at a time: the old splitter rescanned the whole
        // unfinished line on every chunk (about 1.8 billion bytes here).
        let total = 60 << 10;
        for _ in 0..total {
            s.push(b"y", None);
        }
        s.push(b"\n", None);
        assert_eq!(s.scanned(), total as u64 + 1);
    }

    #[test]
    fn a_reader_that_never_drains_holds_at_most_the_queue() {
        let (tx, mut rx) = mpsc::channel(8);
        let sink = OutputSink::new(tx);
        let mut s = LineStream::default();
        // 20,000 lines (about 210 KB, under the per-run stream cap).
        for i in 0..20_000 {
            s.push(format!("line {i}\n").as_bytes(), Some(&sink));
        }
        assert_eq!(rx.len(), 8, "the channel never grows past its bound");
        assert_eq!(sink.dropped(), 20_000 - 8);
        let first = drain(&mut rx);
        assert_eq!(first[0], "line 0");
        // Room again: the drop count is said before the next line.
        s.push(b"after\n", Some(&sink));
        assert_eq!(drain(&mut rx), [format!("{NOTICE_PREFIX}19992 output lines dropped: the log could not keep up"), "after".into()]);
    }

    #[test]
    fn streamed_bytes_per_run_are_capped() {
        let (tx, mut rx) = mpsc::channel(10_000);
        let sink = OutputSink::with_byte_cap(tx, 100);
        let mut s = LineStream::default();
        for i in 0..1000 {
            s.push(format!("line {i:04}\n").as_bytes(), Some(&sink));
        }
        sink.finish();
        let lines = drain(&mut rx);
        let streamed: usize = lines.iter().map(|l| l.len() + 1).sum();
        assert!(streamed < 400, "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("output beyond 100 bytes is not streamed")), "{lines:?}");
        assert!(lines.last().is_some_and(|l| l.contains("990 output lines beyond the stream cap")), "{lines:?}");
    }

    #[test]
    fn control_characters_are_escaped_before_anyone_logs_them() {
        let (sink, mut rx) = OutputSink::channel();
        let mut s = LineStream::default();
        s.push(b"\x1b[31mred\x1b[0m\tok\x07\rover\xc2\x9b\n", Some(&sink));
        s.push("a\u{202e}b\n".as_bytes(), Some(&sink));
        assert_eq!(drain(&mut rx), ["\\u{1b}[31mred\\u{1b}[0m\tok\\u{7}\\u{d}over\\u{9b}", "a\\u{202e}b"]);
        assert!(matches!(escape_controls("plain text"), Cow::Borrowed(_)));
    }
}

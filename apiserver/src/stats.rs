//! Cost counters of the embedded control plane: requests by verb and resource, and for every
//! list and watch the entries it scanned and returned. Counts, never times, so tests can gate
//! on them on any machine (`tests/tests/cost_gates.rs`); [`Stats::render`] gives them in the
//! Prometheus text format.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

/// Entries a kind of list or watch looked at and handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// Lists (or watch starts) counted.
    pub calls: u64,
    /// Stored entries examined to answer them.
    pub scanned: u64,
    /// Entries returned (before paging).
    pub returned: u64,
}

/// Which reads a [`Scan`] counts: verb (`list`, `watch`), resource (plural) and whether a
/// label selector was given.
pub type ScanKey = (String, String, bool);

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// (verb, resource) → requests. Subresources are named `plural/sub` (`servers/status`).
    pub requests: BTreeMap<(String, String), u64>,
    /// Scans of lists and watch starts.
    pub scans: BTreeMap<ScanKey, Scan>,
}

/// Verbs that write.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

impl Snapshot {
    /// Requests of `verb` on `resource` (exact name, `servers/status` for the subresource).
    pub fn requests(&self, verb: &str, resource: &str) -> u64 {
        self.requests.get(&(verb.to_string(), resource.to_string())).copied().unwrap_or(0)
    }

    /// Requests of `verb` on `resource` and its subresources.
    pub fn requests_with_subresources(&self, verb: &str, resource: &str) -> u64 {
        let sub = format!("{resource}/");
        self.requests.iter().filter(|((v, r), _)| v == verb && (r == resource || r.starts_with(&sub))).map(|(_, n)| n).sum()
    }

    /// Writes (create, update, patch, delete) of `resource`, subresources included.
    pub fn writes(&self, resource: &str) -> u64 {
        WRITE_VERBS.iter().map(|v| self.requests_with_subresources(v, resource)).sum()
    }

    /// Writes of every resource.
    pub fn all_writes(&self) -> u64 {
        self.requests.iter().filter(|((v, _), _)| WRITE_VERBS.contains(&v.as_str())).map(|(_, n)| n).sum()
    }

    /// Requests of `verb` over every resource.
    pub fn verb(&self, verb: &str) -> u64 {
        self.requests.iter().filter(|((v, _), _)| v == verb).map(|(_, n)| n).sum()
    }

    /// The scans of `verb` on `resource`, label-selected or not.
    pub fn scan(&self, verb: &str, resource: &str, labelled: bool) -> Scan {
        self.scans.get(&(verb.to_string(), resource.to_string(), labelled)).copied().unwrap_or_default()
    }

    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let requests = self
            .requests
            .iter()
            .map(|(k, n)| (k.clone(), n - earlier.requests.get(k).copied().unwrap_or(0).min(*n)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let scans = self
            .scans
            .iter()
            .map(|(k, s)| {
                let e = earlier.scans.get(k).copied().unwrap_or_default();
                let d = Scan {
                    calls: s.calls.saturating_sub(e.calls),
                    scanned: s.scanned.saturating_sub(e.scanned),
                    returned: s.returned.saturating_sub(e.returned),
                };
                (k.clone(), d)
            })
            .filter(|(_, s)| s.calls > 0)
            .collect();
        Snapshot { requests, scans }
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "requests (verb resource count):")?;
        for ((verb, resource), n) in &self.requests {
            writeln!(f, "  {verb:<16} {resource:<28} {n}")?;
        }
        writeln!(f, "scans (verb resource label-selected: calls scanned returned):")?;
        for ((verb, resource, labelled), s) in &self.scans {
            writeln!(f, "  {verb:<8} {resource:<28} {labelled:<5}: {} {} {}", s.calls, s.scanned, s.returned)?;
        }
        Ok(())
    }
}

/// The live counters, shared by every request handler.
#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<Snapshot>,
}

impl Stats {
    fn with<T>(&self, f: impl FnOnce(&mut Snapshot) -> T) -> T {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Counts one request of `verb` on `resource` (`subresource` appended as `plural/sub`).
    pub fn request(&self, verb: &str, resource: &str, subresource: Option<&str>) {
        let resource = match subresource {
            Some(sub) if !sub.is_empty() => format!("{resource}/{sub}"),
            _ => resource.to_string(),
        };
        self.with(|s| *s.requests.entry((verb.to_string(), resource)).or_insert(0) += 1);
    }

    /// Counts one list or watch start that examined `scanned` entries and returned `returned`.
    pub fn scan(&self, verb: &str, resource: &str, labelled: bool, scanned: u64, returned: u64) {
        self.with(|s| {
            let e = s.scans.entry((verb.to_string(), resource.to_string(), labelled)).or_default();
            e.calls += 1;
            e.scanned += scanned;
            e.returned += returned;
        });
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> Snapshot {
        self.with(|s| s.clone())
    }

    /// The counters in the Prometheus text format.
    pub fn render(&self) -> String {
        let snap = self.snapshot();
        let mut out =
            String::from("# HELP apiserver_request_total Requests by verb and resource.\n# TYPE apiserver_request_total counter\n");
        for ((verb, resource), n) in &snap.requests {
            out.push_str(&format!("apiserver_request_total{{verb=\"{verb}\",resource=\"{resource}\"}} {n}\n"));
        }
        out.push_str("# HELP apiserver_list_entries_scanned_total Stored entries examined by lists and watch starts.\n");
        out.push_str("# TYPE apiserver_list_entries_scanned_total counter\n");
        for ((verb, resource, labelled), s) in &snap.scans {
            out.push_str(&format!(
                "apiserver_list_entries_scanned_total{{verb=\"{verb}\",resource=\"{resource}\",label_selector=\"{labelled}\"}} {}\n",
                s.scanned
            ));
        }
        out.push_str("# HELP apiserver_list_entries_returned_total Entries returned by lists and watch starts.\n");
        out.push_str("# TYPE apiserver_list_entries_returned_total counter\n");
        for ((verb, resource, labelled), s) in &snap.scans {
            out.push_str(&format!(
                "apiserver_list_entries_returned_total{{verb=\"{verb}\",resource=\"{resource}\",label_selector=\"{labelled}\"}} {}\n",
                s.returned
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_and_scans_and_differences() {
        let stats = Stats::default();
        stats.request("patch", "servers", Some("status"));
        let before = stats.snapshot();
        stats.request("patch", "servers", None);
        stats.request("create", "changerecords", None);
        stats.request("list", "changerecords", None);
        stats.scan("list", "changerecords", true, 2, 2);
        let now = stats.snapshot();
        assert_eq!(now.writes("servers"), 2);
        assert_eq!(now.all_writes(), 3);
        let d = now.since(&before);
        assert_eq!(d.writes("servers"), 1);
        assert_eq!(d.requests("patch", "servers/status"), 0);
        assert_eq!(d.verb("list"), 1);
        assert_eq!(d.scan("list", "changerecords", true), Scan { calls: 1, scanned: 2, returned: 2 });
        let text = stats.render();
        assert!(text.contains("apiserver_request_total{verb=\"patch\",resource=\"servers/status\"} 1"), "{text}");
        assert!(text.contains("label_selector=\"true\"} 2"), "{text}");
    }
}
